"""The learning rate fitted to the updates a time-limited run will get (``budget.fit: budget``).

A schedule tuned for a long run wastes a short one: on a slow machine the recipe's 30 minutes end
barely past its 600-update warmup, with the rate still near its peak and the averaged checkpoints
taken during warmup. Under a fixed budget, a schedule that decays to its floor exactly where the
budget ends does better (Li, Yumer & Ramanan, "Budgeted training", ICLR 2020). So once the run has
measured its speed and forecast its updates ``U`` (:mod:`training.budget.fit`), :func:`fit_schedule` sets:

* **the warmup**: at most ``warmup_fraction`` of ``U``, never more than ``lr.warmup_steps``
  (where the run was fitted past that, still rising, it rises over as many updates more);
* **the decay**: the configured shape (``linear`` or ``cosine``) reaching ``lr.min_ratio``
  at ``U``; ``inverse_sqrt`` stays the paper's where ``U`` holds the schedule (its warmup twice
  over, and its averaged checkpoints' span twice over: :func:`training.budget.forecast.forecast`),
  and decays linearly to the floor at ``U`` where it does not.

A :class:`FittedSchedule` is a list of segments from the update where it was fitted, starting at
the rate the run had there, so that fitting, and fitting again when the measured speed drifts, never
makes the rate jump. A run resumed with another budget (a longer ``trainer.max_time``) is fitted
again to its new end by :func:`rejoin_schedule`: where it stopped at the floor of its old end, the
rate rises back, along a line from where it is, to the decay the new end gives, and follows it. It
is plain numbers (``state_dict``), one part of :class:`training.lr.rate.LearningRate`'s state.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SHAPES = ("linear", "cosine")


@dataclass(frozen=True)
class Segment:
    """The multiplier from update ``start`` (``start_factor``) to update ``end`` (``end_factor``),
    along ``shape``: ``linear``, or ``cosine`` (half a cosine)."""

    start: int
    end: int
    start_factor: float
    end_factor: float
    shape: str = "linear"

    def factor(self, step: int) -> float:
        progress = min(1.0, max(0.0, (step - self.start) / max(self.end - self.start, 1)))
        if self.shape == "cosine":
            progress = 0.5 * (1.0 - math.cos(math.pi * progress))
        return self.start_factor + (self.end_factor - self.start_factor) * progress


@dataclass(frozen=True)
class FittedSchedule:
    """The multiplier of the peak rate from the update it was fitted at on: ``segments`` in order,
    then ``floor``. Before ``segments[0].start`` the configured schedule applies."""

    segments: tuple[Segment, ...]
    floor: float

    @property
    def start(self) -> int:
        return self.segments[0].start

    @property
    def end(self) -> int:
        return self.segments[-1].end

    @property
    def warmup_end(self) -> int:
        """The update where its rise to the peak ends (its start where it starts past the peak)."""
        first = self.segments[0]
        return first.end if len(self.segments) > 1 and first.end_factor == 1.0 else first.start

    def shifted(self, by: int) -> FittedSchedule:
        """The same rates ``by`` updates later (a negative ``by``: earlier)."""
        segments = (
            Segment(s.start + by, s.end + by, s.start_factor, s.end_factor, s.shape) for s in self.segments
        )
        return FittedSchedule(tuple(segments), self.floor)

    def factor(self, step: int) -> float:
        for segment in self.segments:
            if step <= segment.end:
                return segment.factor(step)
        return self.floor

    def state_dict(self) -> dict:
        return {"segments": [asdict(s) for s in self.segments], "floor": self.floor}

    @classmethod
    def from_state_dict(cls, state: dict) -> FittedSchedule:
        return cls(tuple(Segment(**s) for s in state["segments"]), float(state["floor"]))


@dataclass(frozen=True)
class Fit:
    """What :func:`fit_schedule` decided, and why (for the log and ``results.json``).

    Attributes:
        schedule: the fitted schedule, or None where the configured one stays.
        updates: the forecast updates ``U``.
        warmup: the warmup's last update (the configured one where nothing was fitted).
        shape: ``linear``, ``cosine``, or the configured name where nothing was fitted.
        holds: whether ``U`` holds the configured schedule (``updates_needed``).
    """

    schedule: FittedSchedule | None
    updates: int
    warmup: int
    shape: str
    holds: bool


def fit_schedule(
    updates: int,
    step: int,
    current: float,
    name: str,
    warmup_steps: int,
    min_ratio: float,
    updates_needed: int,
    warmup_fraction: float,
    earlier: FittedSchedule | None = None,
) -> Fit:
    """The schedule from update ``step`` (whose multiplier is ``current``) to a forecast end.

    Args:
        updates: the forecast updates ``U`` of the whole run.
        step: the updates done.
        current: the multiplier the run is at.
        name: the configured schedule (``inverse_sqrt``, ``linear``, ``cosine``).
        warmup_steps: ``optimizer.warmup_steps``.
        min_ratio: ``optimizer.min_lr_ratio``, the floor.
        updates_needed: the updates the configured schedule needs (``budget.forecast``).
        warmup_fraction: the fitted warmup's most, as a fraction of ``U``.
        earlier: the schedule fitted before (a re-forecast keeps its warmup).

    Returns:
        The :class:`Fit`; its schedule starts at (``step``, ``current``).
    """
    holds = updates >= updates_needed
    if name == "inverse_sqrt" and holds and earlier is None:
        return Fit(None, updates, warmup_steps, name, True)
    shape = name if name in SHAPES else "linear"
    end = max(updates, step + 1)
    if earlier is not None:  # the warmup decided before stands; one that is done stays done
        warmup = earlier.warmup_end
    else:
        warmup = min(warmup_steps, max(1, math.floor(warmup_fraction * updates)))
        if current < 1.0 and warmup <= step:  # a budget so short the probe outlasted its warmup:
            warmup = min(end - 1, step + warmup)  # rise to the peak over as many updates more
    segments = []
    if step < warmup < end:  # still warming up: up to the peak first, along a line
        segments.append(Segment(step, warmup, current, 1.0))
        segments.append(Segment(warmup, end, 1.0, min_ratio, shape))
    else:
        segments.append(Segment(step, end, current, min_ratio, shape))
    return Fit(FittedSchedule(tuple(segments), min_ratio), updates, warmup, shape, holds)


def rejoin_schedule(
    updates: int, step: int, current: float, earlier: FittedSchedule, warmup_fraction: float
) -> Fit:
    """The schedule of a run resumed with another budget, from update ``step`` to its new end.

    The decay the new end gives is ``earlier``'s, from the peak at its warmup's end down to its
    floor at ``updates``. Where the rate is below that decay (a run stopped at its old end's
    floor, resumed for longer), it rises along a line from where it is to the decay, over at most
    ``warmup_fraction`` of the updates left and the earlier warmup's length, and follows it; where
    it is not (a shorter budget), it decays from where it is to the floor at the new end. The rate
    never jumps and never exceeds the peak.

    Args:
        updates: the new forecast ``U``.
        step: the update the fit starts at (the next one).
        current: the multiplier the run is at.
        earlier: the schedule the run was fitted to before.
        warmup_fraction: the rise's most, as a fraction of the updates left.

    Returns:
        The :class:`Fit`; its schedule starts at (``step``, ``current``).
    """
    last = earlier.segments[-1]
    shape, floor, peak_at = last.shape, earlier.floor, earlier.warmup_end
    end = max(updates, step + 1)
    if step < peak_at < end:  # still rising: a forecast again, as the speed drifting gives
        segments = (Segment(step, peak_at, current, 1.0), Segment(peak_at, end, 1.0, floor, shape))
        return Fit(FittedSchedule(segments, floor), updates, peak_at, shape, True)
    if step < peak_at:  # an end before the peak: from where it is down to the floor
        return Fit(
            FittedSchedule((Segment(step, end, current, floor, shape),), floor), updates, peak_at, shape, True
        )
    decay = Segment(peak_at, end, 1.0, floor, shape)
    rise = min(max(1, math.floor(warmup_fraction * (end - step))), max(peak_at, 1), end - step - 1)
    target = decay.factor(step + rise) if rise >= 1 else floor
    if rise < 1 or current >= target:
        return Fit(
            FittedSchedule((Segment(step, end, current, floor, shape),), floor), updates, peak_at, shape, True
        )
    segments = (Segment(step, step + rise, current, target), Segment(step + rise, end, target, floor, shape))
    return Fit(FittedSchedule(segments, floor), updates, peak_at, shape, True)
