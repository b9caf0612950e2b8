"""Where a run is and how it ended: the progress line and metrics, and results.json's ``ending``."""

from __future__ import annotations

import csv
import json
import logging
import math

import pytest

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training import module as module_mod
from training.ending import one_line
from training.pipeline import train
from training.progress import RunProgress, format_duration


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


def _ending(run) -> dict:
    results = json.loads((run / "results.json").read_text())
    assert results["precision"] == "32-true" and results["precision_reason"]  # kept beside the ending
    return {k: results[k] for k in ("ending", "ending_update", "ending_detail")}


def test_durations_read_as_clock_time_and_unknown_as_a_question_mark():
    assert format_duration(0) == "0:00:00"
    assert format_duration(3723.4) == "1:02:03"
    assert format_duration(2 * 86400 + 61) == "2d 0:01:01"
    assert format_duration(math.inf) == format_duration(math.nan) == format_duration(-1) == "?"


def test_the_rate_window_must_hold_an_update():
    with pytest.raises(ValueError, match="window must be at least 1"):
        RunProgress(window=0)


def test_a_finished_run_says_so_and_shows_rates_and_time_left(toy, tmp_path, caplog, capsys):
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=2", "trainer.limit_train_batches=5"]
    overrides += ["trainer.limit_val_batches=1", "test=false", "trainer.enable_progress_bar=true"]
    caplog.set_level(logging.INFO, logger="training")
    train(compose_config(overrides, tmp_path / "run"))
    bar = capsys.readouterr().out  # Lightning's bar writes to stdout
    assert "update=10/10" in bar and "left=0:00:00" in bar and "updates_s=" in bar
    ending = _ending(tmp_path / "run")
    assert ending["ending"] == "finished" and ending["ending_update"] == 10
    assert "trainer.max_epochs=2" in ending["ending_detail"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("update ")]
    assert [line.split(":")[0] for line in lines] == ["update 5/10 (50.0%)", "update 10/10 (100.0%)"]
    assert "updates/s" in lines[0] and "target tokens/s" in lines[0] and lines[-1].endswith("0:00:00 left")
    with open(tmp_path / "run" / "logs" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/updates_s")]
    assert rows and all(float(r["train/updates_s"]) > 0 for r in rows)
    left = [float(r["train/time_left_s"]) for r in rows]
    assert left[-1] == 0 and left[0] > 0


def test_early_stopping_and_max_time_are_stopped_early(toy, tmp_path):
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=6", "trainer.limit_train_batches=2"]
    overrides += ["trainer.limit_val_batches=1", "test=false", "lr.peak=0.0"]
    train(compose_config([*overrides, "early_stopping.patience=1"], tmp_path / "es"))
    ending = _ending(tmp_path / "es")
    assert ending["ending"] == "stopped early" and ending["ending_update"] == 4  # 2nd validation
    assert ending["ending_detail"].startswith("early stopping:") and "val/bleu" in ending["ending_detail"]

    slow = [*overrides, "trainer.max_epochs=1000", "trainer.max_time=00:00:00:01"]
    train(compose_config(slow, tmp_path / "mt"))
    ending = _ending(tmp_path / "mt")
    assert ending["ending"] == "stopped early" and 0 < ending["ending_update"] < 2000
    assert ending["ending_detail"].startswith("trainer.max_time reached")


def test_a_failed_run_writes_results_naming_the_error_then_raises(toy, tmp_path, monkeypatch):
    real = module_mod.TranslationModule.training_step

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            raise RuntimeError("injected failure\nsecond line")
        return real(self, batch, batch_idx)

    monkeypatch.setattr(module_mod.TranslationModule, "training_step", training_step)
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=1", "trainer.limit_val_batches=1", "test=false"]
    with pytest.raises(RuntimeError, match="injected failure"):
        train(compose_config(overrides, tmp_path / "run"))
    assert _ending(tmp_path / "run") == {
        "ending": "failed",
        "ending_update": 3,
        "ending_detail": "RuntimeError: injected failure",
    }


def test_one_line_names_the_type_and_ctrl_c_behind_lightnings_exit():
    assert one_line(ValueError("a\nb")) == "ValueError: a"
    assert one_line(KeyError()) == "KeyError"
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemExit(1) from None  # as Lightning's graceful shutdown does (context kept)
    except SystemExit as err:
        assert one_line(err) == "KeyboardInterrupt"
