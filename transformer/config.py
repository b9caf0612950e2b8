"""The model's hyperparameters: a small typed dataclass, never a DictConfig."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from transformer.mechanisms import AttentionConfig


@dataclass
class TransformerConfig:
    """Sizes and switches of the encoder-decoder Transformer.

    The defaults are the paper's "base" model (Vaswani et al. 2017, table 3).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512  # width of every residual stream
    n_heads: int = 8  # attention heads; d_model must divide by it
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048  # inner width of the position-wise feed-forward block
    dropout: float = 0.1  # on embeddings+PE and on each sub-layer output (paper's P_drop)
    attention_dropout: float = 0.0  # on the attention weights (not in the paper)
    activation_dropout: float = 0.0  # after the FFN activation (not in the paper)
    activation: Literal["relu", "gelu"] = "relu"
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN (stabler when deep)
    positional: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024  # longest sequence the positional encoding covers
    share_embeddings: bool = False  # one embedding table for source and target (joint vocab)
    tie_output: bool = True  # output projection reuses the target embedding matrix
    layer_norm_eps: float = 1e-5
    pad_id: int = 0  # padding token id, the same in source and target vocabularies
    # The attention mechanism of each role (softmax everywhere unless set); absent from the
    # checkpoints written before it existed, which are softmax.
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self) -> None:
        self.attention = AttentionConfig.from_dict(self.attention)  # a mapping from a config file
        self.attention.check_dropout(self.attention_dropout)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs one vocabulary: "
                f"src_vocab_size={self.src_vocab_size} != tgt_vocab_size={self.tgt_vocab_size}"
            )
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', not {self.activation!r}")
        if self.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional must be 'sinusoidal' or 'learned', not {self.positional!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-container form, safe for ``torch.load(weights_only=True)``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        return cls(**values)
