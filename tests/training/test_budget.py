"""The time budget's forecast: too short for the schedule on a slow machine, enough on ours."""

from __future__ import annotations

import pytest

from training.budget.forecast import as_max_time, forecast, max_time_seconds

# A budget of 42 minutes, warmup 600 updates, the last 5 epochs averaged, 110 updates an epoch.
RECIPE = {"budget_s": 42 * 60, "updates_per_epoch": 110, "warmup_steps": 600, "average_last": 5}


def test_the_recipe_fits_where_it_was_tuned_and_not_on_a_machine_a_third_as_fast():
    # ~1,900 updates: the ~1,800 of BENCHMARKS.md, "Quality", after validation
    tuned = forecast(seconds_per_update=1.3, **RECIPE)
    assert not tuned.too_short and tuned.updates == 1938 and tuned.epochs == pytest.approx(17.6, abs=0.1)
    slow = forecast(seconds_per_update=3 * 1.3, **RECIPE)
    assert slow.too_short and slow.updates == 646
    assert slow.updates_needed == 1200  # 2 warmups (1,200) > 2 x 5 epochs (1,100)
    assert slow.seconds_needed == pytest.approx(1200 * 3.9)
    assert max_time_seconds(as_max_time(slow.seconds_needed)) >= slow.seconds_needed


def test_averaged_update_checkpoints_count_their_own_span():
    """With checkpoint.every_n_updates the averaged checkpoints are that many updates apart."""
    often = forecast(seconds_per_update=1.0, **RECIPE, updates_per_checkpoint=50)
    rarely = forecast(seconds_per_update=1.0, **RECIPE, updates_per_checkpoint=500)
    assert often.updates_needed == 1200 and not often.too_short  # the warmup decides
    assert rarely.updates_needed == 5000 and rarely.too_short  # 2 x 5 checkpoints x 500 updates


def test_max_time_both_ways():
    assert max_time_seconds("00:00:42:00") == 2520 and max_time_seconds("01:02:03:04") == 93784
    assert max_time_seconds({"hours": 1, "minutes": 30}) == 5400
    assert as_max_time(2520) == "00:00:42:00" and as_max_time(2521) == "00:00:43:00"
    assert as_max_time(93784) == "01:02:04:00"
