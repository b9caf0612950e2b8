"""TensorBoard by default (scalars and a cross-attention image per validation), the CSV beside it;
wandb and mlflow as optional extras that never reach the network here."""

from __future__ import annotations

import csv
import importlib.util
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from common.attention_plot import attention_figure, figure_pixels
from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training.loggers import ContinuedCSVLogger, make_loggers
from training.pipeline import train

# A real run of a few updates (fast_dev_run would swap every logger for a dummy).
ONE_SHORT_EPOCH = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1",
    "test=false",
]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


def _events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(str(files[0]), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_tensorboard_is_the_default_and_holds_what_a_run_is_judged_by(toy, tmp_path):
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=2", "trainer.limit_train_batches=6"]
    overrides += ["trainer.limit_val_batches=2", "test=false", "trainer.log_every_n_steps=1"]
    cfg = compose_config(overrides, tmp_path / "run")
    assert cfg.logger._target_.endswith("TensorBoardLogger")
    train(cfg)
    acc = _events(tmp_path / "run")
    scalars = set(acc.Tags()["scalars"])
    wanted = {"train/loss", "train/lr", "train/grad_norm", "train/tok_s", "val/loss", "val/bleu", "val/chrf"}
    assert wanted <= scalars, wanted - scalars
    assert len(acc.Scalars("val/bleu")) == 2  # one per validation
    assert all(np.isfinite(e.value) and e.value >= 0 for e in acc.Scalars("train/grad_norm"))
    images = acc.Images("val/cross_attention")
    assert [im.step for im in images] == [6, 12]  # one per validation (not the sanity check), at its step
    assert all(im.width > 100 and im.height > 100 for im in images)
    with open(tmp_path / "run" / "logs" / "metrics.csv", newline="") as f:  # the CSV stays
        assert sum(1 for row in csv.DictReader(f) if row.get("val/bleu")) == 2


def test_logger_csv_writes_the_csv_alone(toy, tmp_path):
    overrides = [*toy_overrides(*toy), "logger=csv", "trainer.max_epochs=1", "test=false"]
    overrides += ["trainer.limit_train_batches=2", "trainer.limit_val_batches=1"]
    train(compose_config(overrides, tmp_path / "run"))
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert (tmp_path / "run" / "logs" / "metrics.csv").is_file()


def test_figure_pixels_are_the_heatmap_as_rgb():
    weights = torch.softmax(torch.randn(3, 4), dim=-1)
    pixels = figure_pixels(attention_figure(weights, list("abcd"), list("xyz"), "t"))
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.std() > 10  # not blank


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_an_optional_logger_without_its_extra_is_refused_naming_it(name, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))
    cfg = compose_config([f"logger={name}"], tmp_path / "run")
    with pytest.raises(ModuleNotFoundError, match=rf"logger={name} needs the {name} package.*\.\[{name}\]"):
        make_loggers(cfg.logger, tmp_path / "run")


def test_wandb_logs_offline_when_installed(toy, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is an optional extra (.[wandb])")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    # Not fast_dev_run: Lightning replaces every logger by a dummy there.
    overrides = [*toy_overrides(*toy), "logger=wandb", "logger.offline=true", *ONE_SHORT_EPOCH]
    train(compose_config(overrides, tmp_path / "run"))
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))


def test_mlflow_logs_to_a_local_store_when_installed(toy, tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is an optional extra (.[mlflow])")
    import mlflow

    overrides = [*toy_overrides(*toy), "logger=mlflow", *ONE_SHORT_EPOCH]
    cfg = compose_config(overrides, tmp_path / "run")
    assert cfg.logger.tracking_uri.startswith("sqlite:///")  # a local database: no server, no network
    train(cfg)
    client = mlflow.MlflowClient(cfg.logger.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(cfg.name).experiment_id])
    assert len(runs) == 1 and "train/loss" in runs[0].data.metrics
    assert not (Path.cwd() / "mlruns").exists()  # nothing outside the run directory


def test_a_continued_csv_log_keeps_its_rows_without_lightnings_deletion_warning(tmp_path):
    # Lightning's CSV writer warns that a non-empty log directory's files "will be deleted"; the
    # continued log writes the resumed run's rows back, so the warning would be false.
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step,train/loss\n0,5.0\n")
    previous = [{"step": "0", "train/loss": "5.0"}]
    log = ContinuedCSVLogger(save_dir=str(tmp_path), name="logs", version="", previous=previous)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        log.log_metrics({"train/loss": 4.0}, step=1)
        log.save()
    rows = list(csv.DictReader((tmp_path / "logs" / "metrics.csv").open()))
    assert [(r["step"], r["train/loss"]) for r in rows] == [("0", "5.0"), ("1", "4.0")]


def test_lightnings_litlogger_tip_is_not_printed(caplog):
    with caplog.at_level(logging.INFO):
        rank_zero_info("💡 Tip: For seamless cloud logging, try installing [litlogger](https://pypi.org)")
        rank_zero_info("an ordinary message")
    assert "litlogger" not in caplog.text and "an ordinary message" in caplog.text
