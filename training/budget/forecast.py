"""Whether a time-budgeted run (``trainer.max_time``) fits its schedule on the machine at hand.

The CPU recipe trains for a fixed time, and its schedule (warmup updates, the epoch checkpoints
it averages) was chosen for the number of updates that time gives on the machine it was tuned on.
On a machine a third as fast the same time ends barely past warmup. So, early in the run (after
``PROBE_UPDATES`` updates, or the first epoch if shorter), :class:`TimeBudgetCheck` measures this
machine's updates per second, predicts the updates and epochs the budget holds, and logs them; if
they are too few for the schedule it warns, saying what to change.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

logger = logging.getLogger(__name__)

PROBE_UPDATES = 20  # updates timed before predicting (the first one, with its warm-up, is not timed)
WARMUP_MULTIPLE = 2  # a run should be at least this many warmups long, so that the rate decays
AVERAGE_MULTIPLE = 2  # ... and this many times the averaged epochs, so that early epochs stay out


@dataclass(frozen=True)
class BudgetForecast:
    """What the budget holds at the measured speed.

    Attributes:
        updates: optimizer updates expected within the budget (validation time not counted).
        epochs: the same in epochs.
        updates_needed: the fewest updates the schedule makes sense with.
        seconds_needed: the budget that would give them at this speed.
    """

    updates: int
    epochs: float
    updates_needed: int
    seconds_needed: float

    @property
    def too_short(self) -> bool:
        return self.updates < self.updates_needed


def forecast(
    seconds_per_update: float,
    budget_s: float,
    updates_per_epoch: int,
    warmup_steps: int,
    average_last: int,
    updates_per_checkpoint: int | None = None,
) -> BudgetForecast:
    """The updates and epochs ``budget_s`` seconds hold, against what the schedule needs.

    ``updates_per_checkpoint``: updates between the checkpoints that are averaged (epoch
    checkpoints, the default: ``updates_per_epoch``; ``checkpoint.every_n_updates`` otherwise).
    """
    updates = int(budget_s / seconds_per_update)
    span = AVERAGE_MULTIPLE * max(average_last, 1) * (updates_per_checkpoint or updates_per_epoch)
    needed = max(WARMUP_MULTIPLE * warmup_steps, span)
    return BudgetForecast(updates, updates / updates_per_epoch, needed, needed * seconds_per_update)


def run_limit(
    max_steps: int | None, max_epochs: int | None, updates_per_epoch: int
) -> tuple[int, str] | None:
    """Where the run's own limits end it, whatever the time: the fewer of ``trainer.max_steps``
    updates and ``trainer.max_epochs`` epochs of ``updates_per_epoch``, and that limit's setting
    (``"trainer.max_epochs=40"``); None where neither is set (-1, 0 or None). A forecast of the
    budget that passed it would fit a decay that the run never reaches the end of."""
    limits = []
    if max_steps is not None and max_steps > 0:
        limits.append((int(max_steps), f"trainer.max_steps={max_steps}"))
    if max_epochs is not None and max_epochs > 0:
        limits.append((int(max_epochs) * max(updates_per_epoch, 1), f"trainer.max_epochs={max_epochs}"))
    return min(limits) if limits else None


def max_time_seconds(max_time: str | dict[str, int]) -> float:
    """Lightning's ``max_time`` ("DD:HH:MM:SS", or a mapping of ``timedelta`` arguments) in seconds."""
    if isinstance(max_time, str):
        days, hours, minutes, seconds = (int(x) for x in max_time.split(":"))
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    return timedelta(**max_time).total_seconds()


def as_max_time(seconds: float) -> str:
    """``seconds`` rounded up to whole minutes, as Lightning's ``max_time`` "DD:HH:MM:SS"."""
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 1440:02d}:{minutes // 60 % 24:02d}:{minutes % 60:02d}:00"


class TimeBudgetCheck(Callback):
    """Logs, once, the updates and epochs the time budget holds on this machine; warns if too few."""

    def __init__(
        self,
        budget_s: float,
        warmup_steps: int,
        average_last: int,
        every_n_updates: int | None = None,
        probe: int = PROBE_UPDATES,
    ) -> None:
        """budget_s: ``trainer.max_time`` in seconds; the schedule's warmup updates and the
        checkpoints it averages (epoch ones, or every ``every_n_updates`` updates)."""
        self.budget_s, self.warmup_steps, self.average_last = budget_s, warmup_steps, average_last
        self.every_n_updates, self.probe = every_n_updates, probe
        self._start: tuple[float, int] | None = None
        self._done = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._done or not trainer.is_global_zero:
            return
        now, step = time.perf_counter(), trainer.global_step
        if self._start is None:  # after the first update: compiling and warm-up are not timed
            self._start = (now, step)
            return
        timed = step - self._start[1]
        epoch_ends = batch_idx + 1 >= trainer.num_training_batches
        if timed == 0 or (timed < self.probe and not epoch_ends):
            return
        self._done = True
        seconds_per_update = (now - self._start[0]) / timed
        per_epoch = max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))
        f = forecast(
            seconds_per_update,
            self.budget_s,
            per_epoch,
            self.warmup_steps,
            self.average_last,
            self.every_n_updates,
        )
        said = (
            f"time budget: trainer.max_time holds about {f.updates:,} updates ({f.epochs:.1f} epochs of "
            f"{per_epoch}) at this machine's {seconds_per_update:.2f} s per update (measured over "
            f"{timed} updates; validation not counted)"
        )
        if not f.too_short:
            logger.info(said)
            return
        logger.warning(
            "%s: too few for this schedule, which warms up over lr.warmup_steps=%d updates and "
            "averages the last average_last=%d checkpoints; it needs about %s updates (%dx warmup, %dx "
            "the averaged checkpoints' span). Give trainer.max_time=%s for that on this machine, or lower "
            "lr.warmup_steps and average_last.",
            said,
            self.warmup_steps,
            self.average_last,
            f"{f.updates_needed:,}",
            WARMUP_MULTIPLE,
            AVERAGE_MULTIPLE,
            as_max_time(f.seconds_needed),
        )
