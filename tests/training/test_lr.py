"""The learning rate as one object (training/lr/), as properties over many inputs.

- a refit (the speed drifted, or the budget changed on resume) starts where the rate is: it never
  jumps, never exceeds the peak, and ends at the floor at its end;
- a plateau's scale never rises and never falls below its floor;
- a schedule carried on from a checkpoint gives this run's update k the checkpoint's update
  ``updates + k``, or is refused where that would be the floor throughout;
- the state round-trips, and the scheduler alone writes the optimizer's rate.
"""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.lr import LearningRate, RateScheduler, RateSettings
from training.lr.fitted import FittedSchedule, Segment, fit_schedule, rejoin_schedule
from training.lr.plateau import Plateau

SHAPES = st.sampled_from(["linear", "cosine"])


@st.composite
def fitted_runs(draw):
    """A schedule fitted at some update (warming up to the peak or not), and a later update."""
    start = draw(st.integers(1, 500))
    warmup_end = draw(st.integers(start, start + 300))
    end = draw(st.integers(warmup_end + 1, warmup_end + 3000))
    floor = draw(st.sampled_from([0.0, 0.05, 0.2]))
    shape = draw(SHAPES)
    current = draw(st.floats(0.0, 1.0))
    if warmup_end > start:
        segments = (Segment(start, warmup_end, current, 1.0), Segment(warmup_end, end, 1.0, floor, shape))
    else:
        segments = (Segment(start, end, current, floor, shape),)
    schedule = FittedSchedule(segments, floor)
    step = draw(st.integers(start, end + 500))
    return schedule, step


def _steps(schedule: FittedSchedule, first: int) -> list[float]:
    return [schedule.factor(s) for s in range(first, schedule.end + 3)]


def _max_slope(schedule: FittedSchedule) -> float:
    """The largest change between two updates anywhere along ``schedule`` (half a cosine's steepest
    is pi/2 times its line's)."""
    return max(
        abs(s.end_factor - s.start_factor)
        / max(s.end - s.start, 1)
        * (1.5708 if s.shape == "cosine" else 1.0)
        for s in schedule.segments
    )


@settings(max_examples=300, deadline=None)
@given(run=fitted_runs(), more=st.integers(-200, 5000), fraction=st.sampled_from([0.1, 0.4]))
def test_a_run_refitted_to_another_end_never_jumps_never_exceeds_the_peak_and_ends_at_its_floor(
    run, more, fraction
):
    earlier, step = run
    current = earlier.factor(step)
    updates = max(step + 1, earlier.end + more)
    fit = rejoin_schedule(updates, step, current, earlier, fraction)
    schedule = fit.schedule
    assert schedule is not None and schedule.start == step
    assert schedule.factor(step) == pytest.approx(current, abs=1e-12)  # where the rate was: no jump
    rates = _steps(schedule, step)
    assert all(0.0 - 1e-12 <= r <= 1.0 + 1e-12 for r in rates)
    assert schedule.end == updates and schedule.factor(updates) == pytest.approx(earlier.floor)
    slope = _max_slope(schedule) + 1e-12
    assert all(abs(b - a) <= slope for a, b in zip(rates, rates[1:], strict=False))
    if step >= earlier.warmup_end and current < earlier.floor + 1e-9 and updates - step > 10:
        assert max(rates) > current + 1e-6  # stopped at the floor, given more time: it rises back


@settings(max_examples=300, deadline=None)
@given(run=fitted_runs(), updates=st.integers(2, 6000), fraction=st.sampled_from([0.1, 0.4]))
def test_a_forecast_again_starts_where_the_rate_is(run, updates, fraction):
    earlier, step = run
    current = earlier.factor(step)
    fit = fit_schedule(updates, step, current, "linear", 600, earlier.floor, 1230, fraction, earlier)
    assert fit.schedule.factor(step) == pytest.approx(current, abs=1e-12)
    assert fit.schedule.factor(max(updates, step + 1)) == pytest.approx(earlier.floor)
    rates = _steps(fit.schedule, step)
    if step >= earlier.warmup_end:  # past the warmup: never back up, however often refitted
        assert max(rates) <= max(current, earlier.floor) + 1e-12
    else:  # still warming up: the same warmup end, then down
        assert fit.warmup == earlier.warmup_end


def test_a_third_forecast_after_the_warmup_does_not_warm_up_again():
    """The 5-minute run (compact, 2,048 tokens, Zen 3) refitted at updates 21, 245 and 489: the third
    fit rose from 0.5x back to the peak at update 716 and dropped to 0 at 717."""
    first = fit_schedule(505, 21, 0.02, "inverse_sqrt", 600, 0.0, 2440, 0.4)
    second = fit_schedule(
        668, 245, first.schedule.factor(245), "inverse_sqrt", 600, 0.0, 2440, 0.4, first.schedule
    )
    third = fit_schedule(
        717, 489, second.schedule.factor(489), "inverse_sqrt", 600, 0.0, 2440, 0.4, second.schedule
    )
    rates = [third.schedule.factor(s) for s in range(489, 718)]
    assert rates[0] < 1.0 and max(rates) == rates[0] and rates[-1] == 0.0


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(-100, 100, allow_nan=False), max_size=60),
    mode=st.sampled_from(["max", "min"]),
    factor=st.floats(0.05, 0.95),
    patience=st.integers(1, 4),
    floor=st.sampled_from([0.0, 0.01, 0.3]),
)
def test_a_plateaus_scale_never_rises_nor_falls_below_its_floor(values, mode, factor, patience, floor):
    plateau = Plateau(mode, factor, patience, floor)
    scales = [plateau.scale]
    for value in values:
        lowered = plateau.observe(value)
        assert lowered == (plateau.scale < scales[-1])
        scales.append(plateau.scale)
    assert all(b <= a for a, b in zip(scales, scales[1:], strict=False))
    assert all(s >= floor for s in scales) and scales[0] == 1.0


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(["inverse_sqrt", "linear", "cosine", "constant"]),
    warmup=st.integers(0, 200),
    length=st.integers(1, 2000),
    updates=st.integers(0, 2500),
    offset=st.integers(0, 300),
)
def test_a_carried_schedule_gives_update_k_the_checkpoints_update_plus_k_or_is_refused(
    name, warmup, length, updates, offset
):
    total = warmup + length
    source = LearningRate(RateSettings(peak=1.0, schedule=name, warmup_steps=warmup, total_steps=total))
    source.start(lambda: total)
    source.offset = offset
    run = LearningRate(RateSettings(peak=1.0))  # this run's own shape is not used
    ends = name in ("linear", "cosine") and total - offset - updates <= 1
    if ends:
        with pytest.raises(ValueError, match="reaches its floor"):
            run.carry(source.state_dict(), updates)
        return
    run.carry(source.state_dict(), updates)
    for k in (1, 2, 17, 500):
        assert run.factor(k) == source.factor(updates + k)


def test_a_carried_fitted_schedule_and_plateau_scale_continue_and_its_count_starts_afresh():
    source = LearningRate(RateSettings(peak=1.0, schedule="plateau", warmup_steps=10))
    source.start(lambda: 0)
    for value in (3.0, 2.0, 2.0, 1.0, 1.0, 1.0):  # patience 2: halved twice, then one stalled
        source.validated(value)
    assert source.plateau.scale == 0.25 and source.plateau.stalled == 1
    run = LearningRate(RateSettings(peak=1.0, schedule="plateau", warmup_steps=10))
    run.carry(source.state_dict(), 40)
    assert run.factor(1) == 0.25 and run.plateau.stalled == 0 and run.plateau.best is None
    fitted = LearningRate(RateSettings(peak=1.0, schedule="linear", warmup_steps=10, total_steps=1000))
    fitted.start(lambda: 1000)
    fitted.refit(FittedSchedule((Segment(30, 100, 0.9, 0.0),), 0.0))
    carried = LearningRate(RateSettings(peak=1.0))
    carried.carry(fitted.state_dict(), 50)
    assert [carried.factor(k) for k in (1, 20, 50, 60)] == [fitted.factor(50 + k) for k in (1, 20, 50, 60)]
    with pytest.raises(ValueError, match="schedule fitted to its budget reaches its floor"):
        LearningRate(RateSettings(peak=1.0)).carry(fitted.state_dict(), 100)


def test_the_state_round_trips_and_the_scheduler_alone_writes_the_rate():
    settings_ = RateSettings(peak=0.5, schedule="plateau", warmup_steps=2, plateau_patience=1)
    rate = LearningRate(settings_)
    rate.start(lambda: 0)
    rate.offset = 3
    rate.refit(FittedSchedule((Segment(4, 9, 0.7, 0.1),), 0.1))
    rate.validated(2.0)
    rate.validated(1.0)
    again = LearningRate(settings_)
    again.start(lambda: 0)
    again.load_state_dict(rate.state_dict())
    assert again.state_dict() == rate.state_dict()
    assert [again.factor(s) for s in range(1, 12)] == [rate.factor(s) for s in range(1, 12)]
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.Adam([weight], lr=123.0)  # whatever it was made with
    scheduler = RateScheduler(optimizer, again)
    for step in range(1, 6):
        assert optimizer.param_groups[0]["lr"] == again.value(step)
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    assert set(state) >= {"last_epoch", "rate"} and state["rate"] == again.state_dict()
    torch.save(state, io.BytesIO())  # plain values: a checkpoint holds it


def test_unknown_or_bad_lr_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="lr: unknown key"):
        RateSettings.from_dict({"lr": 1e-3})
    with pytest.raises(ValueError, match="lr.schedule='step' is not one of"):
        RateSettings.from_dict({"schedule": "step"})
    with pytest.raises(ValueError, match="lr.min_ratio must be within"):
        RateSettings.from_dict({"min_ratio": 2.0})
