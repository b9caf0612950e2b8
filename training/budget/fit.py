"""A time-limited run that fits itself to the updates it will get (``budget.fit: budget``).

:class:`BudgetFit` measures the run's speed early (after ``forecast.PROBE_UPDATES`` updates, or the
first epoch if shorter) and forecasts the updates ``trainer.max_time`` holds, validation counted;
then it has the learning rate fitted to them (:mod:`training.lr.fitted`, a part of the module's
:class:`~training.lr.LearningRate`), chooses the updates whose weights are averaged
(:mod:`training.budget.points`), and says so in one log line. After the first validation it knows
what a validation costs: it validates every k epochs so that validation takes at most
``budget.validation_share`` of the time, and forecasts again; after later validations it forecasts
again where the speed measured since that first validation (every update of the steady epochs, not
the last epoch's alone: one epoch of a shared 2-core host reads its speed 10% off either way) moved
the forecast by more than ``budget.drift``, as often as that happens (``budget.refits``, -1: no
limit), each fit starting from the rate the run has, so the rate never jumps. A limit of 3, chasing
single epochs, ended a Zen 3's 60-minute decay at update 7,299 of the 8,010 it trained, 9% of the
run at the floor (``docs/long_runs.md``). No forecast passes the update where the run's own limits
end it (``trainer.max_steps``, ``trainer.max_epochs``: a budget that holds more would fit a decay the
run never finishes). A run resumed with another budget (``trainer.max_time``)
or another limit that bounds its forecast forecasts again, at the speed last measured, and the rate
is fitted to the new end (:func:`training.lr.fitted.rejoin_schedule`). Once the time limit stops the
run, no validation follows (Lightning would run one; :class:`training.budget.timer.BudgetTimer`):
the best checkpoint and early stopping keep what the run validated.

Its state (the budget, the forecasts, the updates taken for the average) is saved in every
checkpoint, the fitted rate in the learning rate's, and the averaged weights are files of their
own: a resumed run continues bit-exactly, and no checkpoint carries a copy of the model.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from training.budget.forecast import PROBE_UPDATES, forecast, run_limit
from training.budget.points import average_points, legacy_sum, point_path, write_point
from training.budget.settings import BudgetSettings
from training.lr import LearningRate, RateSettings
from training.lr.fitted import Fit, fit_schedule, rejoin_schedule

logger = logging.getLogger(__name__)


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
    """Fits the learning rate and the averaged weights to the updates the budget holds (module docstring).

    Args:
        budget_s: ``trainer.max_time`` in seconds.
        settings: the ``budget`` settings.
        average_last: the weights averaged (``average_last``; fewer than 2: no average).
        ckpt_dir: where the averaged weights' files go (the run's ``checkpoints/``).
        every_n_updates: ``checkpoint.every_n_updates`` (the run validates every N updates,
            not every epoch: the interval is not paced then).
        probe: updates timed before the first forecast.
        clock: seconds, monotonic (``time.perf_counter``; tests give their own).
    """

    def __init__(
        self,
        budget_s: float,
        settings: BudgetSettings,
        average_last: int,
        ckpt_dir: Path,
        every_n_updates: int | None = None,
        probe: int = PROBE_UPDATES,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.budget_s, self.settings, self.average_last = budget_s, settings, average_last
        self.ckpt_dir, self.every_n_updates, self.probe, self.clock = (
            Path(ckpt_dir),
            every_n_updates,
            probe,
            clock,
        )
        # Saved in checkpoints (state_dict): what a resumed run must continue with.
        self.elapsed = 0.0  # seconds of fit before this process (a resumed run's offset)
        self.forecast_updates: int | None = None
        self.refits = 0
        self.val_every = 1
        self.val_seconds: list[float] = []
        self.points: list[int] = []  # the updates whose weights are averaged
        self.taken: list[int] = []  # those written (training/budget/points.py), in order
        self.said: dict[str, Any] = {}
        # This process only.
        self._start: float | None = None  # clock at train start
        self._timed: tuple[float, int, float] | None = None  # (clock, update, validation s so far)
        self._steady = False  # the speed is measured from this process's first validation on
        self._val_start: float | None = None
        self._val_total = 0.0
        # Why a resumed run forecasts again: its trainer.max_time, or the update its own limits end
        # it at (trainer.max_steps, trainer.max_epochs: :func:`_run_limit`), changed; None: neither.
        self._changed: str | None = None
        self._saved_limit: int | None = None  # the run limit's update when the checkpoint was saved
        self._legacy: tuple[Path, float] | None = None  # an old checkpoint's summed weights, as a file

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
            share = self.settings.validation_share  # before the first validation: at most its share
        remaining = max(self.budget_s - self._elapsed(), 0.0)
        updates = step + int(remaining * (1.0 - share) / seconds_per_update)
        limit = _run_limit(trainer)
        return updates if limit is None else min(updates, limit[0])

    # ------------------------------------------------------------------ fitting

    def _agreed(self, trainer: L.Trainer, updates: int) -> int:
        """Rank 0's forecast and validation interval, on every rank: one schedule for all (every
        rank calls this at the same points: a collective)."""
        updates, self.val_every = trainer.strategy.broadcast((updates, self.val_every))
        return updates

    def _fit(self, trainer: L.Trainer, pl_module: L.LightningModule, updates: int, why: str) -> None:
        """Has the learning rate fitted to ``updates`` (the same on every rank: :meth:`_agreed`),
        chooses the averaged updates, and says so."""
        if self.every_n_updates is None:
            trainer.check_val_every_n_epoch = self.val_every
        rate: LearningRate = pl_module.learning_rate
        lr = rate.settings
        step = trainer.global_step + 1  # the next update's (the scheduler has stepped)
        per_epoch = _updates_per_epoch(trainer)
        needed = forecast(1.0, 1.0, per_epoch, lr.warmup_steps, self.average_last, self.every_n_updates)
        current = rate.factor(step)
        if self._changed is not None and rate.fitted is not None:
            fit = rejoin_schedule(updates, step, current, rate.fitted, self.settings.warmup_fraction)
        else:
            fit = fit_schedule(
                updates, step, current, lr.schedule, lr.warmup_steps, lr.min_ratio,
                needed.updates_needed, self.settings.warmup_fraction, rate.fitted,
            )  # fmt: skip
        if fit.schedule is not None:
            rate.refit(fit.schedule)
        self.forecast_updates = updates
        self._choose_points(trainer, updates, per_epoch, fit)
        self._say(trainer, updates, why, fit, needed.updates_needed, lr, current)

    def _choose_points(self, trainer: L.Trainer, updates: int, per_epoch: int, fit: Fit) -> None:
        """The updates whose weights are averaged: none where the configured schedule stands (so
        does its averaging, the last epochs'); else from the forecast's last part. A budget changed
        on resume drops the weights taken outside its new last part."""
        if fit.schedule is None:
            points = []
        else:
            points = average_points(updates, per_epoch, self.average_last, self.settings.average_fraction)
        if self._changed is not None:
            first = min(points, default=updates + 1)
            stale = [t for t in self.taken if t < first]
            for t in stale:
                point_path(self.ckpt_dir, t).unlink(missing_ok=True)
            self.taken = [t for t in self.taken if t >= first]
            self._changed = None
        self.points = sorted({p for p in points if p > trainer.global_step} | set(self.taken))

    def _say(
        self,
        trainer: L.Trainer,
        updates: int,
        why: str,
        fit: Fit,
        needed: int,
        lr: RateSettings,
        current: float,
    ) -> None:
        """The fit's one log line, and what results.json records of it."""
        step = trainer.global_step + 1
        per_epoch = _updates_per_epoch(trainer)
        seconds = self._seconds_per_update(trainer.global_step) or self.said.get("seconds_per_update") or 0.0
        floor = lr.min_ratio
        val = (
            f"validation every {self.val_every} epoch(s), {self.val_seconds[-1]:.1f} s each"
            if self.val_seconds
            else f"validation counted at most {self.settings.validation_share:.0%} of the time"
        )
        schedule = _schedule_phrase(fit, step, lr, needed, current, self.settings.warmup_fraction)
        if self.points:
            average = (
                f"averaging the weights of updates {', '.join(f'{p:,}' for p in self.points)} (the last "
                f"{self.settings.average_fraction:.0%})"
            )
        elif fit.schedule is None and self.average_last > 1:
            average = f"averaging the last {self.average_last} epoch checkpoints, as configured"
        else:
            average = "no average"

        limit = _run_limit(trainer)
        ends = (
            f"{limit[1]} ends the run before the budget does, at"
            if limit is not None and updates >= limit[0]
            else "the budget holds"
        )
        logger.info(
            "schedule fit (%s): %s ~%s updates (%.1f epochs) at %.2f s per update, %s: %s; %s",
            why,
            ends,
            f"{updates:,}",
            updates / per_epoch,
            seconds,
            val,
            schedule,
            average,
        )
        self.said = {
            "forecast_updates": updates,
            "ended_by": limit[1] if limit is not None and updates >= limit[0] else "trainer.max_time",
            "seconds_per_update": seconds,
            "warmup": fit.warmup,
            "schedule": fit.shape,
            "fitted": fit.schedule is not None,
            "decay_end": None if fit.schedule is None else fit.schedule.end,
            "floor": floor,
            "averaged_updates": list(self.points),
            "validate_every_epochs": self.val_every,
            "validation_seconds": self.val_seconds[-1] if self.val_seconds else None,
            "refits": self.refits,
            "why": why,
        }

    def holds_stopping(self, update: int) -> str | None:
        """Why early stopping must wait at ``update`` (:mod:`training.stopping`): the rate fitted to
        the budget is still decaying to its floor, whose end is the budget's; None where nothing
        was fitted (the configured schedule stands), the decay has ended, or
        ``budget.early_stopping=patience`` (the default)."""
        end = self.said.get("decay_end")
        if self.settings.early_stopping != "after_decay" or not self.said.get("fitted") or end is None:
            return None
        if update >= end:
            return None
        return (
            f"the rate fitted to the budget decays until update {end:,} and the averaged weights come "
            "from its last part (budget.early_stopping=after_decay; patience: stop now)"
        )

    # ------------------------------------------------------------------ hooks

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = self.clock()
        if self.val_every > 1 and self.every_n_updates is None:  # a resumed run validates as it did
            trainer.check_val_every_n_epoch = self.val_every
        self._changed = self._changed or self._limit_changed(trainer)
        limit = _run_limit(trainer)
        self._saved_limit = None if limit is None else limit[0]
        speed = self.said.get("seconds_per_update")
        if self._changed is not None and speed:  # another budget: forecast again at once, at the
            # speed last measured (later validations refit where it drifted), so that no update
            # trains at the old end's floor
            step = trainer.global_step
            updates = self._agreed(trainer, self._forecast(trainer, step, float(speed)))
            self._fit(trainer, pl_module, updates, self._changed)

    def _limit_changed(self, trainer: L.Trainer) -> str | None:
        """Why a resumed run's forecast no longer stands where its run limit moved: the old limit
        bounded it, or the new one falls before it; None where neither (or nothing was forecast)."""
        if self.forecast_updates is None:
            return None
        limit = _run_limit(trainer)
        now = None if limit is None else limit[0]
        bounded = self._saved_limit is not None and self.forecast_updates >= self._saved_limit
        if now == self._saved_limit or not (bounded or (now is not None and now < self.forecast_updates)):
            return None
        was = "none" if self._saved_limit is None else f"update {self._saved_limit:,}"
        setting = "trainer.max_steps, trainer.max_epochs" if limit is None else limit[1]
        to = "none" if now is None else f"update {now:,}"
        return f"the run's limit changed on resume ({setting}): {was} to {to}"

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step in self.points and step not in self.taken:
            self._take(pl_module, step)
        if self._timed is None:  # after the first update: its compiling and warm-up are not timed
            self._timed = (self.clock(), step, self._val_total)
            return
        if self.forecast_updates is not None and self._changed is None:
            return
        epoch_ends = batch_idx + 1 >= trainer.num_training_batches
        timed = step - self._timed[1]
        if timed == 0 or (timed < self.probe and not epoch_ends):
            return
        updates = self._agreed(trainer, self._forecast(trainer, step, self._seconds_per_update(step)))
        self._fit(trainer, pl_module, updates, self._changed or f"{timed} updates timed")

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
            self.val_every = validation_interval(
                seconds, per_update, per_epoch, self.settings.validation_share
            )
        updates = self._agreed(trainer, self._forecast(trainer, step, per_update))
        if first:
            self._fit(trainer, pl_module, updates, "the first validation measured")
        elif (
            self.forecast_updates
            and abs(updates - self.forecast_updates) > self.settings.drift * self.forecast_updates
        ):
            if self.settings.refits < 0 or self.refits < self.settings.refits:
                self.refits += 1
                self._fit(trainer, pl_module, updates, f"the speed drifted: forecast again ({self.refits})")
        # Later forecasts measure the speed from this process's first validation on, over every
        # update since: not the first epoch's (slower: every new batch shape makes its kernels
        # then), and not one epoch's alone (a shared host's noise).
        if not self._steady:
            self._timed, self._steady = (self.clock(), step, self._val_total), True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        # The budget ended before the last averaged update: the weights it ended with stand for it.
        if self.points and self.taken and self.taken[-1] < step < self.points[-1]:
            self._take(pl_module, step)

    def _take(self, pl_module: L.LightningModule, step: int) -> None:
        if pl_module.trainer.is_global_zero:
            write_point(pl_module.model, self.ckpt_dir, step)
        self.taken.append(step)

    def average(self) -> tuple[list[Path], list[float]] | None:
        """The files of the weights taken, and how many updates each stands for (1, but for an old
        checkpoint's sum), to average (:func:`training.average.average_checkpoints`); None for
        fewer than two."""
        paths = [point_path(self.ckpt_dir, step) for step in self.taken]
        weights = [1.0] * len(paths)
        if self._legacy is not None:
            paths, weights = [self._legacy[0], *paths], [self._legacy[1], *weights]
        if sum(weights) < 2:
            return None
        return paths, weights

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "budget_s": self.budget_s,
            "elapsed": self._elapsed(),
            "forecast_updates": self.forecast_updates,
            "refits": self.refits,
            "val_every": self.val_every,
            "val_seconds": list(self.val_seconds),
            "points": list(self.points),
            "taken": list(self.taken),
            "said": dict(self.said),
            "run_limit": self._saved_limit,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.elapsed = float(state_dict["elapsed"])
        self.forecast_updates = state_dict["forecast_updates"]
        self.refits = int(state_dict["refits"])
        self.val_every = int(state_dict["val_every"])
        self.val_seconds = list(state_dict["val_seconds"])
        self.points = list(state_dict["points"])
        self.taken = list(state_dict["taken"])
        self.said = dict(state_dict["said"])
        self._saved_limit = state_dict.get("run_limit")  # absent before the key: no limit known
        budget = state_dict.get("budget_s")
        if budget is not None and float(budget) != self.budget_s:  # forecast again once timed
            self._changed = (
                f"trainer.max_time changed on resume, {float(budget):.0f} s to {self.budget_s:.0f} s"
            )
        summed = state_dict.get("summed")
        if summed and self.taken:  # a checkpoint from before the weights were files: their sum as one
            self._legacy = legacy_sum(summed, self.taken, self.ckpt_dir)
            self.taken = []


def _schedule_phrase(
    fit: Fit, step: int, lr: RateSettings, needed: int, current: float, warmup_fraction: float
) -> str:
    """What the fit did to the schedule, in the words of its log line."""
    name, warmup, floor = lr.schedule, lr.warmup_steps, lr.min_ratio
    if fit.schedule is None:
        return f"{name} as configured (warmup {warmup}): the budget holds the ~{needed:,} updates it needs"
    first = fit.schedule.segments[0]
    if fit.warmup > step:
        share = f"at most {warmup_fraction:.0%} of the forecast"
        warm = f"warmup {fit.warmup} updates (lr.warmup_steps={warmup}, {share}), "
    elif len(fit.schedule.segments) > 1 and first.end_factor > current:
        warm = f"from {current:.3g}x the peak back up to {first.end_factor:.3g}x by update {first.end:,}, "
    else:
        warm = "warmup done, "  # (a refit's decay starts where the one before left off)
    return f"{warm}then {fit.shape} to {floor:g}x the peak at update {fit.schedule.end:,}" + (
        "" if fit.holds else f" ({name} needs ~{needed:,})"
    )


def _updates_per_epoch(trainer: L.Trainer) -> int:
    return max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))


def _run_limit(trainer: L.Trainer) -> tuple[int, str] | None:
    """The update ``trainer.max_steps`` or ``trainer.max_epochs`` ends the run at, whichever is first."""
    return run_limit(trainer.max_steps, trainer.max_epochs, _updates_per_epoch(trainer))


__all__ = ["BudgetFit", "validation_interval"]
