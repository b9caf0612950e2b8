"""The non-causal Performer's sums, a block of positions at a time (``linear_attention.py``).

The factored form of linear attention with FAVOR+ features (Choromanski et al. 2021) needs φ(K)
and φ(Q), [len, m] each (m = 256 features: 4x the size of K), and autograd would keep them for
backward. :class:`FavorKeySums` makes the keys' [S, Z] and :class:`FavorQueries` the queries'
φ(Q) [S, Z] a block of positions at a time, and makes each block's features again for the
gradient, so that the memory beyond the inputs is the summary and one block's features.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from transformer.feature_maps import favor_exponent, favor_features, favor_features_backward


class FavorKeySums(torch.autograd.Function):
    """[S, Z] = Σ_j e^(-c) φ(K_j)[V_j, 1]ᵀ with FAVOR+ features, made a block of positions at a
    time and made again for the gradient: the non-causal Performer's keys without their [len, m]
    feature matrix.

    The factored form needs φ(K), [len, m] (m = 256 features: 4x the size of K), and autograd
    would keep it for backward. Here the features are made ``block`` positions at a time and
    summed into [S, Z] at once; backward makes each block's again (one more [len, d] x [d, m]
    product: ~12% more arithmetic at d = 64) instead of keeping them, so the memory beyond the
    inputs is [B, H, m, d + 1] and a block's features, which stay in the CPU's cache between
    the products that use them.

    c is the keys' stabiliser (``feature_maps.SequenceMax``): their largest exponent, per sequence
    and head, found as the blocks go (the sum so far rescaled by e^(c_old - c_new) when a block
    raises it) and held fixed by the gradient. Gradients (G = ∂L/∂SZ): ∂L/∂φ(K) = V1 Gᵀ,
    ∂L/∂V1 = φ(K) G; through φ as in :func:`~transformer.feature_maps.favor_features_backward`.
    ω gets none (a buffer).
    """

    @staticmethod
    def forward(ctx, k: Tensor, v1: Tensor, w: Tensor, keep: Tensor | None, block: int) -> Tensor:
        """k: [B, H, Tk, d], v1: [B, H, Tk, e] ([V, 1]), w: [m, d] (ω scaled by d^-1/4), keep:
        [B, 1, Tk, 1] (0 at padded keys) or None -> [S, Z] [B, H, m, e]."""
        sz, c = None, None
        for j in range(0, k.size(2), block):
            u = favor_exponent(k[:, :, j : j + block], w, False)  # (B, H, b, m)
            top = u.amax(-1, keepdim=True)  # (B, H, b, 1)
            pad = None if keep is None else keep[:, :, j : j + block] == 0
            if pad is not None:
                top.masked_fill_(pad, -math.inf)
            c_new = top.amax(-2, keepdim=True)  # (B, H, 1, 1)
            c_new = c_new if c is None else torch.maximum(c, c_new)
            c_new = torch.where(torch.isfinite(c_new), c_new, torch.zeros_like(c_new))  # no real key yet
            u -= c_new
            if pad is not None:
                u.masked_fill_(pad, -math.inf)
            part = u.exp_().mT @ v1[:, :, j : j + block]  # (B, H, m, e)
            # (c - c_new ≤ 0 once a real key is seen; before that the sum is 0, any factor does)
            sz = part if sz is None else sz.mul_((c - c_new).clamp_(max=0).exp_()).add_(part)
            c = c_new
        ctx.save_for_backward(k, v1, w, keep, c)
        ctx.block = block
        return sz

    @staticmethod
    def backward(ctx, grad_sz: Tensor) -> tuple[Tensor | None, ...]:
        k, v1, w, keep, c = ctx.saved_tensors
        block = ctx.block
        grad_k, grad_v1 = torch.empty_like(k), torch.empty_like(v1)
        for j in range(0, k.size(2), block):
            fk = favor_features(k[:, :, j : j + block], w, False, lambda top: c, _rows(keep, j, block))
            grad_v1[:, :, j : j + block] = fk @ grad_sz
            grad_fk = v1[:, :, j : j + block] @ grad_sz.mT  # (B, H, b, m)
            grad_k[:, :, j : j + block] = favor_features_backward(k[:, :, j : j + block], w, fk, grad_fk)
        return grad_k, grad_v1, None, None, None


class FavorQueries(torch.autograd.Function):
    """φ(Q) [S, Z] with FAVOR+ features, a block of queries at a time (made again for backward).

    Gradients (g = ∂L/∂ND, ND = φ(Q) SZ): ∂L/∂φ(Q) = g SZᵀ, ∂L/∂SZ = φ(Q)ᵀ g.
    """

    @staticmethod
    def forward(ctx, q: Tensor, sz: Tensor, w: Tensor, block: int) -> Tensor:
        """q: [B, H, Tq, d], sz: [B, H, m, e], w: [m, d] -> [B, H, Tq, e] (numerators, normalisers)."""
        num_den = torch.cat(
            [favor_features(q[:, :, i : i + block], w, True) @ sz for i in range(0, q.size(2), block)], dim=2
        )
        ctx.save_for_backward(q, sz, w)
        ctx.block = block
        return num_den

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, sz, w = ctx.saved_tensors
        block = ctx.block
        grad_q = torch.empty_like(q)
        grad_sz = torch.zeros_like(sz)  # (B, H, m, e)
        for i in range(0, q.size(2), block):
            fq = favor_features(q[:, :, i : i + block], w, True)  # (B, H, b, m)
            g = grad[:, :, i : i + block]  # (B, H, b, e)
            grad_sz += fq.transpose(-2, -1) @ g
            grad_q[:, :, i : i + block] = favor_features_backward(q[:, :, i : i + block], w, fq, g @ sz.mT)
        return grad_q, grad_sz, None, None


def _rows(keep: Tensor | None, start: int, block: int) -> Tensor | None:
    """``keep``'s rows ``start .. start + block`` (or None)."""
    return None if keep is None else keep[:, :, start : start + block]
