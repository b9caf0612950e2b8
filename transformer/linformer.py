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

In self-attention the sequence is projected first, as equation (7) groups it: E (x W_K) =
(E x) W_K, so its attention layer (:class:`LinformerSelfAttention`, which the registry builds for
it) multiplies W_K and W_V with the k rows of E x and F x (``compress``) instead of the n rows of
x, and never forms the n keys and values: two thirds of its input projection saved, and their
n × d_model activations. That is where n > k (``compresses``); a shorter sequence has fewer keys
than projected rows, and takes the usual path.

Encoder self-attention and cross-attention (the encoder output projected to k, once per source:
``summarise``, held in the decoding state as softmax's K/V are). Not decoder
self-attention: every one of the k projected keys mixes all n positions, later ones included,
so it cannot be causal (``mechanisms.REFUSED``). No decoding state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.attention import (
    DecodingState,
    MultiHeadAttention,
    ScaledDotProduct,
    SummarisingMechanism,
    scaled_dot_product_attention,
    split_heads,
)
from transformer.registry import Mechanism, Setting, register


class LinformerAttention(SummarisingMechanism):
    """softmax(Q (E K)ᵀ/√d)(F V) behind the mechanisms' signature (``attention.AttentionMechanism``).

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
        self.kernel = ScaledDotProduct()  # equation (1) over the projected keys

    def _columns(self, n: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """E[:, :n] and F[:, :n] in ``dtype``, [k, n] each; a sequence past ``max_length`` refused."""
        if n > self.max_length:
            raise ValueError(
                f"linformer: {n} keys, but its projections cover attention.max_length={self.max_length}"
            )
        if n == self.max_length:  # the whole matrices: no slice (its backward would copy them)
            return self.e.to(dtype), self.f.to(dtype)
        return self.e[:, :n].to(dtype), self.f[:, :n].to(dtype)

    def project_sequence(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """E K and F V, [B, H, k, d] each, from keys and values [B, H, n, d]; padded ones zeroed."""
        if mask is not None:
            keep = mask.transpose(-2, -1).to(k.dtype)  # (B, 1, n, 1)
            k, v = k * keep, v * keep
        e, f = self._columns(k.size(2), k.dtype)
        return _across_heads(e, k), _across_heads(f, v)  # (B, H, k, d): equation (7)'s E K and F V

    def summarise(self, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Cross-attention's source reduced once, when it is encoded: (E K, F V), [B, H, k, d] each,
        from its keys and values [B, H, n, d] (``mask``: key padding [B, 1, 1, n] or None).
        Each decoding step then attends over k rows, not n (:meth:`attend_summary`)."""
        return self.project_sequence(k, v, mask)

    def attend_summary(self, q: Tensor, summary: tuple[Tensor, Tensor]) -> Tensor:
        """softmax(Q (E K)ᵀ/√d)(F V): q [B, H, Tq, d], ``summary`` from :meth:`summarise` -> [B, H, Tq, d]."""
        pk, pv = summary
        return self.kernel(q, pk, pv, dropout_p=self.dropout if self.training else 0.0)

    def compresses(self, n: int) -> bool:
        """Whether self-attention over n positions goes through ``compress``: where the sequence
        is longer than the k projected rows. W_K and W_V then multiply k rows instead of n; with
        n ≤ k (translation's sentences, against k = 64) the n keys and values themselves are
        fewer rows, and E K, F V are projected from them."""
        return n > self.projected_length

    def compress(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """What self-attention's E K and F V need, from the layer's inputs x [B, n, d_model].

        Equation (7) projects the sequence of the inputs before their W_K, W_V: with padded rows
        of x zeroed (x̃) and K = x̃ W_Kᵀ + keep b_Kᵀ,

            E K = (E x̃) W_Kᵀ + (E keep) b_Kᵀ,

        the same products reassociated, with W_K applied to k rows instead of n. Returns E x̃ and
        F x̃, [B, k, d_model] each, and E keep and F keep, [B or 1, k, 1] each (the weight that
        each projected row gives the bias), for :class:`LinformerSelfAttention` to finish with W_K, W_V.
        """
        b, n, _ = x.shape
        e, f = self._columns(n, x.dtype)
        if mask is None:
            e_keep, f_keep = e.sum(1, keepdim=True)[None], f.sum(1, keepdim=True)[None]  # (1, k, 1)
        else:
            keep = mask[:, 0, 0, :, None].to(x.dtype)  # (B, n, 1): 1 at real keys
            x = x * keep
            e_keep, f_keep = e @ keep, f @ keep  # (B, k, 1)
        # A batched product with E expanded, as in _across_heads: x's gradient comes back [n, d_model].
        return torch.bmm(e.expand(b, -1, -1), x), torch.bmm(f.expand(b, -1, -1), x), e_keep, f_keep

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
        P·F [B, H, Tq, n] over the original positions that the output implies (n × n: pictures only).
        """
        _refuse_causal(causal, state)
        pk, pv = self.project_sequence(k, v, mask)
        return self.attend_projected(q, pk, pv, k.size(2), mask, need_weights)

    def attend_projected(
        self, q: Tensor, pk: Tensor, pv: Tensor, n: int, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(Q (E K)ᵀ/√d)(F V) from E K, F V [B, H, k, d] of n keys (``mask`` their padding)."""
        p = self.dropout if self.training else 0.0
        if not need_weights:
            # Equation (1) over the k projected keys and values, by softmax attention's own path:
            # fused where faster, and then the n × k weights are not kept for the backward.
            return self.kernel(q, pk, pv, dropout_p=p), None
        out, weights = scaled_dot_product_attention(q, pk, pv, dropout_p=p)  # weights (B, H, Tq, k)
        implied = weights @ self.f[:, :n].to(weights.dtype)  # (B, H, Tq, n)
        if mask is not None:
            implied = implied * mask[:, :, 0, None, :].to(implied.dtype)
        return out, implied


class LinformerSelfAttention(MultiHeadAttention):
    """Multi-head self-attention with Linformer's mechanism, the sequence projected first where
    n > k (``LinformerAttention.compresses``): ``compress`` gives E x and F x, [B, k, d_model],
    and W_K, W_V then project k rows, not n (the module docstring says why that is its E K and
    F V). Its parameters are ``MultiHeadAttention``'s and the mechanism's E and F."""

    mechanism: LinformerAttention

    def attend(
        self, x: Tensor, mask: Tensor | None, state: DecodingState | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        linformer = self.mechanism
        if not linformer.compresses(x.size(1)):
            return super().attend(x, mask, state, need_weights)
        _refuse_causal(self.causal, state)
        b_q, b_k, b_v = self.in_proj.bias.view(3, -1).unbind(0)
        ex, fx, e_keep, f_keep = linformer.compress(x, mask)  # (B, k, D) x2, (B or 1, k, 1) x2
        q, pk, pv = _RowBlockProjections.apply(self.in_proj.weight, x, ex, fx)  # x W_Qᵀ, (E x) W_Kᵀ, ...
        q = split_heads(q + b_q.to(q.dtype), self.n_heads)  # (B, H, n, Dh)
        pk = split_heads(pk + (e_keep * b_k).to(pk.dtype), self.n_heads)  # (B, H, k, Dh): E K
        pv = split_heads(pv + (f_keep * b_v).to(pv.dtype), self.n_heads)  # F V
        return linformer.attend_projected(q, pk, pv, x.size(1), mask, need_weights)


def _refuse_causal(causal: bool, state: object | None) -> None:
    if causal or state is not None:
        raise ValueError("linformer attention cannot be causal: every projected key mixes all positions")


class _RowBlockProjections(torch.autograd.Function):
    """``x_i W_iᵀ`` for inputs x_0 .. x_{m-1} [..., D] and the m row blocks W_i [D', D] of one
    matrix W [m·D', D] (the Q, K, V rows of the layer's ``in_proj``).

    Its backward writes each block's gradient into W's one gradient [m·D', D] as it computes it.
    Through m views of W, autograd would hold the m blocks' gradients until the last is computed,
    and then their stack as well: m·D'·D more floats at the end of every backward.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, weight: Tensor, *xs: Tensor) -> tuple[Tensor, ...]:
        ctx.save_for_backward(weight, *xs)
        return tuple(F.linear(x, w) for x, w in zip(xs, weight.unflatten(0, (len(xs), -1)), strict=True))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: torch.autograd.function.FunctionCtx, *grads: Tensor) -> tuple[Tensor | None, ...]:
        weight, *xs = ctx.saved_tensors
        blocks = weight.unflatten(0, (len(xs), -1))
        grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[0] else None
        grad_xs: list[Tensor | None] = []
        for i, (x, g, w) in enumerate(zip(xs, grads, blocks, strict=True)):
            # g is in the dtype the forward computed in (bf16 under autocast); x and W as given.
            if grad_weight is not None:
                block = grad_weight.unflatten(0, (len(xs), -1))[i]  # (D', D), a view
                g_rows, x_rows = g.reshape(-1, g.size(-1)), x.reshape(-1, x.size(-1)).to(g.dtype)
                if g.dtype == block.dtype:
                    torch.mm(g_rows.t(), x_rows, out=block)
                else:
                    block.copy_(g_rows.t() @ x_rows)
            grad_xs.append(g @ w.to(g.dtype) if ctx.needs_input_grad[i + 1] else None)
        return (grad_weight, *grad_xs)


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


register(
    Mechanism(
        "linformer",
        build=lambda cfg, d_head, dropout: LinformerAttention(cfg.projected_length, cfg.max_length, dropout),
        settings=(
            Setting("projected_length", 64, "linformer: k, the keys and values are projected to", minimum=1),
            Setting("max_length", 1024, "linformer: the longest sequence its projections cover", minimum=1),
        ),
        refuses={"decoder_self": "not causal: each projected key mixes all positions, later ones too"},
        layer=LinformerSelfAttention,
    )
)
