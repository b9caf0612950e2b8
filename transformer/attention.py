"""Attention (paper, section 3.2): scaled dot-product, the mechanisms' signature, multi-head attention.

Read top to bottom: :func:`scaled_dot_product_attention` is equation (1) written out;
:func:`fused_attention` is the same through PyTorch's fused kernels (flash / memory-efficient on
a GPU), and :class:`ScaledDotProduct` that function as a module (the mechanisms' kernel, which a
swap from ``fastpaths/`` may replace); :class:`AttentionMechanism` is the one call and state
signature that every attention mechanism has (``mechanisms.py`` lists them), and
:class:`SoftmaxAttention` equation (1) behind it; :class:`Source` is what cross-attention reads
of the encoder output; :class:`MultiHeadAttention` is section 3.2.2: it owns W_Q, W_K, W_V (one
stacked :class:`InProjection`) and W_O, and hands q, k, v, the mask and the state to its mechanism.

Mask convention everywhere: a boolean tensor that is True where attention is *allowed*
(the same as ``torch.nn.functional.scaled_dot_product_attention``).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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

    The keys and values of the steps so far for softmax (``decoding.kv_cache.KVCache``, made by
    the decoding package for every mechanism whose ``caches_keys_values`` is True); a mechanism's
    own state otherwise (``linear_attention.LinearState``, ``local_attention.WindowCache``). The
    mechanism updates it; the search reorders it for beam search.
    """

    def select(self, rows: Tensor) -> None:
        """Keeps rows ``rows`` ([new_rows] indices), in that order."""
        ...


class KeysValues(DecodingState, Protocol):
    """Softmax's decoding state: the keys and values of the steps so far."""

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Appends steps k, v [rows, heads, new, d_head]; returns all of them [rows, heads, steps, d_head]."""
        ...


class Source:
    """What cross-attention reads of a batch of source sentences, made once per source by
    :meth:`MultiHeadAttention.source` (keys and values are the encoder output's, section 3.2.3).

    Attributes:
        tensors: (k, v), each [n_src, heads, src_len, d_head], or, for a mechanism that
            summarises (linear attention, the Performer, Linformer), its fixed-size summary of
            them: [S, Z] or (E K, F V), each [n_src, ...], read by every query instead of the
            keys, so that a decoding step's cost does not grow with the source's length.
        summarised: whether ``tensors`` is such a summary.
    """

    def __init__(self, tensors: tuple[Tensor, ...], summarised: bool = False) -> None:
        self.tensors = tuple(tensors)
        self.summarised = summarised

    def attend(
        self, mechanism: AttentionMechanism, q: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Queries q [n_src, heads, q_len, d_head] over this source (``mask``: its padding
        [n_src, 1, 1, src_len]): the heads [n_src, heads, q_len, d_head] and the weights or None."""
        return mechanism.attend_source(q, self, mask, need_weights)


class AttentionMechanism(nn.Module):
    """What every attention mechanism is: one call and one state signature.

    ``forward(q, k, v, mask, causal, state, need_weights) -> (out, weights)`` computes attention
    from the projected heads: q [batch, heads, q_len, d_k]; k, v [batch, heads, k_len, d_k]; mask
    bool [batch, 1, 1, k_len] (True at real keys) or None; causal: query i sees keys up to its own
    position; state: decoding only, updated in place with this call's keys; need_weights: also
    return the weights [batch, heads, q_len, k_len] (for pictures), else None.

    The rest has defaults that a mechanism overrides where it differs:

    * ``caches_keys_values``: its decoding state is the keys and values of the steps so far
      (:class:`KeysValues`, made by the decoding package), as softmax's is;
    * ``new_state``: otherwise, its own decoding state (mechanisms that can be causal);
    * ``summarise`` and ``attend_source``: what cross-attention keeps of the source's keys and
      values, once per source, and how its queries read it (:class:`SummarisingMechanism`).

    Mechanisms that need projections of their own (LSH's shared query-key, Linformer's sequence
    projected before W_K and W_V) come with a :class:`MultiHeadAttention` subclass, which the
    registry builds for them (``registry.Mechanism.layer``).
    """

    caches_keys_values = False
    summarises = False

    def new_state(self, max_steps: int) -> DecodingState:
        """An empty decoding state for at most ``max_steps`` steps of causal self-attention."""
        raise NotImplementedError(f"{type(self).__name__} keeps no decoding state: it cannot be causal")

    def summarise(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, ...]:
        """A source's keys and values [n, heads, src_len, d_head] reduced to what queries read."""
        raise NotImplementedError(f"{type(self).__name__} does not summarise its keys")

    def attend_source(
        self, q: Tensor, source: Source, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Queries [batch, heads, q_len, d_head] over a :class:`Source` of keys and values, non-causal."""
        return self(q, *source.tensors, mask, False, None, need_weights)


class SummarisingMechanism(AttentionMechanism):
    """A mechanism whose queries read a fixed-size summary of the keys and values (linear
    attention, the Performer, Linformer): ``summarise(k, v, mask) -> tuple`` and
    ``attend_summary(q, summary) -> out``. Cross-attention keeps the summary (a summarised
    :class:`Source`), made once per source, and has no weights from it."""

    summarises = True

    def attend_source(
        self, q: Tensor, source: Source, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        if not source.summarised:  # the keys and values themselves
            return super().attend_source(q, source, mask, need_weights)
        if need_weights:
            raise ValueError("a summarised Source has no weights: source(..., summarise=False) for them")
        return self.attend_summary(q, source.tensors), None


class SoftmaxAttention(AttentionMechanism):
    """Equation (1), the mechanism every other one is compared with (:class:`AttentionMechanism`'s
    signature). Its decoding state is the keys and values of the steps so far (:class:`KeysValues`):
    O(n²) time and O(n) memory per decoded sequence.
    """

    caches_keys_values = True

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
        state: KeysValues | None = None,
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
    V W_V^i) (paper, section 3.2.2), used three ways (section 3.2.3):

    * encoder self-attention: ``attn(x, mask=src_mask)``;
    * decoder masked self-attention: ``attn(y, state=state)`` (built with ``causal=True``);
    * encoder-decoder attention: ``attn(y, memory, mask=src_mask)``, where ``memory`` is the
      encoder output or its :class:`Source` (:meth:`source`, made once per source when decoding).

    W_Q, W_K, W_V live in one [3·d_model, d_model] matrix (:class:`InProjection`), W_O is
    ``out_proj``. ``mechanism`` computes the heads' attention from q, k, v (``SoftmaxAttention``,
    equation (1), unless another is given: ``mechanisms.build_attention``); ``dropout`` is softmax's.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        mechanism: AttentionMechanism | None = None,
        causal: bool = False,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.causal = causal
        self.mechanism = SoftmaxAttention(dropout) if mechanism is None else mechanism
        self.in_proj = InProjection(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | Source | None = None,
        mask: Tensor | None = None,
        state: DecodingState | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the queries of ``x`` to ``x`` itself or to ``memory``.

        Args:
            x: [batch, len, d_model], the queries' stream.
            memory: cross-attention: the encoder output [batch, src_len, d_model], or its
                :class:`Source`; None: self-attention over ``x``.
            mask: bool [batch, 1, 1, keys], True at real keys (key padding).
            state: decoder self-attention while decoding: the mechanism's state of the steps
                so far, updated in place with this call's.
            need_weights: use the written-out path and return the weights.

        Returns:
            [batch, len, d_model] and the weights [batch, heads, len, keys] or None.
        """
        if memory is None:
            out, weights = self.attend(x, mask, state, need_weights)  # (B, H, T, Dh)
        else:
            source = memory if isinstance(memory, Source) else self.source(memory, mask, not need_weights)
            out, weights = source.attend(self.mechanism, self.queries(x), mask, need_weights)
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.d_model)), weights  # Concat, W_O

    def attend(
        self, x: Tensor, mask: Tensor | None, state: DecodingState | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention's heads [batch, heads, len, d_head] (and weights): Q, K, V of x
        (:meth:`project`) through the mechanism."""
        q, k, v = self.project(x)
        return self.mechanism(q, k, v, mask, self.causal, state, need_weights)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries, keys, values, each [batch, heads, len, d_head], from x
        [batch, len, d_model] through W_Q, W_K, W_V in one product."""
        qkv = self.in_proj(x)  # (B, T, 3D)
        # Split as [B, T, 3, H, Dh] and unbound, not chunked then viewed per tensor: in training,
        # the backward then stacks the three heads' gradients straight into the projection's
        # layout, in one pass, instead of copying each into [B, T, D] and joining the copies.
        b, t, _ = qkv.shape
        q, k, v = qkv.view(b, t, 3, self.n_heads, -1).unbind(2)  # (B, T, H, Dh) each
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def queries(self, x: Tensor) -> Tensor:
        """Cross-attention's queries x W_Q: [batch, len, d_model] -> [batch, heads, len, d_head]."""
        return split_heads(self.in_proj.rows(x, 0, self.d_model), self.n_heads)

    def source(self, memory: Tensor, mask: Tensor | None = None, summarise: bool = True) -> Source:
        """What cross-attention reads of the encoder output ``memory`` [batch, src_len, d_model]
        (``mask``: its padding [batch, 1, 1, src_len]): its keys and values, or the mechanism's
        summary of them (``summarise=False`` keeps the keys and values, for the weights)."""
        kv = self.in_proj.rows(memory, self.d_model, 3 * self.d_model)  # (B, S, 2D)
        # Contiguous once here, or every decoding step's matmul would copy them.
        k, v = (split_heads(x, self.n_heads).contiguous() for x in kv.chunk(2, dim=-1))
        if summarise and self.mechanism.summarises:
            return Source(self.mechanism.summarise(k, v, mask), summarised=True)
        return Source((k, v))


register(Mechanism("softmax", build=lambda cfg, d_head, dropout: SoftmaxAttention(dropout)))
