"""Written-out attention with a short-row softmax, swapped in for ``ScaledDotProduct`` on the CPU.

``attention.ScaledDotProduct`` computes equation (1) through the fused
``F.scaled_dot_product_attention``, faster on the GPU and for long sequences, but not on the CPU
for two kinds of shapes, where two batched matmuls ran faster: bf16 over up to ``LONG_KEYS`` keys
(training under bf16 autocast: BENCHMARKS.md, "What was tried that did not help"), and decoding's
few queries (autograd off, at most ``SMALL_QUERY`` queries: one new token per hypothesis against
the cache, or a sentence's few beams against its source, "Decoding speed").

Inside it, the softmax over short rows: PyTorch's CPU softmax is vectorised along the softmax
dimension and takes a slow path when it is shorter than a vector (16 floats), as in the
self-attention of hypotheses to fewer than 16 cached steps: written out, it is faster there
("Found while profiling").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.attention import ScaledDotProduct, with_causal

SMALL_QUERY = 16  # decoding-sized query lengths
# Past this many keys, bf16 goes to the fused kernel: written out, its n x n scores grow
# quadratically. Our softmax layer, forward + backward at d_model 512 under bf16 autocast, ran at
# 1.33x SDPA's speed at 256 keys written out, but 0.81x at 1K and 0.21x at 16K (BENCHMARKS.md,
# "Attention mechanisms", decoder in bf16).
LONG_KEYS = 512


def prefers_written_out(q: Tensor, keys: int) -> bool:
    """Whether :func:`attention` beats the fused kernel for these queries [..., q_len, d_k] over
    ``keys`` keys: half precision up to ``LONG_KEYS`` keys, and decoding's few queries."""
    return q.device.type == "cpu" and (
        (q.dtype in (torch.bfloat16, torch.float16) and keys <= LONG_KEYS)
        or (q.size(-2) <= SMALL_QUERY and not torch.is_grad_enabled())
    )


def softmax(scores: Tensor) -> Tensor:
    """``scores.softmax(dim=-1)``, written out in place for rows shorter than 16 with autograd off."""
    # The length is asked last: compiled training (grad on) then makes no guard on it, which would
    # compile the model again for sentences on each side of 16 tokens.
    if torch.is_grad_enabled() or scores.device.type != "cpu" or scores.size(-1) >= 16:
        return scores.softmax(dim=-1)
    weights = (scores - scores.amax(dim=-1, keepdim=True)).exp_()
    return weights.div_(weights.sum(dim=-1, keepdim=True))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V in two batched matmuls, with :func:`softmax`.

    The same computation as ``transformer.attention.scaled_dot_product_attention``, without the weights.

    Args:
        q: [batch, heads, q_len, d_k]; k: [batch, heads, k_len, d_k]; v: [batch, heads, k_len, d_v].
        mask: bool, broadcastable to [batch, heads, q_len, k_len], True = may attend (any causal
            mask already included), or None.
        dropout_p: dropout on the attention weights (0.0 in eval).

    Returns:
        [batch, heads, q_len, d_v].
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


class CpuScaledDotProduct(ScaledDotProduct):
    """``ScaledDotProduct`` by :func:`attention` where :func:`prefers_written_out`, else fused."""

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """As ``ScaledDotProduct.forward``: q [B, H, Tq, d], k, v [B, H, Tk, d] -> [B, H, Tq, d]."""
        if prefers_written_out(q, k.size(2)):
            return attention(q, k, v, with_causal(mask, q, k) if causal else mask, dropout_p)
        return super().forward(q, k, v, mask, causal, dropout_p)
