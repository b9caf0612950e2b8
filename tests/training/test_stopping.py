"""Stopping for a reason: non-finite updates are skipped, too many stop the run; early stopping,
and its hold (training/stopping.py)."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from torch.utils.data import DataLoader

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training import module as module_mod
from training.nonfinite import NonFiniteError, NonFiniteGuard, PendingUpdate, UpdatePlace, nonfinite_flags
from training.pipeline import train
from training.stopping import EarlyStop, early_stopping


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


def inject_nan(monkeypatch, bad_calls: set[int] | None = None, from_call: int | None = None) -> list[int]:
    """Makes the training loss NaN at the given 1-based training calls (or from one on)."""
    real = module_mod.token_losses
    calls: list[int] = []

    def losses(*args, **kwargs):
        out = real(*args, **kwargs)
        if not torch.is_grad_enabled():  # validation and test stay finite
            return out
        calls.append(len(calls) + 1)
        n = calls[-1]
        if (bad_calls and n in bad_calls) or (from_call is not None and n >= from_call):
            return out * float("nan")
        return out

    monkeypatch.setattr(module_mod, "token_losses", losses)
    return calls


def _finite(state: dict) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())


# Fused Adam (the default) skips on the device, through its found_inf; the per-tensor one on the host's word.
@pytest.mark.parametrize("fused", ["null", "false"], ids=["skipped-on-the-device", "skipped-by-the-host"])
def test_nonfinite_updates_are_skipped_logged_and_never_applied(toy, tmp_path, monkeypatch, caplog, fused):
    calls = inject_nan(monkeypatch, bad_calls={3, 5})
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=1", "trainer.limit_train_batches=8"]
    overrides += [f"optimizer.fused={fused}"]
    overrides += ["trainer.limit_val_batches=1", "test=false"]
    caplog.set_level(logging.WARNING)
    results = train(compose_config(overrides, tmp_path / "run"))
    assert len(calls) == 8
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 8  # Lightning counts skipped steps, as fp16's skipped ones
    adam = ckpt["optimizer"] if "optimizer" in ckpt else ckpt["optimizer_states"][0]
    assert int(adam["state"][0]["step"]) == 6  # ... but 2 of the 8 updates were not applied
    assert _finite(ckpt["state_dict"]) and all(_finite(s) for s in adam["state"].values())
    skips = [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]
    assert len(skips) == 2
    assert "non-finite loss at step 3, epoch 0, batch 2 of the epoch" in skips[0]
    assert "1 in a row; max_nonfinite_in_a_row=10" in skips[0]  # a good update in between resets
    assert "batch 4 of the epoch" in skips[1] and "1 in a row" in skips[1]
    assert results["train/skipped_updates"] == 2


def test_too_many_nonfinite_updates_in_a_row_stop_naming_step_batch_checkpoint(toy, tmp_path, monkeypatch):
    inject_nan(monkeypatch, from_call=6)
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=3", "trainer.limit_train_batches=4"]
    overrides += ["trainer.limit_val_batches=1", "test=false", "max_nonfinite_in_a_row=3"]
    with pytest.raises(NonFiniteError) as err:
        train(compose_config(overrides, tmp_path / "run"))
    message = str(err.value)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert "3 updates in a row" in message and "max_nonfinite_in_a_row=3" in message
    # Calls 1-4: epoch 0; call 5: step 5; calls 6, 7, 8 (batches 1-3 of epoch 1) are skipped.
    assert "the last at step 8, epoch 1, batch 3 of the epoch (example ids [" in message
    assert f"the last good checkpoint is {last}" in message
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == 4 and _finite(ckpt["state_dict"])
    results = json.loads((tmp_path / "run" / "results.json").read_text())  # written, then raised
    assert results["ending"] == "failed" and results["ending_update"] == 7  # the 8th raised
    assert results["ending_detail"].startswith("NonFiniteError: ")


def test_guard_refuses_a_limit_below_one():
    with pytest.raises(ValueError, match="max_nonfinite_in_a_row must be at least 1"):
        NonFiniteGuard(0)


def _validations(run: Path) -> list[float]:
    with open(run / "logs" / "metrics.csv", newline="") as f:
        return [float(row["val/bleu"]) for row in csv.DictReader(f) if row.get("val/bleu")]


@pytest.mark.parametrize("patience, expected", [(None, 5), (2, 3)])
def test_early_stopping_on_validation_bleu_is_off_by_default(toy, tmp_path, patience, expected):
    """With lr 0 validation BLEU never improves: patience 2 stops after the 3rd validation."""
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=5", "trainer.limit_train_batches=2"]
    overrides += ["trainer.limit_val_batches=2", "test=false", "lr.peak=0.0"]
    overrides += [f"early_stopping.patience={'null' if patience is None else patience}"]
    train(compose_config(overrides, tmp_path / "run"))
    bleu = _validations(tmp_path / "run")
    assert len(bleu) == expected and len(set(bleu)) == 1


def test_early_stopping_refuses_a_patience_below_one(toy, tmp_path):
    overrides = [*toy_overrides(*toy), "early_stopping.patience=0"]
    with pytest.raises(ValueError, match="early_stopping.patience must be null"):
        train(compose_config(overrides, tmp_path / "run"))


class LateCopy:
    """Stands for the CUDA event of a flags copy still under way, until ``done``."""

    done = False

    def query(self) -> bool:
        return LateCopy.done

    def synchronize(self) -> None:
        LateCopy.done = True


def test_flags_that_arrive_late_are_counted_in_order_each_naming_its_own_update(monkeypatch, caplog):
    real_init = PendingUpdate.__init__

    def late_init(self, flags, where):  # noqa: ANN001
        real_init(self, flags, where)
        self.event = LateCopy()

    monkeypatch.setattr(PendingUpdate, "__init__", late_init)
    LateCopy.done = False
    guard = NonFiniteGuard(max_in_a_row=2)
    caplog.set_level(logging.WARNING)
    nan, one = torch.tensor(float("nan")), torch.tensor(1.0)
    for step, loss in enumerate([nan, one, nan], start=1):
        flags = nonfinite_flags(loss, torch.tensor(2.0))
        assert guard.decide(None, flags, UpdatePlace(step, 0, step - 1), on_device=True)  # the device decides
    assert guard.skipped == 0 and len(guard.pending) == 3 and not caplog.records  # nothing read yet
    LateCopy.done = True  # the copies arrive: read in order at the next update
    with pytest.raises(NonFiniteError, match="the last at step 4, epoch 0, batch 3 of the epoch"):
        guard.decide(None, nonfinite_flags(one, torch.tensor(float("inf"))), UpdatePlace(4, 0, 3), True)
    skips = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in skips] == [
        "non-finite loss at step 1, epoch 0, batch 0 of the epoch (example ids [])",
        "non-finite loss at step 3, epoch 0, batch 2 of the epoch (example ids [])",
        "non-finite gradient norm at step 4, epoch 0, batch 3 of the epoch (example ids [])",
    ]
    assert "1 in a row" in skips[0] and "1 in a row" in skips[1] and "2 in a row" in skips[2]


def test_the_host_decides_at_once_where_the_optimizer_cannot_skip_on_the_device():
    guard = NonFiniteGuard(max_in_a_row=3)
    bad = nonfinite_flags(torch.tensor(1.0), torch.tensor(float("nan")))
    assert not guard.decide(None, bad, UpdatePlace(1, 0, 0), on_device=False)
    assert guard.decide(None, nonfinite_flags(None, torch.tensor(1.0)), UpdatePlace(2, 0, 1), on_device=False)
    assert guard.state_dict() == {"in_a_row": 0, "skipped": 1}
    # fp16's scaler checks the gradients itself: only the loss counts then
    assert nonfinite_flags(torch.tensor(1.0), torch.tensor(float("inf")), check_grads=False).tolist() == [
        0,
        0,
    ]


class Constant(L.LightningModule):
    """One weight; validation logs ``values`` in turn as ``val/bleu``."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.w, self.values, self.validations = torch.nn.Parameter(torch.zeros(1)), values, 0

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        return (self.w * batch).sum()

    def validation_step(self, batch, batch_idx) -> None:  # noqa: ANN001
        pass

    def on_validation_epoch_end(self) -> None:
        self.log("val/bleu", self.values[min(self.validations, len(self.values) - 1)])
        self.validations += 1

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _stopped_at(values: list[float], hold) -> tuple[int, EarlyStop]:  # noqa: ANN001
    stop = early_stopping(2, 0.0, hold=hold)
    trainer = L.Trainer(
        max_epochs=10, accelerator="cpu", logger=False, enable_checkpointing=False, callbacks=[stop],
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    data = DataLoader(torch.ones(4, 1), batch_size=1)  # 4 updates an epoch
    trainer.fit(Constant(values), data, DataLoader(torch.ones(1, 1), batch_size=1))
    return trainer.global_step, stop


def test_a_hold_defers_only_a_stop_for_patience_and_the_count_goes_on():
    """Patience 2, BLEU flat from the first validation: it stops after the third (update 12); held
    until update 24 it stops at the first validation there, its count of 6 kept; a NaN stops at
    once, held or not; with no reason given the hold changes nothing."""
    assert _stopped_at([1.0], None)[0] == 12
    assert _stopped_at([1.0], lambda update: None)[0] == 12
    step, stop = _stopped_at([1.0], lambda update: "decaying" if update < 24 else None)
    assert step == 24 and stop.wait_count == 5
    assert stop.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED
    step, stop = _stopped_at([1.0, float("nan")], lambda update: "decaying")
    assert step == 8 and stop.stopping_reason == EarlyStoppingReason.NON_FINITE_METRIC
    step, stop = _stopped_at([1.0, 2.0, 3.0, 1.0], lambda update: "decaying" if update < 36 else None)
    assert step == 36 and stop.best_score == 3.0  # improving validations reset its count


def test_its_checkpoint_state_keeps_lightnings_key():
    """Checkpoints written with Lightning's EarlyStopping resume into it, and the other way round."""
    ours, theirs = early_stopping(3, 0.0), EarlyStopping(monitor="val/bleu", mode="max")
    assert ours.state_key == theirs.state_key == "EarlyStopping{'monitor': 'val/bleu', 'mode': 'max'}"
