"""A time-limited run fits its schedule to the updates it will get (training/budget_fit.py): the fit
after the probe, its log line, the rate the optimizer then takes, the averaged weights, a resume
that continues bit-exactly, validation paced within its share, none after the time limit.

Time is a fake clock here (``Tick``: a second an update, ``val_s`` a validation), so that the
forecasts are exact and a resumed run sees what the straight one saw.
"""

from __future__ import annotations

import logging
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from torch.utils.data import DataLoader

from tests.training.test_module import _tiny, _toy_batch
from training.budget_fit import BudgetFit, BudgetTimer, FitSettings, validation_interval
from training.module import TranslationModule
from training.schedule import schedule_factor

PER_EPOCH = 10  # batches (updates) an epoch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Tick(L.Callback):
    """Advances the clock a second an update (before BudgetFit sees the update), and records the
    learning rate each update took and its loss."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.lrs, self.losses = clock, {}, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.lrs[trainer.global_step + 1] = trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.clock.now += 1.0
        self.losses[trainer.global_step] = float(outputs["loss"])


def _run(tmp_path, steps: int, fit: BudgetFit, clock: Clock, resume: str | None = None, save: bool = False):
    batch, _, vocab = _toy_batch()
    torch.manual_seed(0)
    module = TranslationModule(_tiny(vocab), optimizer={"lr": 3e-3, "warmup_steps": 50})
    tick = Tick(clock)
    callbacks = [tick, fit]
    if save:
        callbacks.append(
            ModelCheckpoint(
                dirpath=tmp_path, filename="e{epoch}", save_top_k=-1, auto_insert_metric_name=False
            )
        )
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=save, callbacks=callbacks,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    loader = DataLoader([batch] * PER_EPOCH, batch_size=None)
    trainer.fit(module, train_dataloaders=loader, ckpt_path=resume)
    return module, tick


def _fit(clock: Clock, **settings) -> BudgetFit:
    return BudgetFit(
        100.0, FitSettings(**settings), "inverse_sqrt", 50, 0.0, average_last=3, probe=5, clock=clock
    )


def test_a_budget_that_holds_the_schedule_leaves_it_and_its_averaging_as_configured(tmp_path, caplog):
    clock = Clock()
    fit = BudgetFit(2000.0, FitSettings(), "inverse_sqrt", 50, 0.0, average_last=3, probe=5, clock=clock)
    with caplog.at_level(logging.INFO, logger="training.budget_fit"):
        module, tick = _run(tmp_path, 12, fit, clock)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert len(said) == 1 and "inverse_sqrt as configured" in said[0]
    assert "averaging the last 3 epoch checkpoints, as configured" in said[0]
    assert module.fitted_schedule is None and fit.points == [] and fit.average() is None
    configured = schedule_factor("inverse_sqrt", 50)
    assert all(lr == pytest.approx(3e-3 * configured(step)) for step, lr in tick.lrs.items())


def test_the_fit_after_the_probe_sets_the_rate_the_run_then_takes_and_says_so(tmp_path, caplog):
    clock = Clock()
    fit = _fit(clock)
    with caplog.at_level(logging.INFO, logger="training.budget_fit"):
        module, tick = _run(tmp_path, 40, fit, clock)
    # 6 updates in 6 s (5 timed); 94 s left, a tenth kept for validation: 6 + 84 = 90 updates, too
    # few for warmup 50 twice over: warmup 36 (two fifths), then a line to 0 at update 90.
    assert fit.forecast_updates == 90
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert len(said) == 1 and "~90 updates" in said[0] and "warmup 36 updates" in said[0]
    assert "linear to 0x the peak at update 90" in said[0] and "inverse_sqrt needs ~100" in said[0]
    schedule = module.fitted_schedule
    assert schedule is not None and schedule.start == 7 and schedule.end == 90
    configured = schedule_factor("inverse_sqrt", 50)
    for step, lr in tick.lrs.items():  # the rate each update took: the configured one, then the fit's
        expected = configured(step) if step < 7 else schedule.factor(step)
        assert lr == pytest.approx(3e-3 * expected), step
    assert fit.said["forecast_updates"] == 90 and fit.said["warmup"] == 36 and fit.said["fitted"]
    assert fit.points == [72, 81, 90]  # the last fifth of 90 updates; the run stopped at 40: none taken
    assert fit.average() is None


def test_a_run_resumed_after_the_fit_continues_bit_exactly(tmp_path):
    clock = Clock()
    straight, straight_tick = _run(tmp_path / "a", 40, _fit(clock), clock, save=True)
    resumed_clock = Clock()
    resumed_fit = _fit(resumed_clock)
    resumed, resumed_tick = _run(
        tmp_path / "b", 40, resumed_fit, resumed_clock, resume=str(tmp_path / "a" / "e1.ckpt")
    )
    assert resumed.fitted_schedule == straight.fitted_schedule
    assert resumed_fit.forecast_updates == 90  # from the checkpoint: no fit again
    later = range(21, 41)
    assert [resumed_tick.lrs[s] for s in later] == [straight_tick.lrs[s] for s in later]
    assert [resumed_tick.losses[s] for s in later] == [straight_tick.losses[s] for s in later]
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_weights_of_the_budgets_last_part_are_averaged(tmp_path):
    clock = Clock()
    fit = BudgetFit(30.0, FitSettings(), "linear", 50, 0.0, average_last=3, probe=5, clock=clock)
    module, _ = _run(tmp_path, 40, fit, clock)
    # 6 + 24 * 0.9 = 27 updates forecast: updates 22, 25, 27 (the last fifth), taken as they came.
    assert fit.forecast_updates == 27 and fit.taken == [22, 25, 27] and fit.points == [22, 25, 27]
    average = fit.average()
    assert average is not None and average.keys() == module.model.state_dict().keys()


@pytest.mark.parametrize(
    "val_s, per_update, expected", [(10.0, 2.27, 1), (4.0, 0.4, 1), (10.0, 0.034, 23), (60.0, 0.0, 1)]
)
def test_validation_is_paced_within_its_share(val_s, per_update, expected):
    """Every epoch where that keeps validation within a tenth of the time (the Zen 3, Zen 5),
    every k epochs where an epoch is short (an H200: 117 updates in 4 s, a validation 10 s)."""
    every = validation_interval(val_s, per_update, 117, 0.1)
    assert every == expected
    if per_update > 0:
        share = lambda k: val_s / (val_s + k * per_update * 117)  # noqa: E731
        assert share(every) <= 0.1 + 1e-9 and (every == 1 or share(every - 1) > 0.1)


class Counting(L.LightningModule):
    """A linear layer that sleeps a tenth of a second an update, and counts its validations."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.validations = 0

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        time.sleep(0.1)
        return self.layer(batch).sum()

    def validation_step(self, batch, batch_idx) -> None:  # noqa: ANN001
        pass

    def on_validation_epoch_end(self) -> None:
        self.validations += 1

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("timer", [Timer, BudgetTimer])
def test_no_validation_follows_the_time_limit(timer):
    """Lightning's Timer stops a run mid-epoch and then validates it; BudgetTimer does not."""
    module = Counting()
    trainer = L.Trainer(
        max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer(duration={"seconds": 0.5})],
    )  # fmt: skip
    data = DataLoader(torch.randn(20, 2), batch_size=1)
    trainer.fit(module, train_dataloaders=data, val_dataloaders=DataLoader(torch.randn(2, 2), batch_size=1))
    assert trainer.global_step < 20  # stopped by the time limit in the first epoch
    assert module.validations == (1 if timer is Timer else 0)
