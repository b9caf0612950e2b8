"""Position-wise feed-forward block and the encoder / decoder layers (post-LN or pre-LN)."""

from __future__ import annotations

from torch import Tensor, nn

from transformer.attention import DecodingState, Source
from transformer.mechanisms import AttentionConfig, build_attention


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = W2 · act(W1 x + b1) + b2, applied at every position (paper, section 3.3).

    act is ReLU (the paper's) or GELU; ``dropout`` is on act's output (``activation_dropout``).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.GELU() if activation == "gelu" else nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(self, x: Tensor) -> Tensor:
        """x: [batch, len, d_model] -> [batch, len, d_model]."""
        h = self.activation(self.linear1(x))  # (B, T, d_ff)
        return self.linear2(self.dropout(h))


class Sublayer(nn.Module):
    """Residual connection around a sub-layer, with its LayerNorm and dropout.

    post-LN (paper): LayerNorm(x + Dropout(f(x))); pre-LN: x + Dropout(f(LayerNorm(x))).
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def pre(self, x: Tensor) -> Tensor:
        """What the sub-layer reads: the normalised stream in pre-LN, the stream itself in post-LN."""
        return self.norm(x) if self.norm_first else x

    def post(self, x: Tensor, fx: Tensor) -> Tensor:
        """Adds the sub-layer's output ``fx`` back to the stream ``x``."""
        y = x + self.dropout(fx)
        return y if self.norm_first else self.norm(y)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a ``Sublayer``.

    ``attention`` names the self-attention's mechanism (``attention.encoder_self``); softmax if None.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        attention: AttentionConfig | None = None,
    ) -> None:
        super().__init__()
        attention = attention or AttentionConfig()
        self.self_attn = build_attention("encoder_self", attention, d_model, n_heads, attention_dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, activation, activation_dropout)
        self.attn_sub = Sublayer(d_model, dropout, norm_first, eps)
        self.ffn_sub = Sublayer(d_model, dropout, norm_first, eps)

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """x: [batch, src_len, d_model]; src_mask: bool [batch, 1, 1, src_len], True at tokens.

        Returns the layer's output [batch, src_len, d_model] and, if ``need_weights``, the
        self-attention weights [batch, heads, src_len, src_len] its mechanism implies (else None).
        """
        h, weights = self.self_attn(self.attn_sub.pre(x), mask=src_mask, need_weights=need_weights)
        x = self.attn_sub.post(x, h)
        return self.ffn_sub.post(x, self.ffn(self.ffn_sub.pre(x))), weights


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward.

    ``attention`` names their mechanisms (``decoder_self``, ``cross``); softmax if None.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        attention: AttentionConfig | None = None,
    ) -> None:
        super().__init__()
        attention = attention or AttentionConfig()
        self.self_attn = build_attention("decoder_self", attention, d_model, n_heads, attention_dropout)
        self.cross_attn = build_attention("cross", attention, d_model, n_heads, attention_dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, activation, activation_dropout)
        self.self_sub = Sublayer(d_model, dropout, norm_first, eps)
        self.cross_sub = Sublayer(d_model, dropout, norm_first, eps)
        self.ffn_sub = Sublayer(d_model, dropout, norm_first, eps)

    def forward(
        self,
        y: Tensor,
        memory: Tensor | Source,
        src_mask: Tensor | None,
        state: DecodingState | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """One decoder layer.

        Args:
            y: [batch, tgt_len, d_model] decoder stream.
            memory: the encoder output [batch, src_len, d_model], or this layer's cross-attention
                ``Source`` of it (``cross_attn.source``, made once per source when decoding).
            src_mask: bool [batch, 1, 1, src_len], True at real source tokens.
            state: decoding only: this layer's self-attention state of the steps so far (a K/V
                cache for softmax), updated in place.
            need_weights: return the cross-attention weights [batch, heads, tgt_len, src_len].
        """
        h, _ = self.self_attn(self.self_sub.pre(y), state=state)
        y = self.self_sub.post(y, h)
        h, weights = self.cross_attn(self.cross_sub.pre(y), memory, src_mask, need_weights=need_weights)
        y = self.cross_sub.post(y, h)
        return self.ffn_sub.post(y, self.ffn(self.ffn_sub.pre(y))), weights
