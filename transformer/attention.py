"""Attention (paper, section 3.2): scaled dot-product attention, multi-head attention, the caches.

Read top to bottom: :func:`scaled_dot_product_attention` is equation (1) written out;
:func:`fused_attention` is the same through PyTorch's fused kernels (flash / memory-efficient on
a GPU), and :class:`ScaledDotProduct` that function as a module (the mechanisms' kernel, which
``fastpaths.cpu`` swaps for a CPU one); :class:`AttentionMechanism` is the one call and state
signature that every attention mechanism has (``mechanisms.py`` lists them), and
:class:`SoftmaxAttention` equation (1) behind it; :class:`InProjection` is W_Q, W_K, W_V stacked;
:class:`MultiHeadAttention` is section 3.2.2, used three ways; :class:`KVCache` keeps the
decoder's keys and values between decoding steps (``kv_cache.py``).

Mask convention everywhere: a boolean tensor that is True where attention is *allowed*
(the same as ``torch.nn.functional.scaled_dot_product_attention``).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.kv_cache import KVCache
from transformer.registry import Mechanism, register


def causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """[q_len, k_len] bool, True where query i may see key j.

    Queries are the last ``q_len`` of ``k_len`` positions (a K/V cache holds the earlier ones),
    so query i sits at absolute position ``k_len - q_len + i`` and sees keys up to there.
    """
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - q_len)


def with_causal(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor:
    """``mask`` (or nothing) and the causal mask of queries ``q`` over keys ``k``."""
    allowed = causal_mask(q.size(-2), k.size(-2), q.device)
    return allowed if mask is None else mask & allowed


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, written out, also returning the weights.

    Args:
        q: [batch, heads, q_len, d_k] queries.
        k: [batch, heads, k_len, d_k] keys.
        v: [batch, heads, k_len, d_v] values.
        mask: bool, broadcastable to [batch, heads, q_len, k_len]; True = may attend.
        causal: also forbid attending to later positions (see ``causal_mask``).
        dropout_p: dropout on the attention weights (pass 0.0 in eval).

    Returns:
        out: [batch, heads, q_len, d_v]; weights: [batch, heads, q_len, k_len], rows sum to 1.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if causal:
        mask = with_causal(mask, q, k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """The same as ``scaled_dot_product_attention`` through PyTorch's fused kernels (no weights)."""
    if causal:
        if mask is None and q.size(-2) == k.size(-2):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        mask = with_causal(mask, q, k)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


class ScaledDotProduct(nn.Module):
    """Equation (1) without the weights (:func:`fused_attention`), as a module.

    The mechanisms that attend over keys with softmax hold one (``kernel``), so that a
    transformation can swap it for another computing the same (``fastpaths.cpu``: written out
    where that is faster on the CPU); it has no parameters.
    """

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Args and returns as :func:`scaled_dot_product_attention`'s, less the weights."""
        return fused_attention(q, k, v, mask, causal, dropout_p)


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """[batch, len, heads·d_head] -> [batch, heads, len, d_head] (a view)."""
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(1, 2)


class DecodingState(Protocol):
    """What a mechanism keeps between decoding steps of the decoder's self-attention.

    ``KVCache`` for softmax; a mechanism's own state otherwise (``linear_attention.LinearState``,
    ``local_attention.WindowCache``). The mechanism that made it updates it; the decoder only
    reorders it for beam search.
    """

    def select(self, rows: Tensor) -> None:
        """Keeps rows ``rows`` ([new_rows] indices), in that order."""
        ...


class SourceSummary(tuple):
    """Cross-attention's source as a summarising mechanism keeps it (a tuple of tensors, each
    [n_src, ...]): [S, Z] for linear attention and the Performer, (E K, F V) for Linformer.

    Made once per source sentence by ``MultiHeadAttention.project_kv``, as softmax's K/V are, and
    then every decoding step's queries read it (``mechanism.attend_summary``) instead of reducing
    the source's keys again: its size and a step's cost do not grow with the source's length.
    A tuple, so that ``DecoderState.select`` reorders it as it does (k, v).
    """


class AttentionMechanism(nn.Module):
    """What every attention mechanism is: one call and one state signature, and the projections.

    ``forward(q, k, v, mask, causal, state, need_weights) -> (out, weights)`` computes attention
    from the projected heads: q [batch, heads, q_len, d_k]; k, v [batch, heads, k_len, d_k]; mask
    bool [batch, 1, 1, k_len] (True at real keys) or None; causal: query i sees keys up to its own
    position; state: decoding only, from ``new_state``, updated in place with this call's keys;
    need_weights: also return the weights [batch, heads, q_len, k_len] (for pictures), else None.

    The rest has defaults that a mechanism overrides where it differs, so that
    ``MultiHeadAttention`` asks nothing about which mechanism it holds:

    * ``project``: self-attention's Q, K, V from the layer's input (LSH's keys are its queries);
    * ``self_attention``: ``project`` then ``forward`` (Linformer projects the sequence first);
    * ``source`` and ``attend_source``: what cross-attention keeps of the source's keys and
      values, once per source, and how its queries read it (:class:`SummarisingMechanism`);
    * ``new_state``: the decoding state (mechanisms that can be causal).
    """

    def new_state(self, max_steps: int) -> DecodingState:
        """An empty decoding state for at most ``max_steps`` steps of causal self-attention."""
        raise NotImplementedError(f"{type(self).__name__} keeps no decoding state: it cannot be causal")

    def project(self, in_proj: InProjection, x: Tensor, n_heads: int) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries, keys, values, each [batch, heads, len, d_head], from x
        [batch, len, d_model] through W_Q, W_K, W_V (``in_proj``) in one product."""
        qkv = in_proj(x)  # (B, T, 3D)
        # Split as [B, T, 3, H, Dh] and unbound, not chunked then viewed per tensor: in training,
        # the backward then stacks the three heads' gradients straight into the projection's
        # layout, in one pass, instead of copying each into [B, T, D] and joining the copies.
        b, t, _ = qkv.shape
        q, k, v = qkv.view(b, t, 3, n_heads, -1).unbind(2)  # (B, T, H, Dh) each
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def self_attention(
        self,
        in_proj: InProjection,
        x: Tensor,
        n_heads: int,
        mask: Tensor | None,
        causal: bool,
        state: DecodingState | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of x [batch, len, d_model] to itself: heads [batch, heads, len, d_head] and
        the weights or None (the other arguments as ``forward``'s)."""
        q, k, v = self.project(in_proj, x, n_heads)
        return self(q, k, v, mask, causal, state, need_weights)

    def source(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, ...]:
        """What cross-attention keeps of a source's keys and values [batch, heads, src_len, d_head]
        (``mask``: its padding [batch, 1, 1, src_len]): here (k, v) themselves."""
        return k, v

    def attend_source(
        self, q: Tensor, source: tuple[Tensor, ...], mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Queries [batch, heads, q_len, d_head] over a ``source`` (or (k, v)), non-causal."""
        return self(q, *source, mask, False, None, need_weights)


class SummarisingMechanism(AttentionMechanism):
    """A mechanism whose queries read a fixed-size summary of the keys and values (linear
    attention, the Performer, Linformer): ``summarise(k, v, mask) -> tuple`` and
    ``attend_summary(q, summary) -> out``. Cross-attention keeps the summary (a
    :class:`SourceSummary`), made once per source, and has no weights from it."""

    def source(self, k: Tensor, v: Tensor, mask: Tensor | None) -> SourceSummary:
        return SourceSummary(self.summarise(k, v, mask))

    def attend_source(
        self, q: Tensor, source: tuple[Tensor, ...], mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        if not isinstance(source, SourceSummary):  # the keys and values themselves
            return super().attend_source(q, source, mask, need_weights)
        if need_weights:
            raise ValueError("a SourceSummary has no weights: project_kv(..., summarise=False) for them")
        return self.attend_summary(q, source), None


class SoftmaxAttention(AttentionMechanism):
    """Equation (1), the mechanism every other one is compared with (:class:`AttentionMechanism`'s
    signature). Its decoding state is a ``KVCache``: O(n²) time and O(n) memory per decoded
    sequence.
    """

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout
        self.kernel = ScaledDotProduct()

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        state: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        if state is not None:
            k, v = state.extend(k, v)  # (B, H, t+T, Dh)
            # A single new query may see every cached key: no mask needed.
            causal = causal and q.size(2) > 1
        p = self.dropout if self.training else 0.0
        if need_weights:
            return scaled_dot_product_attention(q, k, v, mask, causal, p)
        return self.kernel(q, k, v, mask, causal, p), None

    def new_state(self, max_steps: int) -> KVCache:
        """An empty K/V cache with room for at most ``KVCache.GROWTH`` steps (most outputs end early)."""
        return KVCache(min(max_steps, KVCache.GROWTH))


class InProjection(nn.Linear):
    """W_Q, W_K and W_V of multi-head attention stacked, [3·d_model, d_model] (the layout of
    ``torch.nn.MultiheadAttention``'s ``in_proj_weight``): self-attention multiplies all three at
    once (``forward``), cross-attention the query rows and the key and value rows on their own
    (:meth:`rows`)."""

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """``x`` times rows ``start:stop`` of the matrix: [..., in_features] -> [..., stop - start]."""
        bias = None if self.bias is None else self.bias[start:stop]
        return F.linear(x, self.weight[start:stop], bias)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W_O, head_i = Attention(Q W_Q^i, K W_K^i,
    V W_V^i) (paper, section 3.2.2), used three ways:

    * encoder self-attention: ``self_attention(x, mask=src_mask)``;
    * decoder masked self-attention: ``self_attention(y, causal=True, cache=state)``;
    * encoder-decoder attention: ``cross_attention(y, project_kv(memory, src_mask), mask=src_mask)``.

    W_Q, W_K, W_V live in one [3·d_model, d_model] matrix (:class:`InProjection`). ``mechanism``
    computes the heads' attention (``SoftmaxAttention``, equation (1), unless another is given:
    ``mechanisms.build_mechanism``), and for self-attention takes the projection too
    (:meth:`AttentionMechanism.self_attention`); ``dropout`` is softmax's.
    """

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, mechanism: AttentionMechanism | None = None
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.mechanism = SoftmaxAttention(dropout) if mechanism is None else mechanism
        self.in_proj = InProjection(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def self_attention(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: DecodingState | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of a sequence to itself.

        Args:
            x: [batch, len, d_model].
            mask: bool [batch, 1, 1 or len, len], True = may attend (key padding).
            causal: forbid attending to later positions.
            cache: decoding only: the mechanism's state of the steps so far (the keys/values
                for softmax), updated in place with this call's.
            need_weights: use the written-out path and return the weights.

        Returns:
            [batch, len, d_model] and the weights [batch, heads, len, keys] or None.
        """
        out, weights = self.mechanism.self_attention(
            self.in_proj, x, self.n_heads, mask, causal, cache, need_weights
        )  # (B, H, T, Dh)
        return self._project_out(out), weights

    def project_kv(
        self, memory: Tensor, mask: Tensor | None = None, summarise: bool = True
    ) -> tuple[Tensor, ...]:
        """Encoder output to what cross-attention reads, once per source sentence.

        Args:
            memory: [batch, src_len, d_model].
            mask: bool [batch, 1, 1, src_len], True at real source tokens.
            summarise: False keeps (k, v) even for a mechanism that summarises (for its weights).

        Returns:
            (k, v), each [batch, heads, src_len, d_head], or what the mechanism keeps of them
            (``mechanism.source``: a ``SourceSummary`` for linear, Performer, Linformer).
        """
        kv = self.in_proj.rows(memory, self.d_model, 3 * self.d_model)  # (B, S, 2D)
        # Contiguous once here, or every decoding step's matmul would copy them.
        k, v = (split_heads(x, self.n_heads).contiguous() for x in kv.chunk(2, dim=-1))
        return self.mechanism.source(k, v, mask) if summarise else (k, v)

    def cross_attention(
        self,
        x: Tensor,
        kv: tuple[Tensor, ...],
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Decoder queries attending to projected encoder keys/values.

        Several hypotheses may share one source (beam search): ``x`` may hold ``g`` rows per
        source sentence, consecutive, while ``kv`` and ``mask`` hold one row per sentence. The
        ``g`` rows then become ``g * len`` queries of that sentence, so K/V are never copied.

        Args:
            x: [n_src * g, len, d_model] decoder states.
            kv: from ``project_kv``: (k, v), each [n_src, heads, src_len, d_head], or its summary.
            mask: bool [n_src, 1, 1, src_len], True at real source tokens.
            need_weights: use the written-out path and return the weights.

        Returns:
            [n_src * g, len, d_model] and the weights [n_src * g, heads, len, src_len] or None.
        """
        n_src = kv[0].size(0)
        rows, t, _ = x.shape
        if rows % n_src:
            raise ValueError(f"{rows} decoder rows do not split evenly over {n_src} sources")
        g = rows // n_src
        q = split_heads(self.in_proj.rows(x, 0, self.d_model), self.n_heads)  # (n*g, H, T, Dh)
        if g > 1:
            # (n*g, H, T, Dh) -> (n, H, g*T, Dh): hypotheses of one source become more queries.
            q = q.view(n_src, g, self.n_heads, t, self.d_head).transpose(1, 2)
            q = q.reshape(n_src, self.n_heads, g * t, self.d_head)
        out, weights = self.mechanism.attend_source(q, kv, mask, need_weights)
        if g > 1:
            out = out.view(n_src, self.n_heads, g, t, self.d_head).transpose(1, 2)
            out = out.reshape(rows, self.n_heads, t, self.d_head)
            if weights is not None:
                weights = weights.view(n_src, self.n_heads, g, t, -1).transpose(1, 2)
                weights = weights.reshape(rows, self.n_heads, t, -1)
        return self._project_out(out), weights

    def _project_out(self, out: Tensor) -> Tensor:
        """Heads [batch, heads, len, d_head] -> [batch, len, d_model]: concatenated, then W_O."""
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.d_model))


register(Mechanism("softmax", build=lambda cfg, d_head, dropout: SoftmaxAttention(dropout)))
