"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), elu+1 or Performer features.

Softmax attention, V'_i = Σ_j sim(Q_i, K_j) V_j / Σ_j sim(Q_i, K_j) with sim = exp(q·k/√d)
(equation (3)), costs O(n²·d). With a kernel sim(q, k) = φ(q)·φ(k) (equation (4)) the sums
factor (equation (5)):

    V'_i = φ(Q_i)ᵀ (Σ_j φ(K_j) V_jᵀ) / φ(Q_i)ᵀ (Σ_j φ(K_j))

so the [m, d] summary Σ_j φ(K_j)V_jᵀ and the [m] normaliser Σ_j φ(K_j) are computed once:
O(n·m·d) time and O(m·d) memory beyond the inputs, for m features (m = d for elu+1). Causal
attention keeps prefix sums S_i = Σ_{j≤i} φ(K_j)V_jᵀ, Z_i = Σ_{j≤i} φ(K_j) (equations (8)-(11)),
computed here chunk by chunk (exact prefix sums across chunks, a C × C triangle inside one), and
decoding is an RNN whose state is (S, Z), of constant size (section 3.4, equations (16)-(20)).
The feature map φ is its own module (``feature_maps.py``): elu+1 gives "linear", FAVOR+ the
Performer (Choromanski et al. 2021), whose Σ_j φ(q)·φ(k) V_j estimates softmax attention.

Both sums come from one product: with [V, 1], a column of ones beside the values, Σ_j φ(K_j)[V_j, 1]ᵀ
is [S, Z] ([m, d + 1]) and φ(Q_i)ᵀ[S, Z] is the numerator and the normaliser together.
Padded keys have φ(K_j) set to 0, so they contribute nothing to either sum. The sums are taken in
fp32 (at least) whatever the autocast, since they add up n terms.

The non-causal Performer (encoder self-attention, cross-attention) never holds φ(Q) or φ(K) whole:
:class:`BlockedFavor` makes them a block of positions at a time, and again for backward.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.feature_maps import FavorFeatureMap, favor_features, favor_features_backward

EPS = 1e-6  # keeps the normaliser φ(Q_i)·Z_i away from 0
# Values of φ that the blocked Performer (:class:`BlockedFavor`) makes at a time: 1 MiB in fp32,
# so that a block's features stay in the CPU's cache between the products that use them.
BLOCK_VALUES = 1 << 18
BLOCK_MIN_ROWS = 16  # ... but at least this many positions a block (many sentences x heads)


class LinearState:
    """The RNN state of causal linear attention while decoding: S = Σ φ(k)vᵀ and Z = Σ φ(k).

    Kept as one tensor ``sz`` [rows, heads, m, d_v + 1] whose last column is Z (the sums of
    [v, 1], see :func:`causal_linear`); ``s`` [rows, heads, m, d_v] and ``z`` [rows, heads, m]
    are views of it. None before the first step. Its size does not grow with the number of steps.
    """

    def __init__(self) -> None:
        self.sz: Tensor | None = None

    @property
    def s(self) -> Tensor | None:
        return None if self.sz is None else self.sz[..., :-1]

    @property
    def z(self) -> Tensor | None:
        return None if self.sz is None else self.sz[..., -1]

    def select(self, rows: Tensor, spare: Tensor | None = None) -> Tensor | None:
        """Keeps rows ``rows`` ([new_rows] indices) in that order (beam search); ``spare`` is passed on."""
        if self.sz is not None:
            self.sz = self.sz.index_select(0, rows)
        return spare


def with_ones(v: Tensor) -> Tensor:
    """[..., T, d] -> [..., T, d + 1]: v with a column of ones, so that Σ φ(k)[v, 1]ᵀ = [S, Z] and
    one product φ(q)ᵀ[S, Z] gives the numerator and the normaliser together."""
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)


def normalise(num_den: Tensor) -> Tensor:
    """[..., d + 1] -> [..., d]: the numerator's columns over the last (the normaliser)."""
    # one reciprocal per row, then a product: its gradient is two passes over [..., d], a
    # quotient's four
    return num_den[..., :-1] * (num_den[..., -1:] + EPS).reciprocal()


class ExclusivePrefixSum(torch.autograd.Function):
    """out[:, :, i] = Σ_{j<i} x[:, :, j] along dim 2 (the chunks), by one add per chunk.

    ``torch.cumsum`` over a dimension that is not the last runs 4-5x slower than a copy of the
    same tensor on the CPU (measured: 49 ms against 10 for [1, 8, 64, 256, 64]), and its autograd
    adds two flips; a loop over the chunks costs about a copy, forward and backward
    (∂L/∂x_j = Σ_{i>j} ∂L/∂out_i, the suffix sums).
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        """x: [B, H, nc, ...] -> the exclusive prefix sums over nc, same shape."""
        out = torch.empty_like(x)
        out[:, :, 0].zero_()
        for i in range(1, x.size(2)):
            torch.add(out[:, :, i - 1], x[:, :, i - 1], out=out[:, :, i])
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        out[:, :, -1].zero_()
        for i in range(grad.size(2) - 2, -1, -1):
            torch.add(out[:, :, i + 1], grad[:, :, i + 1], out=out[:, :, i])
        return out


def causal_linear(
    fq: Tensor, fk: Tensor, v1: Tensor, sz0: Tensor | None, chunk: int
) -> tuple[Tensor, Tensor]:
    """Causal linear attention by prefix sums, ``chunk`` positions at a time.

    Args:
        fq, fk: φ(Q), φ(K), [B, H, T, m]; v1: [V, 1] (:func:`with_ones`), [B, H, T, d + 1].
        sz0: the state [S, Z] before these positions, [B, H, m, d + 1], or None.
        chunk: positions per chunk C; memory O(T/C · m·d + T·C), time O(T·(m·d + C·(m + d))).

    Returns:
        Σ_{j≤i} (φ(q_i)·φ(k_j)) [v_j, 1], [B, H, T, d + 1] (numerators and normalisers, for
        :func:`normalise`), and the state [S, Z] after the last position.
    """
    b, h, t, m = fq.shape
    c = min(chunk, t)
    nc = math.ceil(t / c)
    pad = nc * c - t
    fq_, fk_, v1_ = (
        (F.pad(x, (0, 0, 0, pad)) if pad else x).view(b, h, nc, c, x.size(-1)) for x in (fq, fk, v1)
    )
    kv = fk_.transpose(-2, -1) @ v1_  # (B, H, nc, m, d+1): each chunk's Σ φ(k)[v, 1]ᵀ
    # The sums over all earlier chunks (exclusive prefix sums): equation (10) across chunks.
    before = ExclusivePrefixSum.apply(kv) if nc > 1 else torch.zeros_like(kv)
    if sz0 is not None:
        before = before + sz0[:, :, None]
    a = (fq_ @ fk_.transpose(-2, -1)).tril_()  # (B, H, nc, C, C): φ(q_i)·φ(k_j), j ≤ i in the chunk
    num_den = (fq_ @ before).add_(a @ v1_).view(b, h, nc * c, -1)[:, :, :t]  # (B, H, T, d+1)
    return num_den, before[:, :, -1] + kv[:, :, -1]


class BlockedFavor(torch.autograd.Function):
    """φ(Q) (φ(K)ᵀ [V, 1]) with FAVOR+ features, made a block of positions at a time and made again
    for the gradient: the non-causal Performer without its [len, m] feature matrices.

    The factored form needs φ(Q) and φ(K), [len, m] each (m = 256 features: 4x the size of Q),
    and autograd keeps both for backward. Here the keys' features are made ``block`` positions at a
    time and summed into [S, Z] = Σ_j φ(K_j)[V_j, 1]ᵀ at once, then the queries' a block at a time
    into their products with it; backward makes each block's features again (one more [len, d] x
    [d, m] product each for queries and keys: ~12% more arithmetic at d = 64) instead of keeping
    them, so the memory beyond the inputs is [B, H, m, d + 1] and a block's features, and those stay
    in the CPU's cache between the products that use them.

    Gradients (g = ∂L/∂ND, ND = φ(Q) SZ, SZ = φ(K)ᵀ V1): ∂L/∂φ(Q) = g SZᵀ, ∂L/∂SZ = φ(Q)ᵀ g,
    ∂L/∂φ(K) = V1 (∂L/∂SZ)ᵀ, ∂L/∂V1 = φ(K) ∂L/∂SZ; through φ as in
    :func:`~transformer.feature_maps.favor_features_backward`. ω gets none (a buffer).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v1: Tensor, w: Tensor, keep: Tensor | None, block: int) -> Tensor:
        """q: [B, H, Tq, d], k: [B, H, Tk, d], v1: [B, H, Tk, e] ([V, 1]), w: [m, d] (ω scaled by
        d^-1/4), keep: [B, 1, Tk, 1] (0 at padded keys) or None -> [B, H, Tq, e]."""
        sz = _favor_key_sums(k, v1, w, keep, block)  # (B, H, m, e)
        num_den = torch.cat(
            [favor_features(q[:, :, i : i + block], w, True) @ sz for i in range(0, q.size(2), block)], dim=2
        )
        ctx.save_for_backward(q, k, v1, w, keep, sz)
        ctx.block = block
        return num_den

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v1, w, keep, sz = ctx.saved_tensors
        block = ctx.block
        grad_q = torch.empty_like(q)
        grad_sz = torch.zeros_like(sz)  # (B, H, m, e)
        for i in range(0, q.size(2), block):
            fq = favor_features(q[:, :, i : i + block], w, True)  # (B, H, b, m)
            g = grad[:, :, i : i + block]  # (B, H, b, e)
            grad_sz += fq.transpose(-2, -1) @ g
            grad_q[:, :, i : i + block] = favor_features_backward(q[:, :, i : i + block], w, fq, g @ sz.mT)
        grad_k, grad_v1 = torch.empty_like(k), torch.empty_like(v1)
        for j in range(0, k.size(2), block):
            fk = _masked_key_features(k, w, keep, j, block)  # (B, H, b, m)
            grad_v1[:, :, j : j + block] = fk @ grad_sz
            grad_fk = v1[:, :, j : j + block] @ grad_sz.mT  # (B, H, b, m)
            grad_k[:, :, j : j + block] = favor_features_backward(k[:, :, j : j + block], w, fk, grad_fk)
        return grad_q, grad_k, grad_v1, None, None, None


def _masked_key_features(k: Tensor, w: Tensor, keep: Tensor | None, start: int, block: int) -> Tensor:
    """φ of keys ``start .. start + block`` ([B, H, b, m]), 0 at padded keys."""
    fk = favor_features(k[:, :, start : start + block], w, False)
    return fk if keep is None else fk.mul_(keep[:, :, start : start + block])


def _favor_key_sums(k: Tensor, v1: Tensor, w: Tensor, keep: Tensor | None, block: int) -> Tensor:
    """[S, Z] = Σ_j φ(K_j)[V_j, 1]ᵀ, [B, H, m, e], the keys' features made a block at a time."""
    sz = None
    for j in range(0, k.size(2), block):
        part = _masked_key_features(k, w, keep, j, block).mT @ v1[:, :, j : j + block]  # (B, H, m, e)
        sz = part if sz is None else sz.add_(part)
    return sz


class LinearAttention(nn.Module):
    """φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1) (equations (5) and (6)) behind the mechanisms' signature.

    Encoder self-attention and cross-attention use the whole-sequence summary (with FAVOR+
    features through :class:`BlockedFavor`, unless the weights are asked for); decoder
    self-attention the causal prefix sums, or with a :class:`LinearState` the RNN form.

    Args:
        feature_map: ``feature_maps.EluFeatureMap`` (linear) or ``FavorFeatureMap`` (Performer).
        chunk: positions per chunk of the causal prefix sums.
    """

    def __init__(self, feature_map: nn.Module, chunk: int = 64) -> None:
        super().__init__()
        self.feature_map = feature_map
        self.chunk = chunk

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        state: LinearState | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """The mechanisms' signature (``attention.SoftmaxAttention``); mask: key padding [B, 1, 1, Tk]."""
        if state is not None and not causal:
            raise ValueError("a decoding state is for causal self-attention")
        if self.training:
            self.feature_map.redraw()
        dtype = v.dtype
        wide = torch.promote_types(dtype, torch.float32)  # fp32 at least (fp64 stays fp64)
        with torch.autocast(q.device.type, enabled=False):
            if isinstance(self.feature_map, FavorFeatureMap) and not causal and not need_weights:
                return self._blocked_favor(q.to(wide), k.to(wide), v.to(wide), mask).to(dtype), None
            fq = self.feature_map(q.to(wide), is_query=True)  # (B, H, Tq, m)
            fk = self.feature_map(k.to(wide), is_query=False)  # (B, H, Tk, m)
            if mask is not None:
                fk = fk * mask.transpose(-2, -1)  # (B, 1, Tk, 1): padded keys add nothing
            v1 = with_ones(v.to(wide))  # (B, H, Tk, d+1)
            if causal:
                sz0 = state.sz if state is not None else None
                num_den, sz = causal_linear(fq, fk, v1, sz0, self.chunk)
                if state is not None:
                    state.sz = sz
            else:
                sz = fk.transpose(-2, -1) @ v1  # (B, H, m, d+1): [Σ_j φ(K_j) V_jᵀ, Σ_j φ(K_j)]
                num_den = fq @ sz  # (B, H, Tq, d+1)
            out = normalise(num_den)  # (B, H, Tq, d)
            weights = self.implied_weights(fq, fk, causal) if need_weights else None
        return out.to(dtype), weights

    def _blocked_favor(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """The non-causal Performer by :class:`BlockedFavor`: q [B, H, Tq, d], k, v [B, H, Tk, d] ->
        [B, H, Tq, d]; mask: key padding [B, 1, 1, Tk] or None."""
        w = self.feature_map.scaled_omega(q.dtype)  # (m, d)
        keep = None if mask is None else mask.transpose(-2, -1).to(q.dtype)  # (B, 1, Tk, 1)
        block = max(BLOCK_MIN_ROWS, BLOCK_VALUES // (q.size(0) * q.size(1) * w.size(0)))
        return normalise(BlockedFavor.apply(q, k, with_ones(v), w, keep, block))

    @staticmethod
    def implied_weights(fq: Tensor, fk: Tensor, causal: bool) -> Tensor:
        """The normalised rows φ(Q_i)·φ(K_j) / Σ_j φ(Q_i)·φ(K_j), [B, H, Tq, Tk]: n × n, for pictures only."""
        a = fq @ fk.transpose(-2, -1)
        if causal:
            a = a.tril(diagonal=a.size(-1) - a.size(-2))
        return a / (a.sum(-1, keepdim=True) + EPS)

    def new_state(self, max_steps: int) -> LinearState:
        """An empty RNN state; its size does not depend on ``max_steps``."""
        return LinearState()
