"""Updates with a non-finite loss or gradient are skipped; too many in a row stop the run.

fairseq's behaviour: a NaN or inf loss, or gradient norm, means that update is not applied (the
weights and Adam's moments stay as they were), a warning names it, and after
``max_in_a_row`` such updates in a row the run stops with :class:`NonFiniteError`, naming the
update, the batch and the last checkpoint written (every checkpoint holds finite weights, since
no non-finite update was ever applied).

Lightning has no hook for "skip this optimizer step", so :class:`~training.module.TranslationModule`
overrides ``optimizer_step``: it runs Lightning's closure (forward and backward), asks
:meth:`NonFiniteGuard.should_step`, and calls ``optimizer.step`` only when it says so. Under DDP
the decision is all-reduced, so every rank skips the same updates. The learning-rate schedule
still advances on a skipped update, as on an fp16 update that Lightning's GradScaler skips.
"""

from __future__ import annotations

import logging
import math
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


def _any_rank(flag: bool, device: torch.device) -> bool:
    """True if ``flag`` is true on any rank (all ranks get the same answer); ``flag`` alone."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


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

    def state_dict(self) -> dict[str, int]:
        """The streak and the total skipped, saved in checkpoints so that a resumed run counts on."""
        return {"in_a_row": self.in_a_row, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.in_a_row = int(state["in_a_row"])
        self.skipped = int(state["skipped"])

    def should_step(
        self,
        trainer: L.Trainer,
        loss: Tensor | None,
        grad_norm: Tensor,
        batch_idx: int,
        batch_ids: Tensor | None,
        check_grads: bool = True,
    ) -> bool:
        """Whether to apply this update; logs a skip and raises after ``max_in_a_row`` in a row.

        Args:
            trainer: the running trainer (its step, epoch and checkpoints are named).
            loss: the closure's loss (0-dim), None where the closure skipped backward.
            grad_norm: the total gradient norm (0-dim), unscaled.
            batch_idx: index of the batch in the epoch.
            batch_ids: [batch] example ids of the (last) batch of this update, for the message.
            check_grads: False where a GradScaler handles non-finite gradients itself (fp16).

        Raises:
            NonFiniteError: the ``max_in_a_row``-th non-finite update in a row.
        """
        bad = loss is not None and not bool(torch.isfinite(loss.detach()).all())
        bad_grad = check_grads and not math.isfinite(float(grad_norm))
        if not _any_rank(bad or bad_grad, grad_norm.device):
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.skipped += 1  # Lightning counts the step all the same (see the module docstring)
        what = "loss" if bad else "gradient norm" if bad_grad else "loss or gradient on another rank"
        ids = [] if batch_ids is None else batch_ids[:8].tolist()
        where = (
            f"step {trainer.global_step + 1}, epoch "
            f"{trainer.current_epoch}, batch {batch_idx} of the epoch (example ids {ids}"
            f"{'...' if batch_ids is not None and len(batch_ids) > 8 else ''})"
        )
        if trainer.is_global_zero:
            logger.warning(
                "non-finite %s at %s: update skipped (%d in a row; max_nonfinite_in_a_row=%d)",
                what,
                where,
                self.in_a_row,
                self.max_in_a_row,
            )
        if self.in_a_row >= self.max_in_a_row:
            last = last_checkpoint(trainer)
            raise NonFiniteError(
                f"training stopped: {self.in_a_row} updates in a row had a non-finite loss or gradient "
                f"(max_nonfinite_in_a_row={self.max_in_a_row}); the last at {where}. No non-finite "
                f"update was applied; the last good checkpoint is "
                f"{last if last else 'none (none written yet)'}"
            )
        return False
