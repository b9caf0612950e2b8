"""The training loss: label-smoothed cross-entropy of the model's logits (paper, section 5.4).

:func:`cross_entropy` is ``F.cross_entropy`` over the logits ``F.linear(hidden, W, b)``, the loss
as written. The trainer takes a faster computation of the same numbers where one was measured to
pay, from ``fastpaths.optimize`` (the block loss, ``fastpaths/loss.py``: the logits made and
turned into losses and gradients a block of rows at a time, never [tokens, vocabulary] at once;
on a GPU under ``torch.compile`` the plain loss stays, since inductor fuses it into a few
kernels). Any of them is a :data:`LossFunction`. :func:`token_losses` is the model's forward pass
and the loss in one function, what ``compile`` (:func:`compile_options`) compiles.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

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


def token_losses(
    model: nn.Module,
    src: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    pad_id: int,
    label_smoothing: float,
    loss_function: LossFunction = cross_entropy,
    positions: Tensor | None = None,
) -> Tensor:
    """Label-smoothed cross-entropy of every target token, zero at padding.

    The forward pass and the loss in one function: what ``compile`` compiles.

    Args:
        model: a ``Transformer``: ``model(src, tgt_in, project=False)`` is the decoder output
            [batch, tgt_len, d_model], ``model.output`` the projection to the vocabulary.
        src: [batch, src_len] source ids; tgt_in: [batch, tgt_len] BOS + target ids.
        tgt_out: [batch, tgt_len] target ids + EOS, right-padded with ``pad_id``.
        pad_id: the padding id (ignored positions).
        label_smoothing: epsilon of label smoothing.
        loss_function: the output projection and the loss (``training.loss``): the plain
            ``F.cross_entropy`` of the logits, or a faster equal from ``fastpaths.optimize``.
        positions: [N] flat positions of ``tgt_out``'s real tokens, known on the host
            (``data.batching.collate_columns``' ``tgt_positions``); None: found on the device.

    Returns:
        [batch, tgt_len] losses, 0 at padding.
    """
    hidden = model(src, tgt_in, project=False)  # (B, T, d_model)
    output = model.output
    return loss_function(
        hidden, output.weight, output.bias, tgt_out, pad_id, label_smoothing, positions=positions
    )  # (B, T)


def compile_options(compile: bool | dict | None) -> dict | None:
    """``torch.compile`` keyword arguments from the ``compile`` setting; None: do not compile.

    ``False``/``None``: None; ``True``: ``{}`` (torch.compile's defaults: inductor, shapes made
    dynamic after the first change); a dict: those arguments, e.g. ``{"mode": "max-autotune"}``.
    """
    if compile is None or compile is False:
        return None
    if compile is True:
        return {}
    if not isinstance(compile, dict):  # a DictConfig is converted by the caller (a checkpoint's hparams)
        raise TypeError(f"compile must be a bool or a plain dict, not {type(compile).__name__}")
    return dict(compile)
