"""Feature maps φ for linear attention: sim(q, k) = φ(q)·φ(k) in place of exp(q·k / √d).

* :class:`EluFeatureMap`: φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, "Transformers are RNNs",
  equation (7)): positive, d features, no parameters. O(n·d).
* :class:`FavorFeatureMap`: FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with
  Performers"): positive orthogonal random features whose dot product is an unbiased estimate
  of the softmax kernel exp(q·k / √d). O(n·m·d) for m features.

Both are called as ``feature_map(x, is_query, stabiliser, keep)`` on [batch, heads, len, d_head]
and return [batch, heads, len, features]; ``redraw()`` is called by the attention once per
training forward pass (a no-op for elu+1). ``stabiliser`` (FAVOR+ keys only, see
:class:`SequenceMax` and :class:`RunningMax`) and ``keep`` (0 at padded keys, whose features are
then 0) are ignored by elu+1, which needs neither.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EluFeatureMap(nn.Module):
    """φ(x) = elu(x) + 1 (equation (7)): positive, so the normaliser φ(q)·Σφ(k) never vanishes."""

    def forward(
        self, x: Tensor, is_query: bool, stabiliser: object | None = None, keep: Tensor | None = None
    ) -> Tensor:
        """x: [..., len, d] -> φ(x) [..., len, d]; padded keys (``keep`` 0) are the caller's to zero."""
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
    error that falls as m grows. Both sides are stabilised by constants that cancel in
    attention's normalisation, as the paper's code does: a query by its own largest exponent;
    keys by the largest exponent over the keys a query sees with them, one constant for a whole
    sequence (:class:`SequenceMax`), or, causal, the largest so far, the state rescaled when it
    grows (:class:`RunningMax`). Without the keys' constant, at query and key norms of 32
    (d = 64) every key's exp(ω·x - |x|²/2) is below 1e-20 and the normaliser vanishes.

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

    def forward(
        self, x: Tensor, is_query: bool, stabiliser: object | None = None, keep: Tensor | None = None
    ) -> Tensor:
        """x: [..., len, d] -> φ(x) [..., len, m] (in x's dtype, fp32 in practice).

        stabiliser: keys only, the constant(s) their exponents are lowered by (:class:`SequenceMax`,
        :class:`RunningMax`); None: none. keep: [..., len, 1], 0 at padded keys: their φ is 0 and
        they take no part in the stabiliser.
        """
        return PositiveRandomFeatures.apply(x, self.scaled_omega(x.dtype), is_query, stabiliser, keep)

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
    def forward(
        ctx,
        x: Tensor,
        w: Tensor,
        is_query: bool,
        stabiliser: object | None = None,
        keep: Tensor | None = None,
    ) -> Tensor:
        """x: [..., len, d], w: [m, d] (ω scaled by d^-1/4) -> φ(x) [..., len, m]."""
        phi = favor_features(x, w, is_query, stabiliser, keep)
        ctx.save_for_backward(x, w, phi)
        return phi

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        x, w, phi = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        return favor_features_backward(x, w, phi, grad), None, None, None, None


def favor_exponent(x: Tensor, w: Tensor, is_query: bool) -> Tensor:
    """log φ(x) before the keys' stabiliser: x [..., len, d], w [m, d] -> [..., len, m].

    A query's is lowered by its own largest entry (so its largest feature is 1/√m); a key's is
    ω·x - s²|x|²/2 - log √m, for the caller to lower by a constant shared by the keys it sums.
    """
    u = x @ w.T  # (..., len, m)
    log_sqrt_m = 0.5 * math.log(w.size(0))
    if is_query:  # exp(u - |x|²/2 - max_i(u_i - |x|²/2)) = exp(u - max_i u_i): |x|² drops out
        u -= u.amax(-1, keepdim=True) + log_sqrt_m
    else:
        s2 = w.size(1) ** -0.5  # s², the square of ω's scale d^-1/4
        u -= (0.5 * s2) * (x * x).sum(-1, keepdim=True) + log_sqrt_m
    return u


def favor_features(
    x: Tensor, w: Tensor, is_query: bool, stabiliser: object | None = None, keep: Tensor | None = None
) -> Tensor:
    """φ(x) of :class:`PositiveRandomFeatures`, no autograd: x [..., len, d], w [m, d] -> [..., len, m].

    stabiliser: keys only: called with each key's largest exponent [..., len, 1] (-inf at padded
    keys), it returns the constant(s) to lower them by, broadcastable to [..., len, 1]. keep:
    [..., len, 1] or None, 0 at padded keys: their φ is exactly 0.
    """
    u = favor_exponent(x, w, is_query)
    pad = None if keep is None else keep == 0
    if stabiliser is not None and not is_query:
        top = u.amax(-1, keepdim=True)  # (..., len, 1)
        u -= stabiliser(top if pad is None else top.masked_fill(pad, -math.inf))
    if pad is not None:
        u.masked_fill_(pad, -math.inf)
    return u.exp_()


class SequenceMax:
    """The keys' stabiliser where a query sees the whole sequence: its largest exponent.

    Lowering every key's exponent by one constant c divides φ(q)·Σφ(k)v and φ(q)·Σφ(k) alike by
    e^c: the output is unchanged (and so is its gradient, c held fixed). c is taken per sequence
    and head over the real keys, as the Performer's code does, so that no key's features underflow
    for being small beside another sentence's. ``offset`` keeps the last c, [..., 1, 1].
    """

    def __init__(self) -> None:
        self.offset: Tensor | None = None

    def __call__(self, top: Tensor) -> Tensor:
        """top: [..., len, 1] each key's largest exponent (-inf where padded) -> c [..., 1, 1]."""
        c = top.amax(-2, keepdim=True)
        self.offset = torch.where(torch.isfinite(c), c, torch.zeros_like(c))  # no real key: 0
        return self.offset


class RunningMax:
    """The keys' stabiliser of causal attention: the largest exponent so far, one per chunk.

    A query at position i may only be stabilised by keys j ≤ i, so chunk c (``chunk`` positions)
    takes M_c = max(M_{c-1}, its keys' largest exponent), starting from ``before`` (the decoding
    state's, [..., 1, 1]) or -inf; sums made under M_{c-1} are carried into chunk c multiplied by
    e^(M_{c-1} - M_c) ≤ 1 (the running rescale of ``linear_attention.causal_linear``). Each
    query's numerator and normaliser then share its chunk's e^(-M_c), which cancels.
    ``chunks`` keeps the M_c, [..., n_chunks].
    """

    def __init__(self, chunk: int, before: Tensor | None = None) -> None:
        self.chunk, self.before = chunk, before
        self.chunks: Tensor | None = None

    def __call__(self, top: Tensor) -> Tensor:
        """top: [..., len, 1] each key's largest exponent -> M of each key's chunk, [..., len, 1]."""
        t = top.size(-2)
        nc = math.ceil(t / self.chunk)
        padded = F.pad(top[..., 0], (0, nc * self.chunk - t), value=-math.inf)  # (..., nc * C)
        m = padded.unflatten(-1, (nc, self.chunk)).amax(-1)  # (..., nc)
        if self.before is not None:
            m[..., 0] = torch.maximum(m[..., 0], self.before[..., 0, 0])
        m = m.cummax(-1).values
        self.chunks = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        return self.chunks.repeat_interleave(self.chunk, -1)[..., :t, None]


def favor_features_backward(x: Tensor, w: Tensor, phi: Tensor, grad: Tensor) -> Tensor:
    """∂L/∂x = (g ⊙ φ) w - s² x Σ_i (g ⊙ φ)_i, for φ = :func:`favor_features` (x, w) and g = ∂L/∂φ.

    x: [..., len, d], w: [m, d], phi and grad: [..., len, m] -> [..., len, d].
    """
    g_phi = grad * phi  # (..., len, m)
    s2 = w.size(1) ** -0.5
    return torch.addcmul(g_phi @ w, x, g_phi.sum(-1, keepdim=True), value=-s2)  # (..., len, d)
