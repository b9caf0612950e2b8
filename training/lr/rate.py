"""The learning rate of every update: one object, its parts, its state.

:class:`LearningRate` answers one question, the multiplier of the peak rate (``lr.peak``) at
update ``step`` (from 1), from four parts:

* **the shape** (``lr.schedule``, ``lr.warmup_steps``, ``lr.total_steps``, ``lr.min_ratio``:
  :mod:`training.lr.shapes`), read ``offset`` updates on, where a fine-tuned run continues the
  schedule of the checkpoint it starts from (``finetune.reset`` without ``schedule``);
* **the fitted segments** that a time-limited run's budget (:mod:`training.budget`) sets from the
  update it fitted at on (:mod:`training.lr.fitted`), which replace the shape from there;
* **the plateau's scale** (``lr.schedule: plateau``: :mod:`training.lr.plateau`), lowered by the
  validations that do not improve the selection metric.

It is fairseq's ``lr_scheduler`` made one thing: the trainer asks it once per update
(:class:`training.lr.scheduler.RateScheduler`, the only writer of the optimizer's rate) and tells
it each validation (:meth:`LearningRate.validated`), the budget refits it (:meth:`refit`), and its
:meth:`state_dict` is the one the checkpoint keeps (inside the scheduler's), so that a resumed run
takes the same rate, and a fine-tuned one may carry it on (:meth:`carried`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from training.lr.fitted import FittedSchedule
from training.lr.plateau import Plateau
from training.lr.shapes import FLAT, NEEDS_TOTAL, SCHEDULES, schedule_factor


@dataclass(frozen=True)
class RateSettings:
    """The ``lr`` config group (conf/train.yaml): the peak and the shape of the learning rate.

    Attributes:
        peak: the rate at the end of warmup.
        schedule: the shape after warmup (:data:`training.lr.shapes.SCHEDULES`).
        warmup_steps: updates of the linear warmup.
        total_steps: where ``cosine``/``linear`` reach their floor; None: the run's length.
        min_ratio: ``cosine``/``linear``'s floor, ``plateau``'s lowest, a fraction of the peak.
        plateau_factor: ``plateau``'s multiplier at each plateau.
        plateau_patience: ``plateau``'s validations without improvement that make one.
    """

    peak: float = 5e-4
    schedule: str = "inverse_sqrt"
    warmup_steps: int = 4000
    total_steps: int | None = None
    min_ratio: float = 0.0
    plateau_factor: float = 0.5
    plateau_patience: int = 2

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"lr.schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if not self.peak >= 0.0:
            raise ValueError(f"lr.peak must be at least 0, not {self.peak}")
        if self.warmup_steps < 0:
            raise ValueError(f"lr.warmup_steps must be at least 0, not {self.warmup_steps}")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ValueError(f"lr.min_ratio must be within [0, 1], not {self.min_ratio}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RateSettings:
        """From the ``lr`` config group (plain values); missing keys take their defaults.

        Raises:
            ValueError: a key that is not one of the group's, naming it, or a bad value.
        """
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"lr: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
        typed = {k: v for k, v in values.items() if v is not None or k == "total_steps"}
        for key in ("peak", "min_ratio", "plateau_factor"):
            if key in typed:
                typed[key] = float(typed[key])
        for key in ("warmup_steps", "plateau_patience"):
            if key in typed:
                typed[key] = int(typed[key])
        if typed.get("total_steps") is not None:
            typed["total_steps"] = int(typed["total_steps"])
        return cls(**typed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Shape:
    """A shape resolved for a run: its name, warmup, the update where a decaying one ends (None
    for the others) and its floor."""

    name: str
    warmup_steps: int
    total_steps: int | None
    min_ratio: float

    def factor(self) -> Callable[[int], float]:
        return schedule_factor(self.name, self.warmup_steps, self.total_steps, self.min_ratio)

    @property
    def floor_from(self) -> float:
        """The first update at its floor: ``total_steps`` for a decaying shape, never for the others."""
        return float(self.total_steps) if self.name in NEEDS_TOTAL and self.total_steps else math.inf


class LearningRate:
    """The multiplier of the peak rate at every update, from its parts (module docstring).

    Args:
        settings: the ``lr`` config group.
        mode: the selection metric's direction (``max`` or ``min``), which the plateau judges by.
        fitted_to_budget: a time budget fits the decay's end (``budget.fit: budget``): until its
            first fit, a few updates into the warmup, a decaying shape without ``lr.total_steps``
            ends at the trainer's estimate or, where that is shorter, just past its warmup.
    """

    def __init__(self, settings: RateSettings, mode: str = "max", fitted_to_budget: bool = False) -> None:
        self.settings = settings
        self.fitted_to_budget = fitted_to_budget
        self.shape: Shape | None = None  # resolved by start(), or carried from a checkpoint
        self._factor: Callable[[int], float] = lambda step: 1.0
        self.offset = 0  # updates a continued schedule had run before this run's first
        self.fitted: FittedSchedule | None = None
        self.plateau = (
            Plateau(mode, settings.plateau_factor, settings.plateau_patience, settings.min_ratio)
            if settings.schedule == "plateau"
            else None
        )

    # ------------------------------------------------------------------ the rate

    def start(self, run_updates: Callable[[], int]) -> None:
        """Resolves the shape for the run: a decaying one ends at ``lr.total_steps``, else at
        ``run_updates()`` (asked only then: the trainer's estimate). A carried shape stays."""
        if self.shape is None:
            s = self.settings
            total = s.total_steps if s.schedule not in NEEDS_TOTAL or s.total_steps else run_updates()
            if self.fitted_to_budget and total is not None and s.schedule in NEEDS_TOTAL:
                total = max(total, s.warmup_steps + 1)  # the budget's fit sets the end
            self._set_shape(Shape(s.schedule, s.warmup_steps, total, s.min_ratio))

    def _set_shape(self, shape: Shape) -> None:
        self._factor = shape.factor()  # refuses a decaying shape without an end past its warmup
        self.shape = shape

    def factor(self, step: int) -> float:
        """The multiplier of update ``step`` (from 1)."""
        fitted = self.fitted
        if fitted is not None and step >= fitted.start:
            base = fitted.factor(step)
        else:
            base = self._factor(step + self.offset)
        return base if self.plateau is None else base * self.plateau.scale

    def value(self, step: int) -> float:
        """The rate of update ``step``: the peak times :meth:`factor`."""
        return self.settings.peak * self.factor(step)

    # ------------------------------------------------------------------ what changes it

    def validated(self, value: float) -> bool:
        """One validation's selection metric; returns whether the rate changed (a plateau)."""
        if self.plateau is None or not math.isfinite(value):
            return False
        return self.plateau.observe(value)

    def refit(self, schedule: FittedSchedule) -> None:
        """The budget's fitted segments, from their first update on (:mod:`training.budget.fit`)."""
        self.fitted = schedule

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "shape": None if self.shape is None else asdict(self.shape),
            "offset": self.offset,
            "fitted": None if self.fitted is None else self.fitted.state_dict(),
            "plateau": None if self.plateau is None else self.plateau.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run's parts: its offset, fitted segments and plateau. The shape stays this
        run's configured one (``resume.allow_changes`` may have let its keys change)."""
        self.offset = int(state.get("offset") or 0)
        fitted = state.get("fitted")
        self.fitted = None if fitted is None else FittedSchedule.from_state_dict(fitted)
        if self.plateau is not None and state.get("plateau") is not None:
            self.plateau.load_state_dict(state["plateau"])

    def carry(self, state: dict[str, Any], updates: int) -> None:
        """Continues the schedule of a checkpoint trained ``updates`` updates (``state``, its
        :meth:`state_dict`): its shape, offset and fitted segments, moved so that this run's update
        1 takes the checkpoint's update ``updates + 1``, and its plateau's scale (its count starts
        afresh).

        Raises:
            ValueError: the checkpoint's schedule is at its floor from this run's first update on
                (a decaying shape or a fit that ended by the checkpoint's update): continued, the run
                would train at the floor throughout; the message says so, for the caller to name
                the part.
        """
        shape = state.get("shape")
        if shape is None:
            raise ValueError("it does not say what its schedule's shape was")
        self._set_shape(Shape(**shape))
        self.offset = int(state.get("offset") or 0) + updates
        fitted = state.get("fitted")
        self.fitted = None if fitted is None else FittedSchedule.from_state_dict(fitted).shifted(-updates)
        plateau = state.get("plateau") or {}
        if self.plateau is not None and "scale" in plateau:
            self.plateau.scale = float(plateau["scale"])
        floor_from = self.fitted.end if self.fitted is not None else self.shape.floor_from - self.offset
        if floor_from <= 1:  # update 1 already at the floor
            ended = int(updates + floor_from)
            name = "schedule fitted to its budget" if self.fitted is not None else f"{shape['name']} schedule"
            floor = self.fitted.floor if self.fitted is not None else shape["min_ratio"]
            raise ValueError(
                f"its {name} reaches its floor ({floor:g}x the peak) at update {ended}, by the checkpoint's "
                f"update {updates}: continued, this run would train at the floor throughout"
            )

    def describe(self) -> str:
        """What the rate is made of, for the log."""
        shape = self.shape
        if shape is None:
            return f"{self.settings.schedule} (not started)"
        said = f"{shape.name}, warmup {shape.warmup_steps}"
        if shape.total_steps is not None and shape.name in NEEDS_TOTAL:
            said += f", to {shape.min_ratio:g}x the peak at update {shape.total_steps}"
        if self.offset:
            said += f", read {self.offset} updates on"
        if self.fitted is not None:
            said += f", fitted from update {self.fitted.start} to {self.fitted.end}"
        if self.plateau is not None and self.plateau.scale != 1.0:
            said += f", scaled {self.plateau.scale:g}"
        return said


__all__ = ["FLAT", "NEEDS_TOTAL", "SCHEDULES", "LearningRate", "RateSettings", "Shape"]
