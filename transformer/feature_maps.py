"""Feature maps φ for linear attention: sim(q, k) = φ(q)·φ(k) in place of exp(q·k / √d).

* :class:`EluFeatureMap`: φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, "Transformers are RNNs",
  equation (7)): positive, d features, no parameters. O(n·d).
* :class:`FavorFeatureMap`: FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with
  Performers"): positive orthogonal random features whose dot product is an unbiased estimate
  of the softmax kernel exp(q·k / √d). O(n·m·d) for m features.

Both are called as ``feature_map(x, is_query)`` on [batch, heads, len, d_head] and return
[batch, heads, len, features]; ``redraw()`` is called by the attention once per training
forward pass (a no-op for elu+1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EluFeatureMap(nn.Module):
    """φ(x) = elu(x) + 1 (equation (7)): positive, so the normaliser φ(q)·Σφ(k) never vanishes."""

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        return F.elu(x).add_(1.0)  # in place: elu's gradient is computed from x, not its output

    def redraw(self) -> None:
        """Nothing to redraw."""


def orthogonal_gaussian(m: int, d: int, generator: torch.Generator | None = None) -> Tensor:
    """[m, d] rows ω_i, each marginally N(0, I_d), orthogonal within blocks of d rows.

    Orthogonal random features (Choromanski et al. 2021, section 2.4): each block is the Q of a
    Gaussian matrix's QR decomposition, whose rows are then given the lengths of independent
    Gaussian vectors (chi-distributed), so each row is exactly N(0, I_d) in distribution and the
    kernel estimate stays unbiased, with a lower variance than independent rows.
    """
    blocks = []
    for start in range(0, m, d):
        q, r = torch.linalg.qr(torch.randn(d, d, generator=generator))
        q = q * torch.sign(torch.diagonal(r))  # uniformly distributed (Haar) only with diag(R) > 0
        blocks.append(q.T[: min(d, m - start)])  # orthonormal rows, each uniform on the sphere
    omega = torch.cat(blocks)  # (m, d)
    lengths = torch.randn(m, d, generator=generator).norm(dim=1)  # chi(d)
    return omega * lengths[:, None]


class FavorFeatureMap(nn.Module):
    """Positive random features for the softmax kernel (FAVOR+, Lemma 1 and their equation (5)).

    exp(x·y) = E_ω[exp(ω·x - |x|²/2) · exp(ω·y - |y|²/2)], ω ~ N(0, I_d); with x and y the query
    and key scaled by d^(-1/4) this is exp(q·k / √d), softmax's kernel. So

        φ(x) = exp(ω_i·x - |x|²/2)_{i=1..m} / √m

    makes φ(q)·φ(k) an unbiased estimate of it, positive (unlike sin/cos features), with an
    error that falls as m grows. Queries are stabilised by their own largest exponent, which
    cancels in attention's normalisation; keys are not (a constant shared by all keys would have
    to be known before decoding sees them): ω·x - |x|²/2 ≤ |ω|²/2 bounds their exponent.

    Args:
        d_head: the width d of queries and keys.
        n_features: m, the number of random features.
        redraw_interval: training forward passes between fresh draws of ω (0: never); a fresh
            draw keeps the model from fitting one sample of the features. ω is a buffer, so the
            checkpoint keeps the draw that inference uses.
    """

    def __init__(self, d_head: int, n_features: int, redraw_interval: int = 1000) -> None:
        super().__init__()
        self.d_head = d_head
        self.n_features = n_features
        self.redraw_interval = redraw_interval
        self.calls = 0  # training forward passes since the last draw
        self.register_buffer("omega", orthogonal_gaussian(n_features, d_head))  # (m, d)

    def redraw(self) -> None:
        """Draws ω afresh every ``redraw_interval`` calls (call once per training forward pass)."""
        if self.redraw_interval and self.calls >= self.redraw_interval:
            new = orthogonal_gaussian(self.n_features, self.d_head)
            self.omega.copy_(new.to(self.omega.device))
            self.calls = 0
        self.calls += 1

    def forward(self, x: Tensor, is_query: bool) -> Tensor:
        """x: [..., len, d] -> φ(x) [..., len, m] (in x's dtype, fp32 in practice)."""
        return PositiveRandomFeatures.apply(x, self.scaled_omega(x.dtype), is_query)

    def scaled_omega(self, dtype: torch.dtype) -> Tensor:
        """ω d^-1/4, [m, d]: exp(q·k/√d) = exp((q d^-1/4)·(k d^-1/4)), so the d^-1/4 goes into ω."""
        return self.omega.to(dtype) * self.d_head**-0.25


class PositiveRandomFeatures(torch.autograd.Function):
    """φ(x) = exp(x·w_i - s²|x|²/2 - c)_{i=1..m} / √m for w = s·ω, s = d^-1/4, with its gradient.

    c = 0 for keys; for a query, its largest exponent (a constant of that query, held fixed by
    the gradient like any stabiliser: it cancels in attention's normalisation). Written out,
    autograd would keep the [len, m] product, its exponent and the exp for backward, and run five
    elementwise passes over them; here one [len, m] product is overwritten in place, and the
    gradient needs only φ and x:

        ∂L/∂x = (g ⊙ φ) w - s² x Σ_i (g ⊙ φ)_i        (∂φ_i/∂x = φ_i (w_i - s² x)),

    a matrix product and one pass. ω is a buffer (drawn, never trained): it gets no gradient.
    """

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, is_query: bool) -> Tensor:
        """x: [..., len, d], w: [m, d] (ω scaled by d^-1/4) -> φ(x) [..., len, m]."""
        phi = favor_features(x, w, is_query)
        ctx.save_for_backward(x, w, phi)
        return phi

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None]:
        x, w, phi = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return favor_features_backward(x, w, phi, grad), None, None


def favor_features(x: Tensor, w: Tensor, is_query: bool) -> Tensor:
    """φ(x) of :class:`PositiveRandomFeatures`, no autograd: x [..., len, d], w [m, d] -> [..., len, m]."""
    u = x @ w.T  # (..., len, m)
    log_sqrt_m = 0.5 * math.log(w.size(0))
    if is_query:  # exp(u - |x|²/2 - max_i(u_i - |x|²/2)) = exp(u - max_i u_i): |x|² drops out
        u -= u.amax(-1, keepdim=True) + log_sqrt_m
    else:
        s2 = w.size(1) ** -0.5  # s², the square of ω's scale d^-1/4
        u -= (0.5 * s2) * (x * x).sum(-1, keepdim=True) + log_sqrt_m
    return u.exp_()


def favor_features_backward(x: Tensor, w: Tensor, phi: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x = (g ⊙ φ) w - s² x Σ_i (g ⊙ φ)_i, for φ = :func:`favor_features` (x, w) and g = ∂L/∂φ.

    x: [..., len, d], w: [m, d], phi and grad: [..., len, m] -> [..., len, d].
    """
    g_phi = grad * phi  # (..., len, m)
    s2 = w.size(1) ** -0.5
    return torch.addcmul(g_phi @ w, x, g_phi.sum(-1, keepdim=True), value=-s2)  # (..., len, d)
