"""The encoder-decoder Transformer: the training forward, and ``encode``, ``sources`` and ``decode``
for a search to drive step by step with its states (``decoding/``)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from transformer.attention import DecodingState, Source
from transformer.config import TransformerConfig
from transformer.embeddings import Embeddings, PositionalEncoding
from transformer.layers import DecoderLayer, EncoderLayer


def layer_arguments(cfg: TransformerConfig) -> dict:
    """The keyword arguments that ``EncoderLayer`` and ``DecoderLayer`` share, from the config."""
    return {
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_ff": cfg.d_ff,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "activation": cfg.activation,
        "norm_first": cfg.norm_first,
        "eps": cfg.layer_norm_eps,
        "attention": cfg.attention,
    }


class Encoder(nn.Module):
    """A stack of ``EncoderLayer`` (plus a final LayerNorm in pre-LN)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(**layer_arguments(cfg)) for _ in range(cfg.n_encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(self, x: Tensor, src_mask: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """x: [batch, src_len, d_model] embedded source; src_mask: [batch, 1, 1, src_len] ->
        ([batch, src_len, d_model], per-layer self-attention weights if ``need_weights``)."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, src_mask, need_weights)
            if w is not None:
                weights.append(w)
        return (self.final_norm(x) if self.final_norm is not None else x), weights


class Decoder(nn.Module):
    """A stack of ``DecoderLayer`` (plus a final LayerNorm in pre-LN)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(**layer_arguments(cfg)) for _ in range(cfg.n_decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(
        self,
        y: Tensor,
        memory: Tensor | Sequence[Source],
        src_mask: Tensor,
        states: Sequence[DecodingState] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """y: [batch, tgt_len, d_model] -> ([batch, tgt_len, d_model], per-layer cross weights).

        ``memory``: the encoder output [batch, src_len, d_model], or per layer its cross-attention
        ``Source``; ``states``: per layer its self-attention's decoding state, or None.
        """
        weights = []
        for i, layer in enumerate(self.layers):
            source = memory if isinstance(memory, Tensor) else memory[i]
            y, w = layer(y, source, src_mask, None if states is None else states[i], need_weights)
            if w is not None:
                weights.append(w)
        y = self.final_norm(y) if self.final_norm is not None else y
        return y, weights


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017).

    Token ids in, next-token logits out. ``forward`` is the teacher-forced training pass;
    ``encode``, ``sources`` (cross-attention's keys and values, once per source) and ``decode``
    with the self-attention states are what a search runs step by step (``decoding/``).
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = Embeddings(cfg.src_vocab_size, cfg.d_model, cfg.pad_id)
        self.tgt_embed = (
            self.src_embed
            if cfg.share_embeddings
            else Embeddings(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id)
        )
        learned = cfg.positional == "learned"
        self.src_pos = PositionalEncoding(cfg.d_model, cfg.max_positions, cfg.dropout, learned)
        self.tgt_pos = PositionalEncoding(cfg.d_model, cfg.max_positions, cfg.dropout, learned)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight
        else:
            nn.init.normal_(self.output.weight, mean=0.0, std=cfg.d_model**-0.5)

    def logits(self, y: Tensor) -> Tensor:
        """y: [..., d_model] decoder output -> [..., tgt_vocab] through the output projection."""
        return self.output(y)

    def num_parameters(self, trainable_only: bool = True) -> int:
        """Parameter count, each shared (tied) tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def source_mask(self, src: Tensor) -> Tensor:
        """src: [batch, src_len] ids -> bool [batch, 1, 1, src_len], True at real tokens."""
        return (src != self.cfg.pad_id)[:, None, None, :]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src: [batch, src_len] ids -> memory [batch, src_len, d_model], mask [batch, 1, 1, src_len]."""
        src_mask = self.source_mask(src)
        memory, _ = self.encoder(self.src_pos(self.src_embed(src)), src_mask)
        return memory, src_mask

    def sources(self, memory: Tensor, src_mask: Tensor, summarise: bool = True) -> list[Source]:
        """What cross-attention reads of ``memory`` [batch, src_len, d_model], for every decoder
        layer: its keys and values or its mechanism's summary (``MultiHeadAttention.source``;
        src_mask: bool [batch, 1, 1, src_len]; ``summarise=False``: the keys and values whatever
        the mechanism). A search makes them once per source and passes them to :meth:`decode`."""
        return [layer.cross_attn.source(memory, src_mask, summarise) for layer in self.decoder.layers]

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | Sequence[Source],
        src_mask: Tensor,
        states: Sequence[DecodingState] | None = None,
        offset: int = 0,
        need_weights: bool = False,
        last_only: bool = False,
        project: bool = True,
    ) -> tuple[Tensor, list[Tensor]]:
        """The decoder on target positions ``offset ..`` (the whole prefix, or the steps after
        those that ``states`` hold).

        Args:
            tgt_in: [batch, tgt_len] decoder input ids (BOS first when ``offset`` is 0).
            memory: the encoder output [batch, src_len, d_model], or :meth:`sources` of it.
            src_mask: [batch, 1, 1, src_len].
            states: per decoder layer, its self-attention's state of the ``offset`` earlier
                positions (a search's, ``decoding/``), updated in place; None: no earlier ones.
            offset: the position of ``tgt_in``'s first token.
            need_weights: also return per-layer cross-attention [batch, heads, tgt_len, src_len].
            last_only: the last position only (all a search step needs).
            project: False returns the decoder output [..., d_model] in place of the logits.

        Returns:
            logits [batch, tgt_len, tgt_vocab] ([batch, 1, tgt_vocab] if ``last_only``) and the
            list of weights (empty unless asked).
        """
        y = self.tgt_pos(self.tgt_embed(tgt_in), offset=offset)
        y, weights = self.decoder(y, memory, src_mask, states, need_weights)
        y = y[:, -1:] if last_only else y
        return (self.logits(y) if project else y), weights

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Teacher-forced pass: src [batch, src_len], tgt_in [batch, tgt_len] -> logits [batch, tgt_len, V].

        Target padding needs no mask: padding is on the right and the causal mask already keeps
        every real position from seeing it. ``project=False`` returns the decoder output
        [batch, tgt_len, d_model] instead, for a loss that applies ``self.output`` itself
        (training's, ``training/loss.py``).
        """
        memory, src_mask = self.encode(src)
        out, _ = self.decode(tgt_in, memory, src_mask, project=project)
        return out

    def cross_attention_weights(self, src: Tensor, tgt_in: Tensor) -> list[Tensor]:
        """Per decoder layer, cross-attention weights [batch, heads, tgt_len, src_len] (eval mode)."""
        memory, src_mask = self.encode(src)
        _, weights = self.decode(
            tgt_in,
            self.sources(memory, src_mask, summarise=False),
            src_mask,
            need_weights=True,
            project=False,
        )  # no logits: the weights are all that is asked
        return weights

    def encoder_attention_weights(self, src: Tensor) -> list[Tensor]:
        """Per encoder layer, the self-attention weights [batch, heads, src_len, src_len] its
        mechanism implies (eval mode; n × n, for pictures): softmax's weights, linear attention's
        normalised φ(q)·φ(k) rows, the pattern local, sparse and LSH attention attend over,
        through the encoder's own code path."""
        src_mask = self.source_mask(src)
        _, weights = self.encoder(self.src_pos(self.src_embed(src)), src_mask, need_weights=True)
        return weights
