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
:class:`FavorKeySums` and :class:`FavorQueries` make them a block of positions at a time, and
again for backward.

Cross-attention's keys and values are the source's: :meth:`LinearAttention.summarise` reduces them
to [S, Z] once, when the source is encoded, and each decoding step only multiplies its queries'
features with it (:meth:`LinearAttention.attend_summary`), O(m·d) a query whatever the source's
length.

FAVOR+ keys are stabilised by a constant shared by the keys a query sees (``feature_maps``), and
the normaliser φ(Q_i)·Z_i, a sum of positive terms, is kept from 0 only by the smallest normal
float (:data:`EPS`): an absolute epsilon of 1e-6 was larger than the whole normaliser of
large-norm queries and keys, and the output collapsed to 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.attention import SummarisingMechanism
from transformer.favor_sums import FavorKeySums, FavorQueries
from transformer.feature_maps import EluFeatureMap, FavorFeatureMap, RunningMax, SequenceMax
from transformer.registry import Mechanism, Setting, register

# The normaliser's floor: it is a sum of positive terms, 0 only where every one underflows, and
# then the numerator is 0 too; the floor keeps that 0/0 out and changes nothing else.
EPS = torch.finfo(torch.float32).tiny
# Values of φ that the blocked Performer (:class:`BlockedFavor`) makes at a time: 1 MiB in fp32,
# so that a block's features stay in the CPU's cache between the products that use them.
BLOCK_VALUES = 1 << 18
BLOCK_MIN_ROWS = 16  # ... but at least this many positions a block (many sentences x heads)


class LinearState:
    """The RNN state of causal linear attention while decoding: S = Σ φ(k)vᵀ and Z = Σ φ(k).

    Kept as one tensor ``sz`` [rows, heads, m, d_v + 1] whose last column is Z (the sums of
    [v, 1], see :func:`causal_linear`); ``s`` [rows, heads, m, d_v] and ``z`` [rows, heads, m]
    are views of it. None before the first step. Its size does not grow with the number of steps.
    FAVOR+ also keeps ``offset`` [rows, heads, 1, 1], the keys' stabiliser M that ``sz`` is
    scaled by (Σ e^(-M) φ(k)[v, 1]ᵀ; ``feature_maps.RunningMax``).
    """

    def __init__(self) -> None:
        self.sz: Tensor | None = None
        self.offset: Tensor | None = None

    @property
    def s(self) -> Tensor | None:
        return None if self.sz is None else self.sz[..., :-1]

    @property
    def z(self) -> Tensor | None:
        return None if self.sz is None else self.sz[..., -1]

    def select(self, rows: Tensor) -> None:
        """Keeps rows ``rows`` ([new_rows] indices) in that order (beam search)."""
        if self.sz is not None:
            self.sz = self.sz.index_select(0, rows)
        if self.offset is not None:
            self.offset = self.offset.index_select(0, rows)


def with_ones(v: Tensor) -> Tensor:
    """[..., T, d] -> [..., T, d + 1]: v with a column of ones, so that Σ φ(k)[v, 1]ᵀ = [S, Z] and
    one product φ(q)ᵀ[S, Z] gives the numerator and the normaliser together."""
    return torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)


def normalise(num_den: Tensor) -> Tensor:
    """[..., d + 1] -> [..., d]: the numerator's columns over the last (the normaliser)."""
    return Normalise.apply(num_den)


class Normalise(torch.autograd.Function):
    """out = num / den for [num, den] = [..., d + 1], with the gradient written as out's.

    One reciprocal r = 1 / den per row, then a product. Autograd's gradient of a reciprocal is
    -r², which overflows fp32 once den < 1e-19, as FAVOR+'s normaliser may be at large norms (it
    is stabilised by the largest key, not by the query's own): here ∂L/∂num = g r and ∂L/∂den =
    -(g · out) r, each finite where r is.
    """

    @staticmethod
    def forward(ctx, num_den: Tensor) -> Tensor:
        r = num_den[..., -1:].clamp_min(EPS).reciprocal()  # (..., 1)
        out = num_den[..., :-1] * r
        ctx.save_for_backward(out, r)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        out, r = ctx.saved_tensors
        grad_num = grad * r
        grad_den = -(grad_num * out).sum(-1, keepdim=True)  # (..., 1)
        return torch.cat([grad_num, grad_den], dim=-1)


class ExclusivePrefixSum(torch.autograd.Function):
    """out[:, :, i] = Σ_{j<i} x[:, :, j] along dim 2 (the chunks), by one add per chunk.

    ``torch.cumsum`` over a dimension that is not the last runs 4-5x slower than a copy of the
    same tensor on the CPU (measured: 49 ms against 10 for [1, 8, 64, 256, 64]), and its autograd
    adds two flips; a loop over the chunks costs about a copy, forward and backward
    (∂L/∂x_j = Σ_{i>j} ∂L/∂out_i, the suffix sums).

    With ``decay`` [B, H, nc] (FAVOR+'s running rescale, ``feature_maps.RunningMax``), each sum is
    carried into chunk i multiplied by decay[i] = e^(M_{i-1} - M_i): out[i] = (out[i-1] + x[i-1])
    · decay[i], so out[i] = Σ_{j<i} x[j] e^(M_j - M_i); backward, ∂L/∂x_j = (∂L/∂x_{j+1} +
    ∂L/∂out_{j+1}) · decay[j+1]. The decay is a stabiliser, held fixed (no gradient).
    """

    @staticmethod
    def forward(ctx, x: Tensor, decay: Tensor | None = None) -> Tensor:
        """x: [B, H, nc, ...], decay: [B, H, nc] or None -> the exclusive prefix sums over nc."""
        d = None if decay is None else decay.view(*decay.shape, *(1,) * (x.dim() - 3))
        out = torch.empty_like(x)
        out[:, :, 0].zero_()
        for i in range(1, x.size(2)):
            torch.add(out[:, :, i - 1], x[:, :, i - 1], out=out[:, :, i])
            if d is not None:
                out[:, :, i] *= d[:, :, i]
        ctx.save_for_backward(d)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (d,) = ctx.saved_tensors
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        out[:, :, -1].zero_()
        for i in range(grad.size(2) - 2, -1, -1):
            torch.add(out[:, :, i + 1], grad[:, :, i + 1], out=out[:, :, i])
            if d is not None:
                out[:, :, i] *= d[:, :, i + 1]
        return out, None


def causal_linear(
    fq: Tensor,
    fk: Tensor,
    v1: Tensor,
    sz0: Tensor | None,
    chunk: int,
    scales: Tensor | None = None,
    scale0: Tensor | None = None,
    need_state: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Causal linear attention by prefix sums, ``chunk`` positions at a time.

    Args:
        fq, fk: φ(Q), φ(K), [B, H, T, m]; v1: [V, 1] (:func:`with_ones`), [B, H, T, d + 1].
        sz0: the state [S, Z] before these positions, [B, H, m, d + 1], or None.
        chunk: positions per chunk C; memory O(T/C · m·d + T·C), time O(T·(m·d + C·(m + d))).
        scales: FAVOR+: the keys' stabiliser M_c of each chunk, [B, H, nc] (``fk`` of chunk c is
            e^(-M_c) φ(k)), nondecreasing; the sums of earlier chunks are rescaled to it. None: 0.
        scale0: the stabiliser ``sz0`` was made under, [B, H, 1, 1] (None: 0).
        need_state: whether the state after the last position is wanted (decoding) or not
            (training: with one chunk and no ``sz0``, no [B, H, m, d + 1] sum is then made at all,
            where the m × (d + 1) state of each sequence outweighs its T × C triangle: at T = 16
            and Performer's m = 256, 65 times).

    Returns:
        Σ_{j≤i} (φ(q_i)·φ(k_j)) [v_j, 1], [B, H, T, d + 1] (numerators and normalisers, for
        :func:`normalise`; each query's pair scaled by its chunk's e^(-M_c)), and the state [S, Z]
        after the last position (scaled by the last chunk's e^(-M)), or None without
        ``need_state``.
    """
    b, h, t, m = fq.shape
    c = min(chunk, t)
    nc = math.ceil(t / c)
    pad = nc * c - t
    fq_, fk_, v1_ = (
        (F.pad(x, (0, 0, 0, pad)) if pad else x).view(b, h, nc, c, x.size(-1)) for x in (fq, fk, v1)
    )
    a = (fq_ @ fk_.transpose(-2, -1)).tril_()  # (B, H, nc, C, C): φ(q_i)·φ(k_j), j ≤ i in the chunk
    if nc == 1 and sz0 is None:  # nothing before this chunk: the triangle is the whole sum
        num_den = (a @ v1_).view(b, h, c, -1)[:, :, :t]  # (B, H, T, d+1)
        return num_den, (fk_.transpose(-2, -1) @ v1_)[:, :, -1] if need_state else None
    kv = fk_.transpose(-2, -1) @ v1_  # (B, H, nc, m, d+1): each chunk's Σ φ(k)[v, 1]ᵀ
    # The sums over all earlier chunks (exclusive prefix sums): equation (10) across chunks.
    decay = None
    if scales is not None and nc > 1:  # e^(M_{c-1} - M_c): earlier sums rescaled to chunk c's M
        decay = torch.cat([torch.ones_like(scales[..., :1]), (scales[..., :-1] - scales[..., 1:]).exp()], -1)
    before = ExclusivePrefixSum.apply(kv, decay) if nc > 1 else torch.zeros_like(kv)
    if sz0 is not None:
        if scales is not None:  # sz0 is scaled by e^(-M_0) of the state: to each chunk's
            m0 = torch.zeros_like(scales[..., :1]) if scale0 is None else scale0[..., 0]  # (B, H, 1)
            sz0 = sz0[:, :, None] * (m0 - scales).exp()[..., None, None]  # (B, H, nc, m, d+1)
        else:
            sz0 = sz0[:, :, None]
        before = before + sz0
    num_den = (fq_ @ before).add_(a @ v1_).view(b, h, nc * c, -1)[:, :, :t]  # (B, H, T, d+1)
    return num_den, before[:, :, -1] + kv[:, :, -1] if need_state else None


class LinearAttention(SummarisingMechanism):
    """φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1) (equations (5) and (6)) behind the mechanisms' signature.

    Encoder self-attention and cross-attention use the whole-sequence summary [S, Z]
    (:meth:`summarise`, then :meth:`attend_summary`; FAVOR+ features through
    :class:`FavorKeySums` and :class:`FavorQueries`, unless the weights are asked for); decoder
    self-attention the causal prefix sums, or with a :class:`LinearState` the RNN form.

    Args:
        feature_map: ``feature_maps.EluFeatureMap`` (linear) or ``FavorFeatureMap`` (Performer).
        chunk: positions per chunk of the causal prefix sums.
    """

    def __init__(self, feature_map: nn.Module, chunk: int = 64) -> None:
        super().__init__()
        self.feature_map = feature_map
        self.chunk = chunk

    @property
    def favor(self) -> bool:
        return isinstance(self.feature_map, FavorFeatureMap)

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
        """The mechanisms' signature (``attention.AttentionMechanism``); mask: key padding [B, 1, 1, Tk]."""
        if state is not None and not causal:
            raise ValueError("a decoding state is for causal self-attention")
        if not causal and not need_weights:
            return self.attend_summary(q, self.summarise(k, v, mask)).to(v.dtype), None
        if self.training:
            self.feature_map.redraw()
        dtype = v.dtype
        wide = torch.promote_types(dtype, torch.float32)  # fp32 at least (fp64 stays fp64)
        with torch.autocast(q.device.type, enabled=False):
            keep = None if mask is None else mask.transpose(-2, -1).to(wide)  # (B, 1, Tk, 1)
            if not self.favor:
                stabiliser = None
            elif causal:
                stabiliser = RunningMax(min(self.chunk, k.size(2)), None if state is None else state.offset)
            else:
                stabiliser = SequenceMax()
            fq = self.feature_map(q.to(wide), True)  # (B, H, Tq, m)
            fk = self.feature_map(k.to(wide), False, stabiliser, keep)  # (B, H, Tk, m)
            if keep is not None and not self.favor:
                fk = fk * keep  # padded keys add nothing
            v1 = with_ones(v.to(wide))  # (B, H, Tk, d+1)
            one_step = state is not None and state.sz is not None and q.size(2) == 1
            if causal and one_step and not torch.is_grad_enabled():  # decoding: the state in place
                num_den = self._decoding_step(fq, fk, v1, state, stabiliser.chunks if self.favor else None)
            elif causal:
                sz0 = state.sz if state is not None else None
                scales = stabiliser.chunks if self.favor else None
                scale0 = None if state is None else state.offset
                num_den, sz = causal_linear(fq, fk, v1, sz0, self.chunk, scales, scale0, state is not None)
                if state is not None:
                    state.sz = sz
                    if scales is not None:
                        state.offset = scales[..., -1:, None]  # (B, H, 1, 1): the last chunk's M
            else:
                sz = fk.transpose(-2, -1) @ v1  # (B, H, m, d+1): [Σ_j φ(K_j) V_jᵀ, Σ_j φ(K_j)]
                num_den = fq @ sz  # (B, H, Tq, d+1)
            out = normalise(num_den)  # (B, H, Tq, d)
            if need_weights and causal and self.favor:  # every key under one stabiliser, the last M
                m = stabiliser.chunks  # (B, H, nc)
                c = min(self.chunk, k.size(2))
                fk = fk * (m - m[..., -1:]).exp().repeat_interleave(c, -1)[..., : k.size(2), None]
            weights = self.implied_weights(fq, fk, causal) if need_weights else None
        return out.to(dtype), weights

    @staticmethod
    def _decoding_step(
        fq: Tensor, fk: Tensor, v1: Tensor, state: LinearState, scale: Tensor | None
    ) -> Tensor:
        """One decoding position against the state, which is updated in place: [S, Z] += φ(k)[v, 1]ᵀ.

        What :func:`causal_linear` computes for one position, without its copies of the state (a
        beam of hypotheses holds rows × heads × m × (d + 1) of it: 0.8 MiB a hypothesis of the
        recipe's model with Performer's 256 features): beam search's memory is the state, not ~4
        of it.

        Args:
            fq, fk: φ(q), φ(k) of the position, [B, H, 1, m]; v1: [v, 1], [B, H, 1, d + 1].
            state: ``sz`` [B, H, m, d + 1] (made by an earlier step, owned by the state).
            scale: FAVOR+: this position's stabiliser M, [B, H, 1] (``fk`` is e^(-M) φ(k)); the
                state, made under ``state.offset``, is rescaled to it. None: no stabiliser.

        Returns:
            φ(q)ᵀ[S, Z], [B, H, 1, d + 1] (for :func:`normalise`).
        """
        sz = state.sz
        if scale is not None:
            sz.mul_((state.offset - scale[..., None]).exp())  # (B, H, 1, 1): e^(M_old - M)
            state.offset = scale[..., -1:, None]
        b, h, m, e = sz.shape
        sz.view(b * h, m, e).baddbmm_(fk.reshape(b * h, 1, m).transpose(1, 2), v1.reshape(b * h, 1, e))
        return fq @ sz

    def summarise(self, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor]:
        """The keys and values reduced to what every query needs: ([S, Z],), [B, H, m, d + 1].

        k, v: [B, H, Tk, d]; mask: key padding [B, 1, 1, Tk] or None. In fp32 at least, whatever
        the autocast (a sum of Tk terms). Cross-attention makes it once per source
        (``MultiHeadAttention.source``); O(Tk·m·d).
        """
        if self.training:
            self.feature_map.redraw()
        wide = torch.promote_types(v.dtype, torch.float32)
        with torch.autocast(k.device.type, enabled=False):
            k, v1 = k.to(wide), with_ones(v.to(wide))
            keep = None if mask is None else mask.transpose(-2, -1).to(wide)  # (B, 1, Tk, 1)
            if self.favor:
                w = self.feature_map.scaled_omega(wide)  # (m, d)
                return (FavorKeySums.apply(k, v1, w, keep, self._block(k, w)),)
            fk = self.feature_map(k, False)  # (B, H, Tk, m)
            if keep is not None:
                fk = fk * keep
            return (fk.transpose(-2, -1) @ v1,)  # (B, H, m, d+1): [Σ_j φ(K_j) V_jᵀ, Σ_j φ(K_j)]

    def attend_summary(self, q: Tensor, summary: tuple[Tensor]) -> Tensor:
        """φ(Q)[S, Z], normalised: q [B, H, Tq, d], ``summary`` from :meth:`summarise` (its B the
        same) -> [B, H, Tq, d] in q's dtype. O(Tq·m·d), whatever the number of keys summarised."""
        (sz,) = summary
        with torch.autocast(q.device.type, enabled=False):
            qw = q.to(sz.dtype)
            if self.favor:
                w = self.feature_map.scaled_omega(sz.dtype)
                num_den = FavorQueries.apply(qw, sz, w, self._block(qw, w))
            else:
                num_den = self.feature_map(qw, True) @ sz
            return normalise(num_den).to(q.dtype)

    @staticmethod
    def _block(x: Tensor, w: Tensor) -> int:
        """Positions of x [B, H, T, d] whose features the blocked Performer makes at a time."""
        return max(BLOCK_MIN_ROWS, BLOCK_VALUES // (x.size(0) * x.size(1) * w.size(0)))

    @staticmethod
    def implied_weights(fq: Tensor, fk: Tensor, causal: bool) -> Tensor:
        """The normalised rows φ(Q_i)·φ(K_j) / Σ_j φ(Q_i)·φ(K_j), [B, H, Tq, Tk]: n × n, for pictures only."""
        a = fq @ fk.transpose(-2, -1)
        if causal:
            a = a.tril(diagonal=a.size(-1) - a.size(-2))
        return a / a.sum(-1, keepdim=True).clamp_min(EPS)

    def new_state(self, max_steps: int) -> LinearState:
        """An empty RNN state; its size does not depend on ``max_steps``."""
        return LinearState()


register(
    Mechanism(
        "linear",
        build=lambda cfg, d_head, dropout: LinearAttention(EluFeatureMap()),
        has_weights=False,
    )
)
register(
    Mechanism(
        "performer",
        build=lambda cfg, d_head, dropout: LinearAttention(
            FavorFeatureMap(d_head, cfg.features, cfg.redraw_interval)
        ),
        settings=(
            Setting("features", 256, "performer: random features m", minimum=1),
            Setting(
                "redraw_interval",
                1000,
                "performer: training forward passes between redraws; 0 never",
                minimum=0,
            ),
        ),
        has_weights=False,
    )
)
