"""Nyström attention (Xiong et al. 2021, "Nyströmformer"): softmax attention through m landmarks.

With landmarks Q̃, K̃ ∈ R^{m × d} (the means of m segments of the queries and of the keys,
equation (14)), softmax attention S = softmax(QKᵀ/√d) is approximated (equation (15)) by

    Ŝ V = softmax(Q K̃ᵀ/√d) · (softmax(Q̃ K̃ᵀ/√d))⁺ · softmax(Q̃ Kᵀ/√d) V
             [n × m]              [m × m]              [m × n]·[n × d]

computed right to left, so nothing n × n is formed: O(n·m·d + m³) time. The two outer
products are softmax attention (of the m landmarks over the n keys, then of the n queries
over the m landmarks), taken by the fused kernel, which keeps no n × m weights: O(n·d)
memory beyond the inputs. The
Moore-Penrose pseudo-inverse ⁺ is the paper's iteration (equation (16)),
Z_{j+1} = ¼ Z_j (13I − A Z_j (15I − A Z_j (7I − A Z_j))), from Z_0 = Aᵀ / (‖A‖₁ ‖A‖_∞), six
steps by default; the norms are each (sentence, head)'s own, not the batch's maximum as in the
paper, so that a sentence's output does not depend on its neighbours. The paper's optional
depthwise convolution of V (a skip connection) is not included.

Segments follow each sentence's real length L: position i < L belongs to segment ⌊i·m/L⌋, and
padded positions to none, so padded queries and keys contribute nothing to the landmarks and
padded keys nothing to softmax(Q̃Kᵀ). With m ≥ L every token is its own segment (the landmarks
are the queries and keys themselves, the rest empty), and Ŝ = S up to the pseudo-inverse's
iteration. An empty segment's landmark is masked as a key and given an identity row in A, so
it drops out of the product; a sequence of n < m positions is therefore taken with n landmarks.
Without padding, and with n a multiple of m, the segments are equal runs of n/m positions and
their means are taken by a reshape, without the n × m one-hot products (the same landmarks).
Computed in fp32 whatever the autocast (the iteration would not converge in bf16).

Encoder self-attention only (``mechanisms.REFUSED``): the landmarks average over the whole
sequence, later positions included, so it is not causal; cross-attention would need landmarks
of queries and keys from different sequences, which the paper does not define.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer.attention import AttentionMechanism, fused_attention
from transformer.registry import Mechanism, Setting, register

NEG = -1e9  # the score of a masked entry: finite, so an all-masked row gives weights, not NaN


def segments(n: int, m: int, lengths: Tensor) -> Tensor:
    """[B, n, m] one-hot of each position's segment ⌊i·m/L⌋ for rows of real lengths ``lengths``
    ([B]); zero rows at padded positions."""
    i = torch.arange(n, device=lengths.device)
    seg = (i[None, :] * m) // lengths[:, None].clamp(min=1)  # (B, n)
    one_hot = seg[..., None] == torch.arange(m, device=lengths.device)  # (B, n, m)
    return one_hot & (i[None, :] < lengths[:, None])[..., None]


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """The Moore-Penrose pseudo-inverse of square matrices [..., m, m] by equation (16)."""
    eye = torch.eye(a.size(-1), dtype=a.dtype, device=a.device)
    norms = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)  # ‖A‖₁ ‖A‖_∞, each matrix its own
    z = a.transpose(-2, -1) / norms[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


class NystromAttention(AttentionMechanism):
    """Equation (15) behind the mechanisms' signature (``attention.AttentionMechanism``).

    Args:
        landmarks: m, the segments whose means stand for the queries and keys.
        pinv_iterations: steps of equation (16).
        dropout: on the n × m weights softmax(Q K̃ᵀ/√d).
    """

    def __init__(self, landmarks: int, pinv_iterations: int = 6, dropout: float = 0.0) -> None:
        super().__init__()
        self.landmarks, self.pinv_iterations, self.dropout = landmarks, pinv_iterations, dropout

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        state: object | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """The mechanisms' signature; mask: key padding [B, 1, 1, n]. ``need_weights``: the implied
        Ŝ [B, H, n, n] (pictures only)."""
        if causal or state is not None:
            raise ValueError("nystrom attention cannot be causal: its landmarks average all positions")
        if q.size(2) != k.size(2):
            raise ValueError(f"nystrom attention is self-attention: {q.size(2)} queries, {k.size(2)} keys")
        b, _, n, d = q.shape
        # No more landmarks than positions: with m ≥ L every token is its own segment and the
        # other landmarks are empty, each an identity row of A that drops out of the product, so
        # m = n gives the same output without the m × m iteration's memory (at n = 16 with the
        # default 64 landmarks, 8x less for the layer).
        m = min(self.landmarks, n)
        dtype = v.dtype
        with torch.autocast(q.device.type, enabled=False):
            q, k, v = q.float(), k.float(), v.float()
            scale = 1.0 / math.sqrt(d)
            if mask is None and n % m == 0:
                # Unpadded, n a multiple of m: segment j is positions j·n/m .. (j+1)·n/m − 1, so
                # the means are a reshape and a sum, no one-hot matrix (the same landmarks).
                # Sums scaled afterwards, not means: a mean's gradient is divided at full size, in
                # the transposed layout of K̃ᵀ's gradient, and then copied into K's layout; a sum's
                # is copied once (BENCHMARKS.md,
                # "Gradient layouts, and every reference pair measured exactly").
                q_land = q.unflatten(2, (m, n // m)).sum(3) * (m / n)  # (B, H, m, d): equation (14)
                k_land = k.unflatten(2, (m, n // m)).sum(3) * (m / n)
                present = key_ok = None  # every landmark has a segment; no key is padded
            else:
                if mask is None:
                    lengths = torch.full((b,), n, device=q.device)
                    key_ok = None
                else:
                    key_ok = mask[:, :, 0, :][..., None, :]  # (B, 1, 1, n)
                    lengths = key_ok[:, 0, 0].sum(-1)
                seg = segments(n, m, lengths).float()  # (B, n, m)
                counts = seg.sum(1)  # (B, m)
                present = (counts > 0)[:, None, None, :]  # (B, 1, 1, m): landmarks with a segment
                means = seg.transpose(-2, -1)[:, None] / counts.clamp(min=1)[:, None, :, None]  # (B, 1, m, n)
                q_land, k_land = means @ q, means @ k  # (B, H, m, d): equation (14)

            def softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
                if allowed is not None:
                    scores = scores.masked_fill(~allowed, NEG)
                return scores.softmax(dim=-1)

            kernel_2 = softmax(q_land @ k_land.transpose(-2, -1) * scale, present)  # (B, H, m, m)
            if present is not None:  # an empty landmark gets an identity row
                kernel_2 = torch.where(present.transpose(-2, -1), kernel_2, torch.eye(m, device=q.device))
            pinv = iterative_pinv(kernel_2, self.pinv_iterations)  # (B, H, m, m)
            p = self.dropout if self.training else 0.0
            if need_weights:
                kernel_1 = softmax(q @ k_land.transpose(-2, -1) * scale, present)  # (B, H, n, m)
                kernel_3 = softmax(q_land @ k.transpose(-2, -1) * scale, key_ok)  # (B, H, m, n)
                if p > 0.0:
                    kernel_1 = nn.functional.dropout(kernel_1, p=p)
                middle = kernel_1 @ pinv  # (B, H, n, m)
                out, weights = middle @ (kernel_3 @ v), middle @ kernel_3  # (B, H, n, d), (B, H, n, n)
            else:
                # Right to left, softmax(Q̃Kᵀ/√d)·V and then softmax(QK̃ᵀ/√d)·Z, Z = A⁺·that, are
                # each softmax attention: of the m landmarks over the n keys, and of the n queries
                # over the m landmarks with values Z. Through the fused kernel, neither n × m
                # matrix of weights is kept for the backward.
                z = pinv @ fused_attention(q_land, k, v, key_ok)  # (B, H, m, d)
                out, weights = fused_attention(q, k_land, z, present, dropout_p=p), None  # (B, H, n, d)
        return out.to(dtype), weights


register(
    Mechanism(
        "nystrom",
        build=lambda cfg, d_head, dropout: NystromAttention(cfg.landmarks, dropout=dropout),
        settings=(
            Setting(
                "landmarks", 64, "nystrom: m, segments whose means stand for the queries and keys", minimum=1
            ),
        ),
        refuses={
            "decoder_self": "not causal: its landmarks average over all positions, later ones too",
            "cross": "its landmarks are segments of one sequence, queries and keys alike",
        },
    )
)
