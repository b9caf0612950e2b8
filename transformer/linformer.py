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
(E x) W_K, so ``MultiHeadAttention`` multiplies W_K and W_V with the k rows of E x and F x
(``compress``) instead of the n rows of x, and never forms the n keys and values: two thirds of
its input projection saved, and their n × d_model activations. That is where n > k
(``compresses``); a shorter sequence has fewer keys than projected rows, and takes the usual path.

Encoder self-attention and cross-attention (the encoder output projected to k, once per source:
``summarise``, held in the decoding state as softmax's K/V are). Not decoder
self-attention: every one of the k projected keys mixes all n positions, later ones included,
so it cannot be causal (``mechanisms.REFUSED``). No decoding state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer.attention import ScaledDotProduct, scaled_dot_product_attention
from transformer.registry import Mechanism, Setting, register


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

    def project(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
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
        return self.project(k, v, mask)

    def attend_summary(self, q: Tensor, summary: tuple[Tensor, Tensor]) -> Tensor:
        """softmax(Q (E K)ᵀ/√d)(F V): q [B, H, Tq, d], ``summary`` from :meth:`summarise` -> [B, H, Tq, d]."""
        pk, pv = summary
        return self.kernel(q, pk, pv, dropout_p=self.dropout if self.training else 0.0)

    def compresses(self, n: int) -> bool:
        """Whether ``MultiHeadAttention``'s self-attention over n positions goes through
        ``compress``: where the sequence is longer than the k projected rows. W_K and W_V then
        multiply k rows instead of n; with n ≤ k (translation's sentences, against k = 64) the n
        keys and values themselves are fewer rows, and E K, F V are projected from them."""
        return n > self.projected_length

    def compress(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """What self-attention's E K and F V need, from the layer's inputs x [B, n, d_model].

        Equation (7) projects the sequence of the inputs before their W_K, W_V: with padded rows
        of x zeroed (x̃) and K = x̃ W_Kᵀ + keep b_Kᵀ,

            E K = (E x̃) W_Kᵀ + (E keep) b_Kᵀ,

        the same products reassociated, with W_K applied to k rows instead of n. Returns E x̃ and
        F x̃, [B, k, d_model] each, and E keep and F keep, [B or 1, k, 1] each (the weight that
        each projected row gives the bias), for ``MultiHeadAttention`` to finish with its W_K, W_V.
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
        projected_from: int | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The mechanisms' signature; mask: key padding [B, 1, 1, n]. ``need_weights``: the weights
        P·F [B, H, Tq, n] over the original positions that the output implies (n × n: pictures only).

        ``projected_from``: k and v are already E K and F V, [B, H, k, d], of that many keys
        (self-attention: ``compress`` and the layer's W_K, W_V); None: they are the n keys and
        values, [B, H, n, d], projected here (cross-attention).
        """
        if causal or state is not None:
            raise ValueError("linformer attention cannot be causal: every projected key mixes all positions")
        n = k.size(2) if projected_from is None else projected_from
        pk, pv = self.project(k, v, mask) if projected_from is None else (k, v)
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
    )
)
