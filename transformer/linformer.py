"""Linformer attention (Wang et al. 2020): keys and values projected along the sequence from n to k.

Softmax attention with the n keys and values replaced by k linear combinations of them
(equation (7)):

    head = softmax(Q (E K)ᵀ / √d) · (F V),   E, F ∈ R^{k × n} learned

The weights are n × k, not n × n: O(n·k·d) time and O(n·k) memory. E and F here are one pair
per layer, shared by its heads (the paper's "headwise sharing", section 4), initialised with
entries N(0, 1/k), the random projection of its Theorem 1.

Variable length n. E and F are stored for ``max_length`` positions and a sequence of n uses their
first n columns, E[:, :n]: position i of every sentence has the same column, whatever the batch.
A sequence longer than ``max_length`` is refused with an error naming the setting (there is no
column to give it); ``attention.max_length`` sets it. Padded keys and values are set to 0 before
the projection, so they contribute nothing to E K or F V: a sentence projects the same alone and
in a padded batch.

Encoder self-attention and cross-attention (the encoder output projected to k). Not decoder
self-attention: every one of the k projected keys mixes all n positions, later ones included,
so it cannot be causal (``mechanisms.REFUSED``). No decoding state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LinformerAttention(nn.Module):
    """softmax(Q (E K)ᵀ/√d)(F V) behind the mechanisms' signature (``attention.SoftmaxAttention``).

    Args:
        projected_length: k, the projected keys and values.
        max_length: the longest key sequence E and F cover.
        dropout: on the n × k attention weights.
    """

    def __init__(self, projected_length: int, max_length: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.projected_length, self.max_length, self.dropout = projected_length, max_length, dropout
        std = 1.0 / math.sqrt(projected_length)
        self.e = nn.Parameter(torch.randn(projected_length, max_length) * std)  # E: keys
        self.f = nn.Parameter(torch.randn(projected_length, max_length) * std)  # F: values

    def project(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """E K and F V, [B, H, k, d] each, from keys and values [B, H, n, d]; padded ones zeroed."""
        n = k.size(2)
        if n > self.max_length:
            raise ValueError(
                f"linformer: {n} keys, but its projections cover attention.max_length={self.max_length}"
            )
        if mask is not None:
            keep = mask.transpose(-2, -1).to(k.dtype)  # (B, 1, n, 1)
            k, v = k * keep, v * keep
        e, f = self.e[:, :n].to(k.dtype), self.f[:, :n].to(v.dtype)
        return _across_heads(e, k), _across_heads(f, v)  # (B, H, k, d): equation (7)'s E K and F V

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
        """The mechanisms' signature; mask: key padding [B, 1, 1, n]. ``need_weights``: the weights
        P·F [B, H, Tq, n] over the original positions that the output implies (n × n: pictures only)."""
        if causal or state is not None:
            raise ValueError("linformer attention cannot be causal: every projected key mixes all positions")
        pk, pv = self.project(k, v, mask)
        scores = q @ (pk / math.sqrt(q.size(-1))).transpose(-2, -1)  # (B, H, Tq, k); 1/√d on the k keys
        weights = scores.float().softmax(dim=-1).to(v.dtype)
        if self.training and self.dropout > 0.0:
            weights = F.dropout(weights, p=self.dropout)
        out = weights @ pv  # (B, H, Tq, d)
        if not need_weights:
            return out, None
        implied = weights @ self.f[:, : k.size(2)].to(weights.dtype)  # (B, H, Tq, n)
        if mask is not None:
            implied = implied * mask[:, :, 0, None, :].to(implied.dtype)
        return out, implied


def _across_heads(e: Tensor, x: Tensor) -> Tensor:
    """E X for every head at once: e [k, n], x [B, H, n, d] -> [B, H, k, d].

    The heads share E, so the heads are laid side by side, [B, n, H·d], and multiplied in one
    product of k × n × H·d instead of H of k × n × d: the same sums, in a larger matrix product.
    For keys and values split from the layer's projection, that layout is the projection's own
    (a view, no copy).
    """
    b, h, n, d = x.shape
    # A batched product of E [k, n] (expanded, not copied) with each [n, H·d], rather than
    # ``e @ x``: matmul would fold that into [H·d, n] · [n, k] and hand back X's gradient in an
    # [H·d, n] layout, which the layer's projection then transposes while joining the Q, K, V
    # gradients (BENCHMARKS.md, "Gradient layouts, and every reference pair measured exactly").
    # Here it comes back as [n, H·d].
    out = torch.bmm(e.expand(b, -1, -1), x.transpose(1, 2).reshape(b, n, h * d))  # (B, k, H·d)
    return out.view(b, -1, h, d).transpose(1, 2)
