"""Dropout masks drawn 16 bits an element, swapped in for ``nn.Dropout`` while training on the CPU.

PyTorch's CPU dropout draws one number from its generator per element (``bernoulli_``), ~8 ns
each: a tenth of a bf16 training step of the Multi30k recipe. Here the mask comes from one 64-bit
draw per four elements, each element keeping 16 of the bits: it is kept where those 16 bits read
as an integer are at least ``round(p * 65536)`` from the bottom, so the rate ``p`` is rounded to a
multiple of 1/65,536 (0.1 -> 0.100006), and what is kept is scaled by the inverse of the rounded
keep rate, so the expectation is unchanged. The global generator draws the bits: seeding and a
checkpoint's RNG state reproduce the masks (BENCHMARKS.md, "Training speed and memory").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def keep_mask(
    shape: torch.Size, p: float, device: torch.device, dtype: torch.dtype = torch.bool
) -> tuple[Tensor, float]:
    """A mask of ``shape``, 1 (True) with probability ``1 - p`` rounded to 1/65,536 and 0 (False)
    otherwise, in ``dtype``, and the scale that keeps the expectation: ``1 / P(1)``."""
    n = math.prod(shape)
    drop = round(p * 65536)  # 16-bit values below this are dropped
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    lanes = bits.view(torch.int16)[:n]  # (n,) four 16-bit lanes per draw
    if dtype == torch.bool:
        keep = lanes >= drop - 32768
    else:  # the comparison written straight as 0.0 / 1.0: one vectorised pass, no bool tensor
        keep = torch.ge(lanes, drop - 32768, out=torch.empty(n, dtype=dtype, device=device))
    return keep.view(shape), 65536 / (65536 - drop)


class _MaskedScale(torch.autograd.Function):
    """x * mask * scale, with the same mask and scale on the way back."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:  # noqa: ANN001, D102
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x.mul(mask).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: ANN001, ANN205, D102
        (mask,) = ctx.saved_tensors
        return grad.mul(mask).mul_(ctx.scale), None, None


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose masks, while training on the CPU, come from :func:`keep_mask`.

    In half precision (bf16 under autocast) the mask is made in x's dtype, 0 and 1: a product
    with a bool mask converts it element by element, ~4x the time of a product of two bf16
    tensors (BENCHMARKS.md, "Training speed and memory"), for one more byte an element. In fp32
    it stays bool: an fp32 mask would be faster by less than 1% of a step and hold three more
    bytes an element until the backward pass. The scale multiplies after the mask, in fp32
    arithmetic: the results are the same either way.

    On other devices, in eval mode, at p 0 or 1, and under ``torch.compile`` (whose compiled code
    draws its own masks; the in-place ``random_`` here would break the graph at every dropout),
    it is ``nn.Dropout``.
    """

    @classmethod
    def from_dropout(cls, dropout: nn.Dropout) -> Dropout:
        """The same rate and mode as ``dropout``."""
        return cls(dropout.p, dropout.inplace).train(dropout.training)

    def forward(self, x: Tensor) -> Tensor:
        """x: [...] -> [...]."""
        if (
            not self.training
            or x.device.type != "cpu"
            or not 0.0 < self.p < 1.0
            or self.inplace
            or torch.compiler.is_compiling()
        ):
            return super().forward(x)
        dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bool
        mask, scale = keep_mask(x.shape, self.p, x.device, dtype)
        return _MaskedScale.apply(x, mask, scale)
