"""A time-limited run that fits itself to the updates it will get (``schedule.fit: budget``).

:class:`BudgetFit` measures the run's speed early (after ``budget.PROBE_UPDATES`` updates, or the
first epoch if shorter) and forecasts the updates ``trainer.max_time`` holds, validation counted;
then it fits the learning-rate schedule and the averaged weights to them (``schedule_fit.py``),
and says so in one log line. After the first validation it knows what a validation costs: it
validates every k epochs so that validation takes at most ``validation.max_share`` of the time,
and forecasts again; after later validations it forecasts again where the measured speed drifted
(a shared machine), at most ``schedule.refits`` times, each fit starting from the rate the run
has, so the rate never jumps. Once the time limit stops the run, no validation follows (Lightning
would run one; :class:`BudgetTimer`): the best checkpoint and early stopping keep what the run
validated.

Its state (the fit, the forecasts, the weights summed for the average) is saved in every
checkpoint, and the module holds the fitted schedule (``TranslationModule.fitted_schedule``), so
a resumed run continues the same schedule bit-exactly.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Timer

from training.budget import PROBE_UPDATES, forecast
from training.schedule_fit import FittedSchedule, average_points, fit_schedule

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitSettings:
    """The ``schedule`` and ``validation`` settings of a fitted run (``conf/train.yaml``).

    Attributes:
        warmup_fraction: the fitted warmup's most, as a fraction of the forecast updates.
        average_fraction: the averaged weights come from this last fraction of them.
        refits: forecasts after the first validation's, where the speed drifted, at most.
        drift: how far a new forecast must differ (a fraction) to fit again.
        max_share: the share of the time validation may take.
    """

    warmup_fraction: float = 0.4
    average_fraction: float = 0.2
    refits: int = 3
    drift: float = 0.03
    max_share: float = 0.1

    def __post_init__(self) -> None:
        for name in ("warmup_fraction", "average_fraction", "drift", "max_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], not {getattr(self, name)}")
        if self.refits < 0:
            raise ValueError(f"schedule.refits must be at least 0, not {self.refits}")


def validation_interval(
    val_s: float, seconds_per_update: float, updates_per_epoch: int, max_share: float
) -> int:
    """Epochs between validations, the fewest for which validation's share of the time,
    ``val_s / (val_s + k * epoch_s)``, is at most ``max_share``."""
    epoch_s = seconds_per_update * updates_per_epoch
    if epoch_s <= 0:
        return 1
    return max(1, math.ceil(val_s * (1.0 - max_share) / (max_share * epoch_s) - 1e-9))


class BudgetFit(Callback):
    """Fits the schedule and the averaged weights to the updates the budget holds (module docstring).

    Args:
        budget_s: ``trainer.max_time`` in seconds.
        settings: :class:`FitSettings`.
        schedule: the configured schedule's name; ``warmup_steps``, ``min_ratio``: its warmup and floor.
        average_last: the weights averaged (``average_last``; fewer than 2: no average).
        every_n_updates: ``checkpoint.every_n_updates`` (the run validates every N updates,
            not every epoch: the interval is not paced then).
        probe: updates timed before the first forecast.
        clock: seconds, monotonic (``time.perf_counter``; tests give their own).
    """

    def __init__(
        self,
        budget_s: float,
        settings: FitSettings,
        schedule: str,
        warmup_steps: int,
        min_ratio: float,
        average_last: int,
        every_n_updates: int | None = None,
        probe: int = PROBE_UPDATES,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.budget_s, self.settings, self.schedule = budget_s, settings, schedule
        self.warmup_steps, self.min_ratio, self.average_last = warmup_steps, min_ratio, average_last
        self.every_n_updates, self.probe, self.clock = every_n_updates, probe, clock
        # Saved in checkpoints (state_dict): what a resumed run must continue with.
        self.elapsed = 0.0  # seconds of fit before this process (a resumed run's offset)
        self.forecast_updates: int | None = None
        self.refits = 0
        self.val_every = 1
        self.val_seconds: list[float] = []
        self.points: list[int] = []  # the updates whose weights are averaged
        self.summed: dict[str, torch.Tensor] = {}
        self.taken: list[int] = []
        self.said: dict[str, Any] = {}
        # This process only.
        self._start: float | None = None  # clock at train start
        self._timed: tuple[float, int, float] | None = None  # (clock, update, validation s so far)
        self._val_start: float | None = None
        self._val_total = 0.0

    # ------------------------------------------------------------------ measuring

    def _elapsed(self) -> float:
        return self.elapsed + (0.0 if self._start is None else self.clock() - self._start)

    def _seconds_per_update(self, step: int) -> float | None:
        if self._timed is None or step <= self._timed[1]:
            return None
        since, first, val_before = self._timed
        return max(self.clock() - since - (self._val_total - val_before), 1e-9) / (step - first)

    def _forecast(self, trainer: L.Trainer, step: int, seconds_per_update: float) -> int:
        """Updates at the end: those done and those the rest of the budget holds, less validation's share."""
        per_epoch = _updates_per_epoch(trainer)
        if self.val_seconds:
            val_s = sum(self.val_seconds) / len(self.val_seconds)
            span = seconds_per_update * (
                per_epoch * self.val_every if self.every_n_updates is None else self.every_n_updates
            )
            share = val_s / (val_s + span)
        else:
            share = self.settings.max_share  # before the first validation: at most its share
        remaining = max(self.budget_s - self._elapsed(), 0.0)
        return step + int(remaining * (1.0 - share) / seconds_per_update)

    # ------------------------------------------------------------------ fitting

    def _agreed(self, trainer: L.Trainer, updates: int) -> int:
        """Rank 0's forecast and validation interval, on every rank: one schedule for all (every
        rank calls this at the same points: a collective)."""
        updates, self.val_every = trainer.strategy.broadcast((updates, self.val_every))
        return updates

    def _fit(self, trainer: L.Trainer, pl_module: L.LightningModule, updates: int, why: str) -> None:
        """Fits to ``updates`` (the same on every rank: :meth:`_agreed`) and says so."""
        if self.every_n_updates is None:
            trainer.check_val_every_n_epoch = self.val_every
        step = trainer.global_step + 1  # the next update's (the scheduler has stepped)
        per_epoch = _updates_per_epoch(trainer)
        needed = forecast(1.0, 1.0, per_epoch, self.warmup_steps, self.average_last, self.every_n_updates)
        fit = fit_schedule(
            updates,
            step,
            pl_module.lr_factor(step),
            self.schedule,
            self.warmup_steps,
            self.min_ratio,
            needed.updates_needed,
            self.settings.warmup_fraction,
            pl_module.fitted_schedule,
        )
        if fit.schedule is not None:
            pl_module.fitted_schedule = fit.schedule
        self.forecast_updates = updates
        if fit.schedule is None:  # the configured schedule stands: so does its averaging (the last epochs')
            points = []
        else:
            points = average_points(updates, per_epoch, self.average_last, self.settings.average_fraction)
        self.points = sorted({p for p in points if p > trainer.global_step} | set(self.taken))
        seconds = self._seconds_per_update(trainer.global_step) or 0.0
        val = (
            f"validation every {self.val_every} epoch(s), {self.val_seconds[-1]:.1f} s each"
            if self.val_seconds
            else f"validation counted at most {self.settings.max_share:.0%} of the time"
        )
        if fit.schedule is None:
            schedule = (
                f"{self.schedule} as configured (warmup {self.warmup_steps}): the budget holds the "
                f"~{needed.updates_needed:,} updates it needs"
            )
        else:
            if fit.warmup > step:
                warm = (
                    f"warmup {fit.warmup} updates (optimizer.warmup_steps={self.warmup_steps}, at most "
                    f"{self.settings.warmup_fraction:.0%} of the forecast), "
                )
            else:
                warm = f"warmup {fit.warmup} updates (done), "
            schedule = (
                f"{warm}then {fit.shape} to {self.min_ratio:g}x the peak at update {fit.schedule.end:,}"
                + ("" if fit.holds else f" ({self.schedule} needs ~{needed.updates_needed:,})")
            )
        if self.points:
            average = (
                f"averaging the weights of updates {', '.join(f'{p:,}' for p in self.points)} (the last "
                f"{self.settings.average_fraction:.0%})"
            )
        elif fit.schedule is None and self.average_last > 1:
            average = f"averaging the last {self.average_last} epoch checkpoints, as configured"
        else:
            average = "no average"

        logger.info(
            "schedule fit (%s): the budget holds ~%s updates (%.1f epochs) at %.2f s per update, %s: %s; %s",
            why,
            f"{updates:,}",
            updates / per_epoch,
            seconds,
            val,
            schedule,
            average,
        )
        self.said = {
            "forecast_updates": updates,
            "seconds_per_update": seconds,
            "warmup": fit.warmup,
            "schedule": fit.shape,
            "fitted": fit.schedule is not None,
            "decay_end": None if fit.schedule is None else fit.schedule.end,
            "floor": self.min_ratio,
            "averaged_updates": list(self.points),
            "validate_every_epochs": self.val_every,
            "validation_seconds": self.val_seconds[-1] if self.val_seconds else None,
            "refits": self.refits,
            "why": why,
        }

    # ------------------------------------------------------------------ hooks

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self.clock()
        if self.val_every > 1 and self.every_n_updates is None:  # a resumed run validates as it did
            trainer.check_val_every_n_epoch = self.val_every

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step in self.points and step not in self.taken:
            self._take(pl_module, step)
        if self._timed is None:  # after the first update: its compiling and warm-up are not timed
            self._timed = (self.clock(), step, self._val_total)
            return
        if self.forecast_updates is not None:
            return
        epoch_ends = batch_idx + 1 >= trainer.num_training_batches
        timed = step - self._timed[1]
        if timed == 0 or (timed < self.probe and not epoch_ends):
            return
        updates = self._agreed(trainer, self._forecast(trainer, step, self._seconds_per_update(step)))
        self._fit(trainer, pl_module, updates, f"{timed} updates timed")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._val_start = self.clock()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_start is None:
            return
        seconds = self.clock() - self._val_start
        self._val_start = None
        self._val_total += seconds
        first = not self.val_seconds
        self.val_seconds.append(seconds)
        step = trainer.global_step
        per_update = self._seconds_per_update(step)
        if per_update is None or trainer.should_stop:
            return
        if first and self.every_n_updates is None:
            per_epoch = _updates_per_epoch(trainer)
            self.val_every = validation_interval(seconds, per_update, per_epoch, self.settings.max_share)
        updates = self._agreed(trainer, self._forecast(trainer, step, per_update))
        if first:
            self._fit(trainer, pl_module, updates, "the first validation measured")
        elif (
            self.forecast_updates
            and abs(updates - self.forecast_updates) > self.settings.drift * self.forecast_updates
        ):
            if self.refits < self.settings.refits:
                self.refits += 1
                self._fit(trainer, pl_module, updates, f"the speed drifted: forecast again ({self.refits})")
        # The next forecast measures the speed from here: the latest updates, not the first
        # epoch's (slower: every new batch shape makes its kernels then).
        self._timed = (self.clock(), step, self._val_total)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        # The budget ended before the last averaged update: the weights it ended with stand for it.
        if self.points and self.taken and self.taken[-1] < step < self.points[-1]:
            self._take(pl_module, step)

    def _take(self, pl_module: L.LightningModule, step: int) -> None:
        for name, tensor in pl_module.model.state_dict().items():
            value = tensor.detach().to("cpu", torch.float64) if tensor.is_floating_point() else tensor.cpu()
            if name in self.summed and tensor.is_floating_point():
                self.summed[name] += value
            else:
                self.summed[name] = value.clone()
        self.taken.append(step)

    def average(self) -> dict[str, torch.Tensor] | None:
        """The model's weights averaged over the updates taken (``state_dict`` keys of the model),
        or None for fewer than two."""
        if len(self.taken) < 2:
            return None
        n = len(self.taken)
        return {k: v / n if v.is_floating_point() else v for k, v in self.summed.items()}

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "elapsed": self._elapsed(),
            "forecast_updates": self.forecast_updates,
            "refits": self.refits,
            "val_every": self.val_every,
            "val_seconds": list(self.val_seconds),
            "points": list(self.points),
            "summed": dict(self.summed),
            "taken": list(self.taken),
            "said": dict(self.said),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.elapsed = float(state_dict["elapsed"])
        self.forecast_updates = state_dict["forecast_updates"]
        self.refits = int(state_dict["refits"])
        self.val_every = int(state_dict["val_every"])
        self.val_seconds = list(state_dict["val_seconds"])
        self.points = list(state_dict["points"])
        self.summed = dict(state_dict["summed"])
        self.taken = list(state_dict["taken"])
        self.said = dict(state_dict["said"])


class BudgetTimer(Timer):
    """Lightning's ``Timer`` for ``trainer.max_time``, after which no validation runs: Lightning
    validates once more when the time limit stops a run mid-epoch, and nothing needs it (the best
    checkpoint and early stopping keep what the run validated; the averaged weights are taken apart)."""

    def _check_time_remaining(self, trainer: L.Trainer) -> None:
        assert self._duration is not None
        time_up = trainer.strategy.broadcast(self.time_elapsed() >= self._duration)
        trainer.should_stop = trainer.should_stop or time_up
        if time_up and trainer.limit_val_batches:
            trainer.limit_val_batches = 0
            logger.info(
                "time limit reached after %d s at update %d: the run stops, with no validation after it",
                int(self.time_elapsed()),
                trainer.global_step,
            )


def _updates_per_epoch(trainer: L.Trainer) -> int:
    return max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))


__all__ = ["BudgetFit", "BudgetTimer", "FitSettings", "FittedSchedule", "validation_interval"]
