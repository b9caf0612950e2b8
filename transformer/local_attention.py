"""Local, atrous and sparse attention: softmax over a fixed pattern of positions, computed on blocks.

Softmax attention (equation (1) of Vaswani et al.) with query i restricted to a set A(i):

    V'_i = Σ_{j∈A(i)} exp(q_i·k_j/√d) V_j / Σ_{j∈A(i)} exp(q_i·k_j/√d)

* local window w: A(i) = {j : |i - j| < w} (causal: 0 ≤ i - j < w), as in the local attention of
  the Image Transformer (Parmar et al. 2018) and the "sliding window" of Longformer (Beltagy et
  al. 2020). O(n·w·d) time, O(n·w) memory.
* atrous, dilation δ: A(i) = {j : i - j = t·δ, |t| < w} (causal: 0 ≤ t < w): the window's w
  positions δ apart (Longformer's dilated window), seeing (w - 1)·δ + 1 positions back at the
  same cost as the window.
* sparse, stride l: the local window and every l-th position, {j : j mod l = l - 1} (causal:
  j ≤ i), the "fixed" pattern of Child et al. 2019 (section 4.2, equation (3)'s A(1) as a sliding
  window and A(2) with c = 1), so information crosses the whole sequence in two steps. O(n·(w +
  n/l)·d) time: sub-quadratic for l ~ √n. O(n·(w + d)) memory: the summaries' [n, n/l] weights
  are made a block of queries at a time and again for backward (:class:`StridedSummaries`),
  except with attention dropout, whose dropped weights are kept.

No n × n matrix is built: the sequence is cut into blocks of w queries, each scored against the
keys of its own block and the next ones on either side (2w or 3w keys); a dilated window is a
window over each residue class mod δ. Padded keys are masked inside the blocks. Decoding keeps
the last (w - 1)·δ + 1 keys and values (:class:`WindowCache`: bounded by the window, not by the
step), plus, for sparse, the summary positions that left the window (one every l steps).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.attention import AttentionMechanism
from transformer.registry import Mechanism, Setting, register


def _masked_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the allowed entries, in fp32. A row with none allowed gets finite weights
    (a padded query far from any token), never NaN, so its output cannot poison later layers."""
    scores = scores.float().masked_fill(~allowed, torch.finfo(torch.float32).min)
    return scores.softmax(dim=-1)


def _pad_rows(x: Tensor, before: int, after: int) -> Tensor:
    """x [..., n, c] with ``before`` and ``after`` rows of zeros; x itself when both are 0
    (``F.pad`` would copy it)."""
    return F.pad(x, (0, 0, before, after)) if before or after else x


def _neighbours(x: Tensor, before: int, after: int, window: int, nb: int) -> Tensor:
    """x [..., n, d] padded with ``before`` and ``after`` zero rows, cut into blocks of
    ``window`` rows, and the first ``nb`` blocks each beside the blocks that follow it within the
    padding: [..., nb, span, d], span = ((before + after) // window + 1) · window. ``before`` is
    a whole number of blocks; ``after`` may add the rows that complete the last block.

    The blocks are copied side by side (a ``cat`` of shifted views) rather than taken as
    overlapping windows of one view (``unfold``): the same values, and unfold's backward, a
    scatter-add over the overlaps, is slower than the copy and its backward together
    (BENCHMARKS.md, "Gradient layouts, and every reference pair measured exactly").
    """
    blocks = _pad_rows(x, before, after).unflatten(-2, (-1, window))  # (..., nb + span/w - 1, w, d)
    return torch.cat([blocks[..., i : i + nb, :, :] for i in range((before + after) // window + 1)], dim=-2)


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    valid: Tensor | None,
    window: int,
    causal: bool,
    stride: int = 0,
    dropout_p: float = 0.0,
) -> Tensor:
    """Softmax attention of each position to its window (and, with ``stride``, the summaries).

    Args:
        q, k, v: [..., n, d], the same n.
        valid: bool broadcastable to [..., n], True at real keys; None: all real.
        window: w; causal: see the module docstring; stride: l for sparse, 0 for none.

    Returns:
        [..., n, d].
    """
    *lead, n, d = q.shape
    nb = math.ceil(n / window)
    pad = nb * window - n
    before, after = window, 0 if causal else window
    span = before + window + after  # keys of a block of queries: the block and its neighbours
    qb = _pad_rows(q / math.sqrt(d), 0, pad).view(*lead, nb, window, d)  # (..., nb, w, d), scaled
    kb = _neighbours(k, before, pad + after, window, nb)  # (..., nb, span, d)
    vb = _neighbours(v, before, pad + after, window, nb)  # (..., nb, span, d)
    scores = qb @ kb.transpose(-2, -1)  # (..., nb, w, span): q·k/√d
    i = torch.arange(nb * window, device=q.device).view(nb, window, 1)
    j = torch.arange(nb, device=q.device)[:, None] * window - before + torch.arange(span, device=q.device)
    j = j.view(nb, 1, span)
    allowed = (i - j < window) & (j <= i if causal else j - i < window) & (j >= 0) & (j < n)  # (nb, w, span)
    if valid is not None:
        key_ok = F.pad(valid, (before, pad + after), value=False).unfold(-1, span, window)  # (..., nb, span)
        allowed = allowed & key_ok[..., :, None, :]
    if stride and dropout_p == 0.0:
        # The summaries' part apart, its [n, n/l] weights never kept (StridedSummaries), and the
        # two parts joined by their logsumexps: softmax over the union, in O(n·(w + d)) memory.
        wide = torch.promote_types(scores.dtype, torch.float32)
        scores = scores.to(wide).masked_fill(~allowed, torch.finfo(wide).min)
        lse_w = scores.logsumexp(-1, keepdim=True)  # (..., nb, w, 1)
        out_w = ((scores - lse_w).exp().to(v.dtype) @ vb).reshape(*lead, nb * window, d)
        lse_w = lse_w.reshape(*lead, nb * window, 1)
        valid_s = None if valid is None else valid[..., stride - 1 :: stride]  # (..., ns)
        flat_q = qb.reshape(*lead, nb * window, d)
        out_s, lse_s = StridedSummaries.apply(flat_q, k, v, valid_s, window, causal, stride)
        lse = torch.logaddexp(lse_w, lse_s)
        out = (lse_w - lse).exp() * out_w.to(wide) + (lse_s - lse).exp() * out_s
        return out.to(v.dtype)[..., :n, :]
    if stride:
        # Summary positions l-1, 2l-1, ... outside the window (those inside are already there).
        ks, vs = k[..., stride - 1 :: stride, :], v[..., stride - 1 :: stride, :]  # (..., ns, d)
        js = torch.arange(ks.size(-2), device=q.device) * stride + stride - 1  # (ns,)
        flat_q = qb.reshape(*lead, nb * window, d)
        s_scores = (flat_q @ ks.transpose(-2, -1)).view(*lead, nb, window, -1)  # q already scaled
        far = (i - js >= window) if causal else ((i - js).abs() >= window)  # (nb, w, ns)
        s_allowed = far
        if valid is not None:
            s_allowed = s_allowed & valid[..., stride - 1 :: stride][..., None, None, :]
        scores = torch.cat([scores, s_scores], dim=-1)
        common = torch.broadcast_shapes(allowed.shape[:-1], s_allowed.shape[:-1])
        allowed = torch.cat([allowed.expand(*common, span), s_allowed.expand(*common, -1)], dim=-1)
    weights = _masked_softmax(scores, allowed).to(v.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = weights[..., :span] @ vb  # (..., nb, w, d)
    if stride:
        out = out + (weights[..., span:].flatten(-3, -2) @ vs).view_as(out)
    return out.reshape(*lead, nb * window, d)[..., :n, :]


class StridedSummaries(torch.autograd.Function):
    """Sparse attention's summaries: softmax of each query over the every-l-th keys outside its
    window, a block of queries at a time, its [n, n/l] weights made again for backward instead
    of kept (as flash attention does): O(n·d) memory for what would be O(n²/l).

    Returns the normalised output o [..., n, d] and the logsumexp of the allowed scores
    [..., n, 1] (-inf where none is allowed, and o 0), for ``banded_attention`` to join with the
    window's part. With P the weights and s the scores, ∂L/∂s_ij = P_ij (g_o,i·v_j − g_o,i·o_i +
    g_lse,i), whence q, k and v's gradients. Computed in fp32 at least.
    """

    BLOCK = 256  # queries a block

    @staticmethod
    def _weights(q, ks, valid_s, start, window, causal, stride):
        """Scores of queries ``start ..`` ([..., b, d]) over the summaries, masked, [..., b, ns]."""
        i = torch.arange(start, start + q.size(-2), device=q.device)[:, None]
        js = torch.arange(ks.size(-2), device=q.device) * stride + stride - 1
        far = (i - js >= window) if causal else ((i - js).abs() >= window)  # (b, ns)
        allowed = far if valid_s is None else far & valid_s[..., None, :]
        return (q @ ks.mT).masked_fill_(~allowed, -math.inf)

    @staticmethod
    def forward(ctx, q, k, v, valid_s, window, causal, stride):
        """q: [..., n', d] (scaled by 1/√d); k, v: [..., n, d]; valid_s: [..., ns] or None."""
        wide = torch.promote_types(q.dtype, torch.float32)
        ks, vs = k[..., stride - 1 :: stride, :].to(wide), v[..., stride - 1 :: stride, :].to(wide)
        q = q.to(wide)
        outs, lses = [], []
        for start in range(0, q.size(-2), StridedSummaries.BLOCK):
            s = StridedSummaries._weights(
                q[..., start : start + StridedSummaries.BLOCK, :], ks, valid_s, start, window, causal, stride
            )
            lse = s.logsumexp(-1, keepdim=True)  # (..., b, 1)
            p = s.sub_(torch.where(torch.isfinite(lse), lse, 0.0)).exp_()  # 0 where not allowed
            outs.append(p @ vs)
            lses.append(lse)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -2)
        ctx.save_for_backward(q, k, v, valid_s, out, lse)
        ctx.args = (window, causal, stride, k.dtype, v.dtype)
        return out, lse

    @staticmethod
    def backward(ctx, g_out, g_lse):
        q, k, v, valid_s, out, lse = ctx.saved_tensors
        window, causal, stride, k_dtype, v_dtype = ctx.args
        ks, vs = k[..., stride - 1 :: stride, :].to(q.dtype), v[..., stride - 1 :: stride, :].to(q.dtype)
        g_out = g_out.to(q.dtype)
        g_lse = torch.zeros_like(lse) if g_lse is None else g_lse.to(q.dtype)
        grad_q = torch.empty_like(q)
        grad_ks, grad_vs = torch.zeros_like(ks), torch.zeros_like(vs)
        for start in range(0, q.size(-2), StridedSummaries.BLOCK):
            end = start + StridedSummaries.BLOCK
            qb, gb = q[..., start:end, :], g_out[..., start:end, :]
            s = StridedSummaries._weights(qb, ks, valid_s, start, window, causal, stride)
            lse_b = lse[..., start:end, :]
            p = s.sub_(torch.where(torch.isfinite(lse_b), lse_b, 0.0)).exp_()  # (..., b, ns)
            row = (gb * out[..., start:end, :]).sum(-1, keepdim=True) - g_lse[..., start:end, :]
            ds = p * ((gb @ vs.mT) - row)  # ∂L/∂s
            grad_q[..., start:end, :] = ds @ ks
            grad_ks += ds.mT @ qb
            grad_vs += p.mT @ gb
        grad_k, grad_v = (
            torch.zeros(k.shape, dtype=k_dtype, device=k.device),
            torch.zeros(v.shape, dtype=v_dtype, device=v.device),
        )
        grad_k[..., stride - 1 :: stride, :] = grad_ks
        grad_v[..., stride - 1 :: stride, :] = grad_vs
        return grad_q, grad_k, grad_v, None, None, None, None


class WindowCache:
    """The decoding state of local attention: the keys and values of the last ``span`` positions.

    ``k``, ``v``: [rows, heads, ≤ span, d_head]; ``length``: positions fed so far; for sparse,
    ``summary_k``/``summary_v`` hold the summary positions that left the window, in order.
    """

    def __init__(self, span: int) -> None:
        self.span = span
        self.length = 0
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.summary_k: Tensor | None = None
        self.summary_v: Tensor | None = None

    def select(self, rows: Tensor) -> None:
        """Keeps rows ``rows`` ([new_rows] indices) in that order (beam search)."""
        for name in ("k", "v", "summary_k", "summary_v"):
            x = getattr(self, name)
            if x is not None:
                setattr(self, name, x.index_select(0, rows))


class LocalAttention(AttentionMechanism):
    """Local (``dilation`` 1), atrous (``dilation`` > 1) or sparse (``stride`` > 0) attention.

    Args:
        window: w, positions a query sees on each side, itself included.
        dilation: δ, distance between the window's positions.
        stride: l, every l-th position is seen by every (later) query; 0 for none.
        dropout: on the attention weights.
    """

    def __init__(self, window: int, dilation: int = 1, stride: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        if stride and dilation > 1:
            raise ValueError("sparse attention has no dilation")
        self.window, self.dilation, self.stride, self.dropout = window, dilation, stride, dropout

    @property
    def span(self) -> int:
        """How far back a query sees in its window: (w - 1)·δ + 1 positions, itself included."""
        return (self.window - 1) * self.dilation + 1

    def allowed(self, i: Tensor, j: Tensor, causal: bool) -> Tensor:
        """Whether query position i sees key position j (broadcast): the pattern A(i), written out."""
        diff = i - j
        ok = (diff % self.dilation == 0) & (diff.abs() < self.span)
        if self.stride:
            ok = ok | (j % self.stride == self.stride - 1)
        return ok & (diff >= 0) if causal else ok

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        state: WindowCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """The mechanisms' signature (``attention.AttentionMechanism``); mask: key padding [B, 1, 1, n]."""
        p = self.dropout if self.training else 0.0
        if state is not None:
            return self._step(q, k, v, state, p), None
        if q.size(2) != k.size(2):
            raise ValueError(f"local attention is self-attention: {q.size(2)} queries, {k.size(2)} keys")
        valid = None if mask is None else mask[:, :, 0, :]  # (B, 1, n)
        if need_weights:  # the pattern as an n × n matrix: for pictures only
            pos = torch.arange(q.size(2), device=q.device)
            allowed = self.allowed(pos[:, None], pos[None, :], causal)  # (n, n)
            if valid is not None:
                allowed = allowed & valid[..., None, :]
            weights = _masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), allowed).to(v.dtype)
            return weights @ v, weights
        if self.dilation == 1:
            return banded_attention(q, k, v, valid, self.window, causal, self.stride, p), None
        return self._dilated(q, k, v, valid, causal, p), None

    def _dilated(
        self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, causal: bool, p: float
    ) -> Tensor:
        """A window over each residue class mod δ: position i = i'·δ + r is row i' of class r."""
        b, h, n, d = q.shape
        dil = self.dilation
        m = math.ceil(n / dil)
        pad = m * dil - n
        if valid is None and pad:
            valid = torch.ones(b, 1, n, dtype=torch.bool, device=q.device)

        def classes(x: Tensor) -> Tensor:  # (..., n, c) -> (..., δ, m, c)
            x = _pad_rows(x, 0, pad)
            return x.view(*x.shape[:-2], m, dil, x.size(-1)).transpose(-3, -2)

        if valid is not None:
            valid = classes(valid[..., None].to(torch.uint8)).squeeze(-1).bool()  # (B, 1, δ, m)
        out = banded_attention(
            classes(q), classes(k), classes(v), valid, self.window, causal, dropout_p=p
        )  # (B, H, δ, m, d)
        return out.transpose(-3, -2).reshape(b, h, m * dil, d)[:, :, :n]

    def _step(self, q: Tensor, k: Tensor, v: Tensor, state: WindowCache, p: float) -> Tensor:
        """Decoding: the new queries against the cached window (and summaries), then the cache moves on."""
        t0, t = state.length, q.size(2)
        keys = [x for x in (state.summary_k, state.k, k) if x is not None]
        values = [x for x in (state.summary_v, state.v, v) if x is not None]
        held = 0 if state.k is None else state.k.size(2)
        n_summary = 0 if state.summary_k is None else state.summary_k.size(2)
        positions = torch.cat(
            [
                torch.arange(n_summary, device=q.device) * self.stride + self.stride - 1,
                torch.arange(t0 - held, t0 + t, device=q.device),
            ]
        )
        keys, values = torch.cat(keys, dim=2), torch.cat(values, dim=2)
        allowed = self.allowed(torch.arange(t0, t0 + t, device=q.device)[:, None], positions[None, :], True)
        weights = _masked_softmax(q @ keys.transpose(-2, -1) / math.sqrt(q.size(-1)), allowed).to(v.dtype)
        if p > 0.0:
            weights = F.dropout(weights, p=p)
        out = weights @ values
        # Move on: keep the last span positions; summaries that leave the window are kept apart.
        window_k, window_v = keys[:, :, n_summary:], values[:, :, n_summary:]
        drop = max(0, window_k.size(2) - self.span)
        if self.stride and drop:
            gone = torch.arange(t0 - held, t0 - held + drop, device=q.device)
            keep = (gone % self.stride == self.stride - 1).nonzero().squeeze(1)
            if keep.numel():
                new_k, new_v = window_k[:, :, keep], window_v[:, :, keep]
                state.summary_k = new_k if state.summary_k is None else torch.cat([state.summary_k, new_k], 2)
                state.summary_v = new_v if state.summary_v is None else torch.cat([state.summary_v, new_v], 2)
        state.k, state.v = window_k[:, :, drop:], window_v[:, :, drop:]
        state.length = t0 + t
        return out

    def new_state(self, max_steps: int) -> WindowCache:
        """An empty cache that will hold at most the last (w - 1)·δ + 1 positions."""
        return WindowCache(self.span)


WINDOW = Setting(
    "window", 32, "local/atrous/sparse: positions a query sees on each side, itself included", minimum=1
)
register(
    Mechanism(
        "local",
        build=lambda cfg, d_head, dropout: LocalAttention(cfg.window, dropout=dropout),
        settings=(WINDOW,),
        refuses={"cross": "a window of nearby positions means nothing between a target and its source"},
    )
)
register(
    Mechanism(
        "atrous",
        build=lambda cfg, d_head, dropout: LocalAttention(cfg.window, dilation=cfg.dilation, dropout=dropout),
        settings=(
            WINDOW,
            Setting("dilation", 2, "atrous: distance between the window's positions", minimum=1),
        ),
        refuses={"cross": "a dilated window of positions means nothing between a target and its source"},
    )
)
register(
    Mechanism(
        "sparse",
        build=lambda cfg, d_head, dropout: LocalAttention(cfg.window, stride=cfg.stride, dropout=dropout),
        settings=(
            WINDOW,
            Setting(
                "stride",
                32,
                "sparse: every stride-th position is a summary all (later) queries see",
                minimum=1,
            ),
        ),
        refuses={"cross": "its local + strided pattern is defined over one sequence's positions"},
    )
)
