"""Updates with a non-finite loss or gradient are skipped; too many in a row stop the run.

fairseq's behaviour: a NaN or inf loss, or gradient norm, means that update is not applied (the
weights and Adam's moments stay as they were), a warning names it, and after
``max_in_a_row`` such updates in a row the run stops with :class:`NonFiniteError`, naming the
update, the batch and the last checkpoint written (every checkpoint holds finite weights, since
no non-finite update was ever applied).

Lightning has no hook for "skip this optimizer step", so :class:`~training.module.TranslationModule`
overrides ``optimizer_step``: it runs Lightning's closure (forward and backward), makes the
update's :func:`nonfinite_flags` on the device and hands them to :meth:`NonFiniteGuard.decide`.
Under DDP the flags are all-reduced, so every rank skips the same updates. The learning-rate
schedule still advances on a skipped update, as on an fp16 update that Lightning's GradScaler skips.

Where the optimizer is a fused Adam, the skip is decided on the device, as GradScaler has fused
Adam skip an fp16 step: the flags become the optimizer's ``found_inf``, whose kernel leaves the
weights, the moments and the step count as they were, and the host never waits for the flags.
It learns them later, from an asynchronous copy into host memory, as soon as the copy is done
(:meth:`NonFiniteGuard.settle`, at every update; at the latest when a checkpoint is saved or the
epoch ends): the warning, the count and the stop come an update or two after the update they
name, on a GPU; at once on the CPU, where the copy is done when it returns. Any other optimizer
(the per-tensor Adam, or fp16's scaled one) is stepped or not on the host's decision, which waits
for the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor

logger = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Raised when ``max_in_a_row`` updates in a row had a non-finite loss or gradient."""


def total_grad_norm(parameters: list[torch.nn.Parameter]) -> Tensor:
    """The 2-norm of all gradients together, as clipping computes it (a 0-dim fp32 tensor)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False).float()


def last_checkpoint(trainer: L.Trainer) -> str | None:
    """The newest checkpoint file any of the trainer's ModelCheckpoints wrote, or None."""
    paths = set()
    for callback in trainer.checkpoint_callbacks:
        paths.update([callback.last_model_path, callback.best_model_path])
        paths.update(getattr(callback, "best_k_models", {}))
    existing = [Path(p) for p in paths if p and Path(p).is_file()]
    return str(max(existing, key=lambda p: p.stat().st_mtime_ns)) if existing else None


@dataclass(frozen=True)
class UpdatePlace:
    """Where an update was, for the messages (made into words only when a message is written).

    Attributes:
        step: the update's step, from 1; epoch: its epoch; batch_idx: its (last) batch's index in
        the epoch; batch_ids: [batch] that batch's example ids, or None; read (from the device,
        waiting for it) only when a message is written, and filler rows (id -1, of
        ``data.length_buckets``) left out.
    """

    step: int
    epoch: int
    batch_idx: int
    batch_ids: Tensor | None = None

    @classmethod
    def of(cls, trainer: L.Trainer, batch_idx: int, batch_ids: Tensor | None) -> UpdatePlace:
        """The update the trainer is about to make."""
        return cls(trainer.global_step + 1, trainer.current_epoch, batch_idx, batch_ids)

    def __str__(self) -> str:
        ids = [] if self.batch_ids is None else [i for i in self.batch_ids.tolist() if i >= 0]
        more = "..." if len(ids) > 8 else ""
        return (
            f"step {self.step}, epoch {self.epoch}, batch {self.batch_idx} of the epoch "
            f"(example ids {ids[:8]}{more})"
        )


class PendingUpdate:
    """An update's flags on their way to host memory, and where the update was, for the message.

    Args:
        flags: [2] fp32 device tensor: 1 where the loss, and the gradient norm, were not finite.
        where: the update (:class:`UpdatePlace`).
    """

    def __init__(self, flags: Tensor, where: UpdatePlace) -> None:
        self.where = where
        pinned = flags.device.type == "cuda"
        self.host = torch.empty(2, dtype=torch.float32, pin_memory=pinned)
        self.host.copy_(flags, non_blocking=pinned)
        self.event = None
        if pinned:
            self.event = torch.cuda.Event()
            self.event.record()
        self.values = self.host.numpy()  # host memory: reading it waits for nothing once copied

    def ready(self) -> bool:
        """Whether the copy is done (always, but for an asynchronous one still under way)."""
        return self.event is None or self.event.query()

    def wait(self) -> None:
        """Waits for the copy (and so for the update) to be done."""
        if self.event is not None:
            self.event.synchronize()


def nonfinite_flags(loss: Tensor | None, grad_norm: Tensor, check_grads: bool = True) -> Tensor:
    """[2] fp32 on the device of ``grad_norm``: 1.0 where the loss, and where the gradient norm, is
    not finite (0 for the gradient where ``check_grads`` is False, for the loss where it is None);
    the maximum over the ranks under DDP. Made without reading a value on the host."""
    zero = torch.zeros((), dtype=torch.float32, device=grad_norm.device)
    loss_bad = zero if loss is None else (~torch.isfinite(loss.detach().float())).any().float()
    grad_bad = (~torch.isfinite(grad_norm.float())).float() if check_grads else zero
    flags = torch.stack([loss_bad, grad_bad])  # (2,)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return flags


class NonFiniteGuard:
    """Counts non-finite updates in a row and decides whether an update is applied.

    Args:
        max_in_a_row: stop after this many non-finite updates in a row (at least 1).
    """

    def __init__(self, max_in_a_row: int = 10) -> None:
        if max_in_a_row < 1:
            raise ValueError(f"max_nonfinite_in_a_row must be at least 1, not {max_in_a_row}")
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0
        self.skipped = 0
        self.pending: list[PendingUpdate] = []  # updates whose flags the host has not read yet

    def state_dict(self) -> dict[str, int]:
        """The streak and the total skipped, saved in checkpoints so that a resumed run counts on.

        The updates still pending are waited for first (saving a checkpoint waits anyway)."""
        self.settle(wait=True)
        return {"in_a_row": self.in_a_row, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.in_a_row = int(state["in_a_row"])
        self.skipped = int(state["skipped"])
        self.pending = []

    def decide(self, trainer: L.Trainer, flags: Tensor, where: UpdatePlace, on_device: bool) -> bool:
        """Whether the host applies this update (always True where ``on_device`` decides it).

        Args:
            trainer: the running trainer (its checkpoints are named in the stop's message).
            flags: this update's :func:`nonfinite_flags`.
            where: this update (:meth:`UpdatePlace.of`).
            on_device: the optimizer takes ``flags`` as its ``found_inf`` and skips by itself; the
                host then reads them when they have arrived (:meth:`settle`) and does not wait.

        Raises:
            NonFiniteError: the ``max_in_a_row``-th non-finite update in a row (perhaps an update
                or two late, with ``on_device`` on a GPU: the message names the right update).
        """
        self.pending.append(PendingUpdate(flags, where))
        if on_device:
            self.settle(trainer)
            return True
        bad = self.pending[-1]
        self.settle(trainer, wait=True)
        return not bad.values.any()

    def settle(self, trainer: L.Trainer | None = None, wait: bool = False) -> None:
        """Reads the flags of the pending updates that have arrived (all, waiting, with ``wait``),
        in order: counts, warns, and raises after ``max_in_a_row`` in a row.

        Raises:
            NonFiniteError: as :meth:`decide`.
        """
        while self.pending and (wait or self.pending[0].ready()):
            update = self.pending.pop(0)
            update.wait()
            self._count(trainer, update)

    def _count(self, trainer: L.Trainer | None, update: PendingUpdate) -> None:
        loss_bad, grad_bad = (bool(v) for v in update.values)
        if not (loss_bad or grad_bad):
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.skipped += 1  # Lightning counts the step all the same (see the module docstring)
        what = "loss" if loss_bad else "gradient norm"
        if trainer is None or trainer.is_global_zero:
            logger.warning(
                "non-finite %s at %s: update skipped (%d in a row; max_nonfinite_in_a_row=%d)",
                what,
                update.where,
                self.in_a_row,
                self.max_in_a_row,
            )
        if self.in_a_row >= self.max_in_a_row:
            last = None if trainer is None else last_checkpoint(trainer)
            self.pending = []
            raise NonFiniteError(
                f"training stopped: {self.in_a_row} updates in a row had a non-finite loss or gradient "
                f"(max_nonfinite_in_a_row={self.max_in_a_row}); the last at {update.where}. No non-finite "
                f"update was applied; the last good checkpoint is "
                f"{last if last else 'none (none written yet)'}"
            )
