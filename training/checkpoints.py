"""Which checkpoints a run keeps, and when it validates: at epoch ends, or every N updates.

Epoch-based (``checkpoint.every_n_updates: null``, the default and the Multi30k recipe's):
validation after every epoch; ``best-epoch*`` (by the selection metric, validation BLEU by
default: :mod:`training.selection`), ``last.ckpt`` and, with
``average_last`` > 1, the last ``average_last`` ``epoch*.ckpt``.

Update-based (fairseq's ``--validate-interval-updates`` / ``--save-interval-updates``): every
``every_n_updates`` optimizer updates, across epoch boundaries, the run validates, then writes
``update*.ckpt`` and ``last.ckpt`` (the last ``keep_last`` of the ``update*`` kept) and
``best-step*``, the best by the selection metric. ``average_last`` averages the newest of the kept
update checkpoints.

The update checkpoints are written after their validation, as fairseq does, so that they hold
what it changed (early stopping's counter, the best score and the best checkpoint's path): a run
resumed from one neither repeats that validation (Lightning skips it, seeing the checkpoint was
saved after it) nor loses it. Where the run never validates (``trainer.limit_val_batches=0``)
they are written at the end of the update instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from training.selection import DEFAULT_SELECTION, Selection


@dataclass(frozen=True)
class CheckpointPlan:
    """The checkpoint callbacks of a run and the Trainer arguments that set its validation.

    Attributes:
        best: keeps the best checkpoint by the selection metric (``val/bleu`` by default).
        recent: keeps the newest epoch or update checkpoints (at least the newest one).
        last: the callback that writes ``last.ckpt``.
        trainer_args: ``val_check_interval`` / ``check_val_every_n_epoch`` for update-based runs.
        average_last: how many of ``recent``'s checkpoints :meth:`to_average` returns.
    """

    best: ModelCheckpoint
    recent: ModelCheckpoint | None
    last: ModelCheckpoint
    trainer_args: dict[str, Any]
    average_last: int

    @property
    def callbacks(self) -> list[ModelCheckpoint]:
        return [self.best] + ([self.recent] if self.recent is not None else [])

    def to_average(self) -> list[str]:
        """The newest ``average_last`` kept epoch or update checkpoints, oldest first; none for 0 or 1."""
        if self.recent is None or self.average_last <= 1:
            return []  # kept[-0:] would be every kept checkpoint
        kept = sorted(self.recent.best_k_models, key=lambda p: float(self.recent.best_k_models[p]))
        return kept[-self.average_last :]


def plan_checkpoints(
    ckpt_dir: Path,
    every_n_updates: int | None,
    keep_last: int,
    average_last: int,
    accumulate_grad_batches: int = 1,
    validates: bool = True,
    selection: Selection = DEFAULT_SELECTION,
) -> CheckpointPlan:
    """The checkpoints and validation schedule of a run.

    Args:
        ckpt_dir: where checkpoints go.
        every_n_updates: validate and save every N optimizer updates; None: at epoch ends.
        keep_last: update checkpoints kept (update-based only; at least ``average_last``).
        average_last: checkpoints averaged after training (0 or 1: none).
        accumulate_grad_batches: batches per update (validation is scheduled in batches).
        validates: whether the run validates at all; if not, update checkpoints are written at
            the end of their update rather than after a validation.
        selection: the metric, and its direction, by which the best checkpoint is kept; its name
            and value go into the file name (``best-epoch003-bleu31.20.ckpt``,
            ``best-step00004000-old-loss1.8731.ckpt``).

    Raises:
        ValueError: a setting out of range, named.
    """
    if every_n_updates is None:
        return _at_epoch_ends(ckpt_dir, average_last, selection)
    if every_n_updates < 1:
        raise ValueError(
            f"checkpoint.every_n_updates must be null (epoch ends) or at least 1, not {every_n_updates}"
        )
    if keep_last < max(1, average_last):
        raise ValueError(
            f"checkpoint.keep_last={keep_last} must be at least 1 and at least average_last={average_last}"
            " (the averaged checkpoints are among those kept)"
        )
    recent = ModelCheckpoint(
        dirpath=ckpt_dir,
        filename="update{step:08d}",
        monitor="step",
        mode="max",
        save_top_k=keep_last,
        # After each validation (every N updates), or every N updates where nothing validates.
        every_n_train_steps=None if validates else every_n_updates,
        save_on_train_epoch_end=False,
        save_last=True,
        auto_insert_metric_name=False,
    )
    best = ModelCheckpoint(
        dirpath=ckpt_dir,
        filename=selection.filename("step{step:08d}"),
        monitor=selection.monitor,
        mode=selection.mode,
        save_top_k=1,
        save_on_train_epoch_end=False,
        auto_insert_metric_name=False,
    )
    # Validation is scheduled in batches, counted across epochs when check_val_every_n_epoch is None.
    trainer_args = {
        "val_check_interval": every_n_updates * accumulate_grad_batches,
        "check_val_every_n_epoch": None,
    }
    return CheckpointPlan(best, recent, recent, trainer_args, average_last)


def _at_epoch_ends(ckpt_dir: Path, average_last: int, selection: Selection) -> CheckpointPlan:
    """Validation after every epoch: ``best-epoch*``, ``last.ckpt`` and the newest ``epoch*``."""
    best = ModelCheckpoint(
        dirpath=ckpt_dir,
        filename=selection.filename("epoch{epoch:03d}"),
        monitor=selection.monitor,
        mode=selection.mode,
        save_top_k=1,
        auto_insert_metric_name=False,
    )
    # last.ckpt comes with the epoch checkpoints, which every epoch writes: Lightning writes a
    # callback's last.ckpt only when that callback saved, and the best one does not save an
    # epoch that is not better (last.ckpt stayed at the best epoch, and resuming redid epochs).
    recent = ModelCheckpoint(
        dirpath=ckpt_dir,
        filename="epoch{epoch:03d}",
        monitor="epoch",
        mode="max",
        save_top_k=max(1, average_last),
        save_last=True,
        auto_insert_metric_name=False,
    )
    return CheckpointPlan(best, recent, recent, {}, average_last)
