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

Padded keys have φ(K_j) set to 0, so they contribute nothing to either sum. The sums are taken in
fp32 whatever the autocast, since they add up n terms.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EPS = 1e-6  # keeps the normaliser φ(Q_i)·Z_i away from 0


class LinearState:
    """The RNN state of causal linear attention while decoding: S = Σ φ(k)vᵀ and Z = Σ φ(k).

    ``s``: [rows, heads, m, d_v]; ``z``: [rows, heads, m]; None before the first step. Its size
    does not grow with the number of steps.
    """

    def __init__(self) -> None:
        self.s: Tensor | None = None
        self.z: Tensor | None = None

    def select(self, rows: Tensor, spare: Tensor | None = None) -> Tensor | None:
        """Keeps rows ``rows`` ([new_rows] indices) in that order (beam search); ``spare`` is passed on."""
        if self.s is not None:
            self.s, self.z = self.s.index_select(0, rows), self.z.index_select(0, rows)
        return spare


def causal_linear(
    fq: Tensor, fk: Tensor, v: Tensor, s0: Tensor | None, z0: Tensor | None, chunk: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal linear attention by prefix sums, ``chunk`` positions at a time.

    Args:
        fq, fk: φ(Q), φ(K), [B, H, T, m]; v: [B, H, T, d].
        s0, z0: the state before these positions ([B, H, m, d], [B, H, m]) or None.
        chunk: positions per chunk C; memory O(T/C · m·d + T·C), time O(T·(m·d + C·(m + d))).

    Returns:
        out [B, H, T, d] and the state after the last position, (S, Z).
    """
    b, h, t, m = fq.shape
    c = min(chunk, t)
    nc = math.ceil(t / c)
    pad = nc * c - t
    fq_, fk_, v_ = (F.pad(x, (0, 0, 0, pad)).view(b, h, nc, c, x.size(-1)) for x in (fq, fk, v))
    kv = fk_.transpose(-2, -1) @ v_  # (B, H, nc, m, d): each chunk's Σ φ(k)vᵀ
    ks = fk_.sum(-2)  # (B, H, nc, m): each chunk's Σ φ(k)
    # The sums over all earlier chunks (exclusive prefix sums): equation (10) across chunks.
    s_before = torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1]], dim=2).cumsum(2)
    z_before = torch.cat([torch.zeros_like(ks[:, :, :1]), ks[:, :, :-1]], dim=2).cumsum(2)
    if s0 is not None:
        s_before = s_before + s0[:, :, None]
        z_before = z_before + z0[:, :, None]
    a = (fq_ @ fk_.transpose(-2, -1)).tril()  # (B, H, nc, C, C): φ(q_i)·φ(k_j), j ≤ i in the chunk
    num = fq_ @ s_before + a @ v_  # (B, H, nc, C, d)
    den = (fq_ @ z_before[..., None]).squeeze(-1) + a.sum(-1)  # (B, H, nc, C)
    out = (num / (den[..., None] + EPS)).view(b, h, nc * c, -1)[:, :, :t]
    return out, s_before[:, :, -1] + kv[:, :, -1], z_before[:, :, -1] + ks[:, :, -1]


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
        with torch.autocast(q.device.type, enabled=False):
            fq = self.feature_map(q.float(), is_query=True)  # (B, H, Tq, m)
            fk = self.feature_map(k.float(), is_query=False)  # (B, H, Tk, m)
            v = v.float()
            if mask is not None:
                fk = fk * mask.transpose(-2, -1)  # (B, 1, Tk, 1): padded keys add nothing
            if causal:
                s0, z0 = (state.s, state.z) if state is not None else (None, None)
                out, s, z = causal_linear(fq, fk, v, s0, z0, self.chunk)
                if state is not None:
                    state.s, state.z = s, z
            else:
                s = fk.transpose(-2, -1) @ v  # (B, H, m, d): Σ_j φ(K_j) V_jᵀ
                z = fk.sum(-2)  # (B, H, m): Σ_j φ(K_j)
                out = (fq @ s) / ((fq @ z[..., None]) + EPS)  # (B, H, Tq, d)
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
