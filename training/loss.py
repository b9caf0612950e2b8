"""The training loss: label-smoothed cross-entropy of the model's logits (paper, section 5.4).

:func:`cross_entropy` is ``F.cross_entropy`` over the logits ``F.linear(hidden, W, b)``, the loss
as written. The trainer takes a faster computation of the same numbers where one was measured to
pay, from ``fastpaths.optimize`` (the block loss, ``fastpaths/loss.py``: the logits made and
turned into losses and gradients a block of rows at a time, never [tokens, vocabulary] at once;
on a GPU under ``torch.compile`` the plain loss stays, since inductor fuses it into a few
kernels). Any of them is a :data:`LossFunction`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

# (hidden [..., d_model], weight [V, d_model], bias [V] or None, target [...], ignore_index,
# label_smoothing, positions=[N] or None) -> [...] fp32 losses, 0 at ignored positions.
LossFunction = Callable[..., Tensor]


def cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    ignore_index: int,
    label_smoothing: float = 0.0,
    positions: Tensor | None = None,
) -> Tensor:
    """Label-smoothed cross-entropy of every position's logits ``hidden @ weight.T + bias``.

    Args:
        hidden: [..., d_model] the decoder's output.
        weight: [vocab, d_model] the output projection; bias: [vocab] or None.
        target: [...] reference ids; positions equal to ``ignore_index`` get loss 0.
        ignore_index: the padding id.
        label_smoothing: epsilon of label smoothing.
        positions: not needed here (``ignore_index`` finds the padding); a :data:`LossFunction`
            takes the flat positions of the real targets where the host knows them.

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
