"""The schedule fitted to a forecast (training/lr/fitted.py), as properties over speeds and budgets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.budget.forecast import forecast
from training.budget.points import average_points
from training.lr.fitted import FittedSchedule, Segment, fit_schedule
from training.lr.shapes import inverse_sqrt_factor, schedule_factor

PER_EPOCH, WARMUP, AVERAGE = 117, 600, 5  # the Multi30k recipe's


def _fit(updates: int, step: int, name: str = "inverse_sqrt", floor: float = 0.0, fraction: float = 0.1):
    """The fit at update ``step`` of a run whose configured schedule is ``name``, as the run makes it."""
    configured = schedule_factor(name, WARMUP, max(updates, WARMUP + 1), floor)
    needed = forecast(1.0, 1.0, PER_EPOCH, WARMUP, AVERAGE).updates_needed
    return fit_schedule(updates, step, configured(step), name, WARMUP, floor, needed, fraction), configured


@settings(max_examples=200, deadline=None)
@given(
    seconds_per_update=st.floats(0.01, 10.0),
    budget_s=st.floats(30.0, 6 * 3600.0),
    probe=st.integers(2, 130),
    name=st.sampled_from(["inverse_sqrt", "linear", "cosine"]),
    floor=st.sampled_from([0.0, 0.1]),
)
def test_a_fit_warms_up_briefly_decays_to_its_floor_at_the_forecast_and_never_jumps(
    seconds_per_update, budget_s, probe, name, floor
):
    updates = max(int(budget_s / seconds_per_update), 1)
    step = min(probe, updates) + 1  # the next update's, as the run fits it
    fit, configured = _fit(updates, step, name, floor)
    needed = forecast(seconds_per_update, budget_s, PER_EPOCH, WARMUP, AVERAGE).updates_needed
    if name == "inverse_sqrt" and updates >= needed:  # the budget holds the paper's schedule: kept
        assert fit.schedule is None and fit.holds
        return
    schedule = fit.schedule
    assert schedule is not None
    # At most a tenth of the forecast (fitted past that, still rising: a tenth more).
    tenth = max(1, math.floor(0.1 * updates))
    assert fit.warmup <= WARMUP and fit.warmup <= (tenth if tenth > step else step + tenth)
    assert schedule.start == step and schedule.factor(step) == pytest.approx(configured(step))  # no jump
    end = max(updates, step + 1)
    assert schedule.end == end and schedule.factor(end) == pytest.approx(floor)  # the floor at the end
    assert schedule.factor(end + 1000) == floor
    peak = max(fit.warmup, step)
    if fit.warmup > step and end > fit.warmup:
        assert schedule.factor(fit.warmup) == 1.0  # the peak, at the warmup's end
    # (a forecast a single update past the probe has no room to rise: from where it is to the floor)
    low = min(floor, configured(step)) if len(schedule.segments) == 1 else floor
    for s in range(step, end + 1, max(1, (end - step) // 50)):
        value = schedule.factor(s)
        assert (low if s >= peak else 0.0) - 1e-12 <= value <= 1.0 + 1e-12
        if s > peak and configured(step) >= floor:  # after the warmup the rate only goes down
            assert value <= schedule.factor(max(peak, s - 1)) + 1e-12


def test_a_budget_shorter_than_one_epoch_still_fits():
    fit, _ = _fit(updates=40, step=21)  # fitted past a tenth of 40, still rising: 4 updates more
    assert fit.warmup == 25 and fit.schedule.factor(25) == 1.0
    assert fit.schedule.end == 40 and fit.schedule.factor(40) == 0.0


def test_a_budget_that_holds_the_schedule_keeps_the_papers_but_fits_a_decaying_one():
    fit, _ = _fit(updates=5000, step=21)
    assert fit.schedule is None and fit.warmup == WARMUP and fit.holds
    fit, _ = _fit(updates=5000, step=21, name="linear")
    assert fit.schedule.end == 5000 and fit.warmup == 500 and fit.holds


def test_the_zen3_forecast_gets_a_tenth_of_its_updates_of_warmup_and_a_line_to_zero():
    """The issue's Zen 3: 792 updates forecast against the ~1,230 inverse_sqrt needs."""
    fit, configured = _fit(updates=792, step=21)
    assert not fit.holds and fit.warmup == 79 and fit.shape == "linear"
    schedule = fit.schedule
    assert schedule.factor(79) == 1.0 and schedule.factor(792) == 0.0
    assert schedule.factor(21) == pytest.approx(inverse_sqrt_factor(21, WARMUP))
    assert schedule.factor(436) == pytest.approx(0.5, abs=0.01)  # halfway down at halfway


def test_a_forecast_again_starts_where_the_rate_is_and_keeps_the_warmup():
    first, _ = _fit(updates=792, step=21)
    at = 300
    current = first.schedule.factor(at)
    needed = forecast(1.0, 1.0, PER_EPOCH, WARMUP, AVERAGE).updates_needed
    again = fit_schedule(900, at, current, "inverse_sqrt", WARMUP, 0.0, needed, 0.1, first.schedule)
    assert again.schedule.factor(at) == pytest.approx(current) and again.schedule.end == 900
    assert again.warmup == first.warmup


def test_a_fitted_schedule_round_trips_through_its_state_dict():
    schedule = FittedSchedule((Segment(5, 40, 0.1, 1.0), Segment(40, 400, 1.0, 0.05, "cosine")), 0.05)
    assert FittedSchedule.from_state_dict(schedule.state_dict()) == schedule
    assert schedule.factor(220) == pytest.approx(0.525, abs=1e-6)  # half a cosine, halfway


@settings(max_examples=200, deadline=None)
@given(updates=st.integers(1, 20_000), per_epoch=st.integers(1, 500), average=st.integers(0, 8))
def test_the_averaged_updates_come_from_the_budgets_last_part(updates, per_epoch, average):
    points = average_points(updates, per_epoch, average, 0.2)
    if average < 2 or updates < 2:
        assert points == []
        return
    window = max(1, math.floor(0.2 * updates))
    assert points == sorted(set(points)) and 1 <= len(points) <= average
    assert all(updates - window <= p <= updates for p in points)
    ends = [p for p in range(per_epoch, updates + 1, per_epoch) if p > updates - window]
    if len(ends) >= average:  # epochs where that many fall in the window
        assert points == ends[-average:]
    else:  # evenly spaced updates where epochs are few, the last one the forecast end
        assert points[-1] == updates


def test_a_short_run_averages_updates_and_a_long_one_epochs():
    assert average_points(792, 117, 5, 0.2) == [634, 674, 713, 752, 792]  # 6.8 epochs: few
    assert average_points(4000, 117, 5, 0.2) == [3510, 3627, 3744, 3861, 3978]  # 34 epochs
