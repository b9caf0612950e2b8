"""The block loss: the output projection and label-smoothed cross-entropy as one step, a block of
rows at a time (``training/loss.py`` chooses it, and has the two-call form it equals).

Written as two calls, ``F.cross_entropy(F.linear(h, W).float(), y)``, the training loss makes and
keeps four tensors of [tokens, vocabulary] (the logits, their fp32 copy, the log-softmax and, in
the backward pass, its gradient): with 8,000 words and ~3,000 target tokens a batch, 100 MB each
in fp32, each written and read whole from memory, the largest activations of the model
(BENCHMARKS.md, "Training speed and memory"). Here the logits of ``block_rows`` rows at a time are
made, turned into their losses and into their gradient, and dropped: what is kept for the backward
pass is one [tokens, vocabulary] tensor, the gradient with respect to the logits, in the matmul's
precision (bf16 under autocast), and what the backward pass does with it is two matrix products.
The gradient can be made in the forward pass because the loss is the last step: the gradient of
each row's loss with respect to its logits is ``softmax(z) - t`` (``t`` the label-smoothed target
distribution), and the gradient that flows back in is one number per row, applied to the products'
small [tokens, d_model] operands.

Label smoothing as ``F.cross_entropy``'s: with epsilon ``e`` over ``V`` classes, the target
distribution is ``(1 - e)`` on the reference word plus ``e / V`` on every word, so each row's
loss is ``logsumexp(z) - (1 - e) z[y] - e mean(z)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Rows per block: 512 rows of 8,000 fp32 logits are 16 MB at a time. On the recipe's model (bf16,
# 2 threads, Emerald Rapids) a training step with 512-row blocks peaked at 368 MiB of tensor
# storage against 486 MiB with 2,048 rows, and ran 2-6% faster (BENCHMARKS.md, "Memory"); 128
# rows saved little more (341 MiB) and were no faster than 2,048.
BLOCK_ROWS = 512
# On other devices (a GPU), blocks of up to 2^27 fp32 logits (512 MiB): each block is ~10 kernel
# launches of a few microseconds of arithmetic, so 512-row blocks would spend a 25,000-token batch's
# loss on ~50 blocks of launches, where memory is plentiful.
ACCELERATOR_BLOCK_ELEMENTS = 2**27


def default_block_rows(device: torch.device, vocab: int) -> int:
    """Rows per block of logits on ``device`` for a ``vocab``-word output: ``BLOCK_ROWS`` on the
    CPU, elsewhere as many as fit ``ACCELERATOR_BLOCK_ELEMENTS`` fp32 logits (at least ``BLOCK_ROWS``)."""
    if device.type == "cpu":
        return BLOCK_ROWS
    return max(BLOCK_ROWS, ACCELERATOR_BLOCK_ELEMENTS // max(1, vocab))


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The matmul dtype autocast would give ``x`` here (its dtype where autocast is off)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class _BlockLogits:
    """The logits of one block of rows at a time, ``h[start:stop] @ w.T + b`` as fp32 [C, V], all
    blocks written into the same memory.

    One buffer for every block, rather than a new [C, V] tensor each: freed blocks of 16 MB
    left among a step's small allocations are split by them, and the heap grew by a block for
    each block of the loss (``mallinfo2`` after every operation of recipe steps, fp32).
    """

    def __init__(self, h: Tensor, w: Tensor, b: Tensor | None, block_rows: int) -> None:
        self.h, self.w, self.b = h, w, b
        size = (min(block_rows, h.size(0)), w.size(0))
        self.product = torch.empty(size, dtype=h.dtype, device=h.device)  # (C, V) matmul dtype
        self.fp32 = (
            self.product if h.dtype == torch.float32 else torch.empty_like(self.product, dtype=torch.float32)
        )

    def logits(self, start: int, stop: int) -> Tensor:
        """[stop - start, V] fp32 logits of those rows; valid until the next call."""
        out = self.product[: stop - start]
        if self.b is None:
            torch.mm(self.h[start:stop], self.w.t(), out=out)
        else:
            torch.addmm(self.b, self.h[start:stop], self.w.t(), out=out)
        if out.dtype == torch.float32:
            return out
        return self.fp32[: stop - start].copy_(out)


def _block_losses(
    z: Tensor, y: Tensor, label_smoothing: float, want_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """Losses of a block of fp32 logits ``z`` [C, V] (overwritten) with targets ``y`` [C, 1], and,
    if asked, their gradient with respect to ``z``: ``softmax(z) - t``, in ``z``'s memory."""
    vocab = z.size(1)
    smoothed = (1.0 - label_smoothing) * z.gather(1, y) + label_smoothing * z.mean(1, keepdim=True)
    top = z.amax(1, keepdim=True)  # (C, 1)
    e = z.sub_(top).exp_()  # exp(z - top), in z's memory
    total = e.sum(1, keepdim=True)  # (C, 1)
    losses = (top + total.log() - smoothed)[:, 0]  # logsumexp(z) - smoothed
    if not want_grad:
        return losses, None
    p = e.mul_(total.reciprocal_()).sub_(label_smoothing / vocab)  # softmax - e / V
    p.scatter_add_(1, y, p.new_full(y.shape, -(1.0 - label_smoothing)))
    return losses, p


def _add_block_grads(
    p: Tensor, w: Tensor, h_block: Tensor, grad_h_block: Tensor, grad_w: Tensor, grad_b: Tensor | None
) -> None:
    """Multiplies a block's logit gradient ``p`` [C, V] into the gradients: ``grad_h_block``
    [C, d] written, ``grad_w`` [V, d] and ``grad_b`` [V] (or None) added to."""
    torch.mm(p, w, out=grad_h_block)
    grad_w.addmm_(p.t(), h_block)
    if grad_b is not None:
        grad_b += p.sum(0)


class _ProjectedCrossEntropy(torch.autograd.Function):
    """Per-row label-smoothed cross-entropy of ``hidden @ weight.T + bias``; see the module docstring.

    In fp32 on the CPU it goes one step further: each block's gradient is multiplied into the gradients of
    ``hidden``, ``weight`` and ``bias`` while the block is at hand, and no [tokens, vocabulary]
    tensor is kept at all (125 MiB for a 4,096-token batch in fp32). That assumes every row's
    loss gets the same gradient, as a mean or sum over tokens does; the backward pass checks it,
    and otherwise makes the blocks again, scaled row by row. In bf16 the early products ran
    slower than keeping the gradient (BENCHMARKS.md, "Tried, did not help").
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        label_smoothing: float,
        block_rows: int,
        compute_dtype: torch.dtype,
    ) -> Tensor:
        h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        rows, vocab = h.size(0), w.size(0)
        keep_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        # Early products on the CPU only: their backward pass reads whether every row's gradient is
        # the same, a value that a GPU would have to finish computing before the host went on.
        early = keep_grad and compute_dtype == torch.float32 and h.device.type == "cpu"
        losses = torch.empty(rows, dtype=torch.float32, device=h.device)
        grad_logits = grad_h = grad_w = grad_b = None
        if early:
            grad_h = torch.empty_like(h)  # (N, d)
            grad_w = torch.zeros_like(w)  # (V, d)
            grad_b = None if b is None else torch.zeros_like(b)  # (V,)
        elif keep_grad:
            grad_logits = torch.empty(rows, vocab, dtype=compute_dtype, device=h.device)
        blocks = _BlockLogits(h, w, b, block_rows)
        for start in range(0, rows, block_rows):
            stop = min(start + block_rows, rows)
            z = blocks.logits(start, stop)  # (C, V) fp32
            losses[start:stop], p = _block_losses(z, target[start:stop, None], label_smoothing, keep_grad)
            if early:
                _add_block_grads(p, w, h[start:stop], grad_h[start:stop], grad_w, grad_b)
            elif keep_grad:
                grad_logits[start:stop] = p
        if keep_grad:
            ctx.save_for_backward(h, w, b, target, grad_logits, grad_h, grad_w, grad_b)
            ctx.settings = (label_smoothing, block_rows)
            ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return losses

    @staticmethod
    def backward(ctx, grad_losses: Tensor):  # noqa: ANN001, ANN205, D102
        h, w, b, target, grad_logits, grad_h, grad_w, grad_b = ctx.saved_tensors
        if grad_logits is None:  # fp32: the gradients were made in the forward pass
            if bool((grad_losses == grad_losses[0]).all()):
                c = grad_losses[0].to(h.dtype)
                made = (grad_h * c, grad_w * c, None if grad_b is None else grad_b * c)
            else:
                made = _row_scaled_grads(h, w, b, target, grad_losses, *ctx.settings)
            grads = [
                None if x is None or not ctx.needs_input_grad[i] else x.to(ctx.dtypes[i])
                for i, x in enumerate(made)
            ]
            return (*grads, None, None, None, None)
        g = grad_losses.to(h.dtype)[:, None]  # (N, 1): d total / d loss of each row
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad_logits @ w).mul_(g).to(ctx.dtypes[0])  # (N, d)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_logits.t() @ (h * g)).to(ctx.dtypes[1])  # (V, d)
        if b is not None and ctx.needs_input_grad[2]:
            grad_bias = (grad_logits.float() * g.float()).sum(0).to(ctx.dtypes[2])  # (V,)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def _row_scaled_grads(
    h: Tensor,
    w: Tensor,
    b: Tensor | None,
    target: Tensor,
    grad_losses: Tensor,
    label_smoothing: float,
    block_rows: int,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The fp32 path's gradients of ``sum(grad_losses * losses)`` where rows' gradients differ:
    the blocks made again, each row's gradient scaled by its own. Shapes as ``hidden``, ``weight``
    and ``bias``."""
    grad_h, grad_w = torch.empty_like(h), torch.zeros_like(w)
    grad_b = None if b is None else torch.zeros_like(b)
    blocks = _BlockLogits(h, w, b, block_rows)
    for start in range(0, h.size(0), block_rows):
        stop = min(start + block_rows, h.size(0))
        z = blocks.logits(start, stop)
        _, p = _block_losses(z, target[start:stop, None], label_smoothing, True)
        p.mul_(grad_losses[start:stop, None].to(p.dtype))
        _add_block_grads(p, w, h[start:stop], grad_h[start:stop], grad_w, grad_b)
    return grad_h, grad_w, grad_b


# Not traced by torch.compile (training.loss.token_cross_entropy gives compiled GPU code the
# two-call form):
# Dynamo failed (an AssertionError) on the autograd.Function over several blocks under bf16
# autocast on an H200 (model=base, 32,000 words).
@torch.compiler.disable
def projected_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    ignore_index: int,
    label_smoothing: float = 0.0,
    block_rows: int | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """Label-smoothed cross-entropy of every position's logits ``hidden @ weight.T + bias``.

    Equal to ``F.cross_entropy(F.linear(hidden, weight, bias).float().flatten(0, -2),
    target.flatten(), ignore_index=ignore_index, label_smoothing=label_smoothing,
    reduction="none").view_as(target)``, forward and backward (under autocast the products run
    in its dtype, as ``F.linear`` would), without the [..., vocabulary] tensors of that form.

    Args:
        hidden: [..., d_model] the decoder's output.
        weight: [vocab, d_model] the output projection; bias: [vocab] or None.
        target: [...] reference ids; positions equal to ``ignore_index`` get loss 0 and no
            gradient, and no logits are computed for them.
        ignore_index: the padding id.
        label_smoothing: epsilon of label smoothing.
        block_rows: rows whose logits exist at once; None: ``default_block_rows`` of the device.
        positions: [N] int64, the flat positions in ``target`` that are not ``ignore_index``, in
            increasing order, as the host knows them before the batch reaches the device
            (``data.batching.collate_columns``' ``tgt_positions``); None: found here, by a
            ``nonzero`` that on a GPU makes the host wait for the device.

    Returns:
        [...] fp32 losses (the shape of ``target``), 0 at ignored positions.
    """
    if block_rows is None:
        block_rows = default_block_rows(hidden.device, weight.size(0))
    if positions is None:
        positions = (target != ignore_index).flatten().nonzero().squeeze(1)  # (N,)
    positions = positions.to(target.device, non_blocking=True)
    rows = _ProjectedCrossEntropy.apply(
        hidden.flatten(0, -2).index_select(0, positions),  # (N, d) real positions only
        weight,
        bias,
        target.flatten().index_select(0, positions),
        float(label_smoothing),
        int(block_rows),
        _compute_dtype(hidden),
    )
    flat = torch.zeros(target.numel(), dtype=rows.dtype, device=rows.device)
    return flat.index_copy(0, positions, rows).view_as(target)
