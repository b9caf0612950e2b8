"""Several validation sets and the selection metric (training/selection.py, data.valid_sets).

- every set is validated at every validation and logged under its name (metrics.csv, results.json);
- the best checkpoint is the best of the chosen set's chosen metric, in the metric's direction;
- early stopping watches the same metric;
- bad settings are refused naming the key; the default selects by ``val/bleu`` as before.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training.checkpoints import plan_checkpoints
from training.pipeline import train
from training.plots import validation_curves
from training.selection import Selection, choose_selection
from training.stopping import early_stopping

METRICS = ("bleu", "chrf", "loss", "ppl")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


@pytest.fixture(scope="module")
def new_domain(tmp_path_factory) -> Path:
    """Another corpus's validation split only (12 pairs), as a fine-tuning run's new domain is."""
    return write_toy_corpus(tmp_path_factory.mktemp("new") / "corpus", {"val": 12}, seed=5)


def _run(toy, out: Path, extra: list[str]) -> dict:
    overrides = [*toy_overrides(*toy), "test=false", "trainer.limit_train_batches=3"]
    overrides += ["trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0"]
    overrides += ["trainer.log_every_n_steps=1", *extra]
    return train(compose_config(overrides, out))


def _rows(run: Path) -> list[dict[str, str]]:
    with open(run / "logs" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _two_sets(new_domain: Path) -> str:
    return f"data.valid_sets=[{{name: new, data_dir: '{new_domain}'}}, {{name: old}}]"


def test_every_set_is_validated_logged_by_name_and_the_best_is_the_lowest_loss_of_the_chosen_one(
    toy, new_domain, tmp_path
):
    out = tmp_path / "run"
    extra = [_two_sets(new_domain), "checkpoint.metric=loss", "checkpoint.select_on=old"]
    results = _run(toy, out, [*extra, "trainer.max_epochs=3", "plot=true"])
    rows = _rows(out)
    columns = set(rows[0])
    assert {f"val/{name}/{m}" for name in ("new", "old") for m in METRICS} <= columns
    assert not {f"val/{m}" for m in METRICS} & columns  # the main split is not validated
    assert not [c for c in columns if "dataloader_idx" in c]
    old_loss = {int(r["epoch"]): float(r["val/old/loss"]) for r in rows if r.get("val/old/loss")}
    new_bleu = [r["val/new/bleu"] for r in rows if r.get("val/new/bleu")]
    assert len(old_loss) == len(new_bleu) == 3  # each validation scored both sets
    assert max(old_loss.values()) > min(old_loss.values())  # the loss moved: the direction matters
    [best] = (out / "checkpoints").glob("best-*.ckpt")
    epoch = min(old_loss, key=old_loss.get)
    assert best.name == f"best-epoch{epoch:03d}-old-loss{old_loss[epoch]:.4f}.ckpt"
    states = torch.load(best, weights_only=True)["callbacks"]
    [state] = [v for k, v in states.items() if k.startswith("ModelCheckpoint") and "val/old/loss" in k]
    assert float(state["best_model_score"]) == pytest.approx(min(old_loss.values()))
    assert results["selected_by"] == "val/old/loss"
    assert set(results["valid_sets"]) == {"new", "old"}
    assert results["valid_sets"]["old"]["loss"] == pytest.approx(old_loss[2])
    written = json.loads((out / "results.json").read_text())
    assert written["valid_sets"]["new"]["bleu"] == pytest.approx(float(new_bleu[-1]))
    assert validation_curves(rows) == [("val/new/", " new"), ("val/old/", " old")]  # curves of each
    assert (out / "learning_curve.png").stat().st_size > 0


def test_early_stopping_watches_the_chosen_set_and_metric(toy, new_domain, tmp_path):
    """lr 0: no metric moves; patience 2 stops at the third validation, saying what it watched."""
    extra = [_two_sets(new_domain), "checkpoint.metric=chrf", "checkpoint.select_on=new"]
    extra += ["lr.peak=0.0", "early_stopping.patience=2", "trainer.max_epochs=6"]
    results = _run(toy, tmp_path / "run", extra)
    assert results["ending"] == "stopped early" and "val/new/chrf" in results["ending_detail"]
    assert len([r for r in _rows(tmp_path / "run") if r.get("val/new/chrf")]) == 3
    callback = early_stopping(2, 0.0, Selection("loss", "old"))
    assert (callback.monitor, callback.mode) == ("val/old/loss", "min")


def test_the_default_selects_by_validation_bleu_with_the_names_checkpoints_already_hold():
    cfg = compose_config([])
    assert list(cfg.data.valid_sets) == [] and cfg.checkpoint.select_on is None
    selection = choose_selection(cfg.checkpoint.metric, cfg.checkpoint.select_on, [])
    assert (selection.monitor, selection.mode) == ("val/bleu", "max")
    epochs = plan_checkpoints(Path("/tmp/x"), None, 5, 0, selection=selection).best
    steps = plan_checkpoints(Path("/tmp/x"), 4, 5, 0, selection=selection).best
    assert epochs.filename == "best-epoch{epoch:03d}-bleu{val/bleu:.2f}"
    assert steps.filename == "best-step{step:08d}-bleu{val/bleu:.2f}"
    assert (epochs.monitor, epochs.mode) == ("val/bleu", "max")
    assert (early_stopping(1, 0.0).monitor, early_stopping(1, 0.0).mode) == ("val/bleu", "max")
    assert choose_selection("bleu", None, ["a", "b"]) == Selection("bleu", "a")  # the first set


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["checkpoint.metric=ppl"], r"checkpoint.metric='ppl' is not one of bleu, chrf, loss"),
        (["checkpoint.select_on=old"], r"checkpoint.select_on='old' names a validation set, but data"),
        (
            ["data.valid_sets=[{name: new}, {name: old}]", "checkpoint.select_on=od"],
            r"checkpoint.select_on='od' is not a validation set; data.valid_sets names new, old",
        ),
        (["data.valid_sets=[{name: a}, {name: a}]"], r"data.valid_sets\[1\].name 'a' is used twice"),
        (["data.valid_sets=[{name: a, wieght: 2}]"], r"data.valid_sets\[0\].wieght is not a setting"),
    ],
)
def test_bad_settings_are_refused_naming_the_key_before_the_data_is_read(extra, message, tmp_path):
    cfg = compose_config([f"data.data_dir={tmp_path / 'none'}", *extra], tmp_path / "run")
    with pytest.raises(ValueError, match=message):
        train(cfg)
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before anything was written
