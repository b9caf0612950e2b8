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
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EPS = 1e-6  # keeps the normaliser φ(Q_i)·Z_i away from 0


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


class LinearAttention(nn.Module):
    """φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1) (equations (5) and (6)) behind the mechanisms' signature.

    Encoder self-attention and cross-attention use the whole-sequence summary; decoder
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
