"""The training loss: label-smoothed cross-entropy of the model's logits, and how it is computed.

The loss is :func:`cross_entropy`, ``F.cross_entropy`` over the logits ``F.linear(hidden, W, b)``.
The trainer computes it by :func:`token_cross_entropy`, which takes, per device and mode, the
faster of two computations of the same numbers:

* the block loss (``fastpaths/loss.py``: the logits made and turned into losses and gradients a
  block of rows at a time, never [tokens, vocabulary] at once), eager on every device and
  compiled on the CPU, where inductor's fused log-softmax over the recipe's 8,000 words took 84 ms
  of a compiled step against the block loss's ~40 (BENCHMARKS.md, "Training speed");
* :func:`cross_entropy` as written under ``torch.compile`` elsewhere (a GPU), where inductor fuses
  it into a few kernels: the block loss's unfused passes took ~10 ms of a compiled ``model=base``
  step's 47 ms of GPU time (BENCHMARKS.md, "GPU"), and Dynamo failed on its autograd.Function
  over several bf16 blocks. The price is the [tokens, vocabulary] tensors that the compiled code
  keeps for the backward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Also imported from here by bench/ (BLOCK_ROWS, projected_cross_entropy) and by the GPU tests.
from fastpaths.loss import BLOCK_ROWS, default_block_rows, projected_cross_entropy  # noqa: F401

# Devices whose compiled training keeps the eager block loss (see the module docstring).
EAGER_LOSS_DEVICES = frozenset({"cpu"})


def cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    ignore_index: int,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Label-smoothed cross-entropy of every position's logits ``hidden @ weight.T + bias``.

    Args:
        hidden: [..., d_model] the decoder's output.
        weight: [vocab, d_model] the output projection; bias: [vocab] or None.
        target: [...] reference ids; positions equal to ``ignore_index`` get loss 0.
        ignore_index: the padding id.
        label_smoothing: epsilon of label smoothing.

    Returns:
        [...] fp32 losses (the shape of ``target``).
    """
    logits = F.linear(hidden, weight, bias)  # (..., V)
    losses = F.cross_entropy(
        logits.float().flatten(0, -2),
        target.flatten(),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction="none",
    )
    return losses.view_as(target)


def token_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    ignore_index: int,
    label_smoothing: float = 0.0,
    block_rows: int | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """:func:`cross_entropy` as the trainer computes it: the block loss, or compiled on a device
    not in ``EAGER_LOSS_DEVICES`` the two-call form (module docstring). Arguments and result as
    :func:`cross_entropy`'s; ``block_rows``: rows of logits at a time in the block loss (None: the
    device's default, ``fastpaths.loss.default_block_rows``); ``positions``: [N] flat positions
    of the real targets, known on the host (``fastpaths.loss.projected_cross_entropy``: without
    them the block loss finds them by a ``nonzero`` that waits for the device; the two-call form
    has no shape that depends on the values)."""
    if torch.compiler.is_compiling() and hidden.device.type not in EAGER_LOSS_DEVICES:
        return cross_entropy(hidden, weight, bias, target, ignore_index, label_smoothing)
    return projected_cross_entropy(
        hidden, weight, bias, target, ignore_index, label_smoothing, block_rows, positions
    )
