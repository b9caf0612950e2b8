"""Update-based validation and checkpoints: every N updates across epochs, the last K kept, the best
by BLEU, the last N averaged; epoch-based stays the default."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training.checkpoints import plan_checkpoints
from training.pipeline import train


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


def _state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_update_checkpoints_across_epochs_keep_last_k_best_and_average(toy, tmp_path):
    """5 batches per epoch, every 4 updates to step 12: validations and saves at 4, 8 and 12
    (in epochs 0, 1 and 2); the last 2 update checkpoints kept; their mean is averaged.ckpt."""
    out = tmp_path / "run"
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=-1", "trainer.max_steps=12"]
    overrides += ["trainer.limit_train_batches=5", "trainer.limit_val_batches=2", "test=false"]
    overrides += ["checkpoint.every_n_updates=4", "checkpoint.keep_last=2", "average_last=2"]
    train(compose_config(overrides, out))
    ckpts = out / "checkpoints"
    updates = sorted(p.name for p in ckpts.glob("update*.ckpt"))
    assert updates == ["update00000008.ckpt", "update00000012.ckpt"]  # update 4 rotated out
    assert [_state(ckpts / u)["global_step"] for u in updates] == [8, 12]
    assert [_state(ckpts / u)["epoch"] for u in updates] == [1, 2]  # across epoch boundaries
    assert _state(ckpts / "last.ckpt")["global_step"] == 12
    best = list(ckpts.glob("best-step*-bleu*.ckpt"))
    assert len(best) == 1 and not list(ckpts.glob("epoch*.ckpt"))
    with open(out / "logs" / "metrics.csv", newline="") as f:
        val_steps = [int(r["step"]) for r in csv.DictReader(f) if r.get("val/bleu")]
    assert val_steps == [3, 7, 11]  # Lightning logs validation at step - 1 (before the step's count)
    a, b = (_state(ckpts / u)["state_dict"] for u in updates)
    averaged = _state(ckpts / "averaged.ckpt")["state_dict"]
    for name, value in averaged.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, (a[name] + b[name]) / 2, msg=name)


def test_epoch_based_stays_the_default_and_the_multi30k_recipe():
    for overrides in ([], ["experiment=multi30k_de_en"], ["experiment=multi30k_en_de"]):
        assert compose_config(overrides).checkpoint.every_n_updates is None, overrides
    plan = plan_checkpoints(Path("/tmp/x"), None, keep_last=5, average_last=5)
    assert plan.trainer_args == {} and plan.recent.monitor == "epoch" and plan.last is plan.recent


@pytest.mark.parametrize("average_last", [0, 2])
def test_epoch_based_last_ckpt_is_the_newest_epoch_even_when_it_is_not_the_best(toy, tmp_path, average_last):
    # At learning rate 0 validation BLEU is the same every epoch: the first epoch stays the best, and
    # Lightning, which writes last.ckpt only with a save of the same callback, kept it there.
    out = tmp_path / "run"
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=3", "trainer.limit_train_batches=2"]
    overrides += ["trainer.limit_val_batches=1", "test=false", f"average_last={average_last}"]
    overrides += ["lr.peak=0"]
    train(compose_config(overrides, out))
    ckpts = out / "checkpoints"
    [best] = ckpts.glob("best-epoch*.ckpt")
    assert _state(best)["global_step"] == 2  # the first epoch's
    assert _state(ckpts / "last.ckpt")["global_step"] == 6
    assert _state(ckpts / "last.ckpt")["epoch"] == 2


def test_the_wmt14_experiment_saves_by_updates_and_averages_them():
    cfg = compose_config(["experiment=wmt14_de_en_base_gpu"])
    every = cfg.checkpoint.every_n_updates
    assert every and cfg.trainer.max_steps % every == 0  # the last updates are saved too
    assert cfg.test_ckpt == "averaged" and cfg.checkpoint.keep_last >= cfg.average_last > 1
    plan = plan_checkpoints(Path("/tmp/x"), every, cfg.checkpoint.keep_last, cfg.average_last, 8)
    assert plan.trainer_args == {"val_check_interval": every * 8, "check_val_every_n_epoch": None}
    # Saved after each validation, so that the checkpoint holds what the validation changed ...
    assert plan.recent._every_n_train_steps == 0 and plan.recent._save_on_train_epoch_end is False
    # ... or every N updates where the run never validates.
    blind = plan_checkpoints(Path("/tmp/x"), every, cfg.checkpoint.keep_last, cfg.average_last, 8, False)
    assert blind.recent._every_n_train_steps == every


@pytest.mark.parametrize("every", [None, 4])
@pytest.mark.parametrize("average_last", [0, 1])
def test_average_last_0_or_1_averages_nothing(every, average_last):
    plan = plan_checkpoints(Path("/tmp/x"), every, keep_last=5, average_last=average_last)
    if plan.recent is not None:
        plan.recent.best_k_models = {f"/tmp/x/update{i}.ckpt": float(i) for i in (4, 8, 12)}
    assert plan.to_average() == []


@pytest.mark.parametrize(
    "every, keep, average, message",
    [
        (0, 5, 0, "checkpoint.every_n_updates must be null"),
        (10, 3, 5, "checkpoint.keep_last=3 must be at least 1 and at least average_last=5"),
    ],
)
def test_settings_out_of_range_are_refused_naming_them(every, keep, average, message):
    with pytest.raises(ValueError, match=message):
        plan_checkpoints(Path("/tmp/x"), every, keep, average)
