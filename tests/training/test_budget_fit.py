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
from training.budget import BudgetSettings
from training.budget.fit import BudgetFit, validation_interval
from training.budget.timer import BudgetTimer
from training.lr.shapes import schedule_factor
from training.module import TranslationModule
from training.stopping import early_stopping

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


class StopAt(L.Callback):
    """Stops the run after update ``steps``, as an interruption does: unlike ``trainer.max_steps``,
    no limit the fit would forecast to (which the tests of the run limit set themselves)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.global_step >= self.steps:
            trainer.should_stop = True
            trainer.limit_val_batches = 0  # Lightning would validate the stopped epoch: max_steps does not


def _run(
    tmp_path, steps: int, fit: BudgetFit, clock: Clock, resume: str | None = None, save: bool = False,
    schedule: str = "inverse_sqrt", max_steps: int = -1, max_epochs: int | None = None,
):  # fmt: skip
    batch, _, vocab = _toy_batch()
    torch.manual_seed(0)
    total = None if schedule == "inverse_sqrt" else 1000  # a decaying shape's end, past its warmup
    lr = {"peak": 3e-3, "warmup_steps": 50, "schedule": schedule, "total_steps": total}
    module = TranslationModule(_tiny(vocab), lr=lr)
    tick = Tick(clock)
    callbacks = [tick, fit, StopAt(steps)]
    if save:
        callbacks.append(
            ModelCheckpoint(
                dirpath=tmp_path, filename="e{epoch}", save_top_k=-1, auto_insert_metric_name=False
            )
        )
    trainer = L.Trainer(
        max_steps=max_steps, max_epochs=max_epochs, accelerator="cpu", logger=False,
        enable_checkpointing=save, callbacks=callbacks,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    loader = DataLoader([batch] * PER_EPOCH, batch_size=None)
    trainer.fit(module, train_dataloaders=loader, ckpt_path=resume)
    return module, tick


def _fit(clock: Clock, ckpt_dir, budget_s: float = 100.0, **settings) -> BudgetFit:
    return BudgetFit(budget_s, BudgetSettings(**settings), 3, ckpt_dir, probe=5, clock=clock)


def test_a_budget_that_holds_the_schedule_leaves_it_and_its_averaging_as_configured(tmp_path, caplog):
    clock = Clock()
    fit = _fit(clock, tmp_path, budget_s=2000.0)
    with caplog.at_level(logging.INFO, logger="training.budget.fit"):
        module, tick = _run(tmp_path, 12, fit, clock)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert len(said) == 1 and "inverse_sqrt as configured" in said[0]
    assert "averaging the last 3 epoch checkpoints, as configured" in said[0]
    assert module.learning_rate.fitted is None and fit.points == [] and fit.average() is None
    configured = schedule_factor("inverse_sqrt", 50)
    assert all(lr == pytest.approx(3e-3 * configured(step)) for step, lr in tick.lrs.items())


def test_the_fit_after_the_probe_sets_the_rate_the_run_then_takes_and_says_so(tmp_path, caplog):
    clock = Clock()
    fit = _fit(clock, tmp_path)
    with caplog.at_level(logging.INFO, logger="training.budget.fit"):
        module, tick = _run(tmp_path, 40, fit, clock)
    # 6 updates in 6 s (5 timed); 94 s left, a tenth kept for validation: 6 + 84 = 90 updates, too
    # few for warmup 50 twice over: warmup 36 (two fifths), then a line to 0 at update 90.
    assert fit.forecast_updates == 90
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert len(said) == 1 and "~90 updates" in said[0] and "warmup 36 updates" in said[0]
    assert "linear to 0x the peak at update 90" in said[0] and "inverse_sqrt needs ~100" in said[0]
    schedule = module.learning_rate.fitted
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
    straight, straight_tick = _run(tmp_path / "a", 40, _fit(clock, tmp_path / "a"), clock, save=True)
    resumed_clock = Clock()
    resumed_fit = _fit(resumed_clock, tmp_path / "b")
    resumed, resumed_tick = _run(
        tmp_path / "b", 40, resumed_fit, resumed_clock, resume=str(tmp_path / "a" / "e1.ckpt")
    )
    assert resumed.learning_rate.fitted == straight.learning_rate.fitted
    assert resumed_fit.forecast_updates == 90  # from the checkpoint: no fit again
    later = range(21, 41)
    assert [resumed_tick.lrs[s] for s in later] == [straight_tick.lrs[s] for s in later]
    assert [resumed_tick.losses[s] for s in later] == [straight_tick.losses[s] for s in later]
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("max_steps", "max_epochs", "limit", "setting"),
    [(40, None, 40, "trainer.max_steps=40"), (-1, 3, 30, "trainer.max_epochs=3")],
)
def test_a_run_whose_own_limit_ends_it_before_the_budget_decays_to_that_limit(
    tmp_path, caplog, max_steps, max_epochs, limit, setting
):
    """The budget holds 90 updates, but the run's step or epoch limit ends it first: the decay
    ends there (fitted to 90, the run would stop with the rate at half its peak), and the log and
    results.json say which limit ended it."""
    clock = Clock()
    fit = _fit(clock, tmp_path)
    with caplog.at_level(logging.INFO, logger="training.budget.fit"):
        module, tick = _run(tmp_path, 100, fit, clock, max_steps=max_steps, max_epochs=max_epochs)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert len(said) == 1 and f"{setting} ends the run before the budget does, at ~{limit} updates" in said[0]
    assert fit.forecast_updates == limit and fit.said["ended_by"] == setting
    assert module.learning_rate.fitted.end == limit == max(tick.lrs)  # the run's last update
    assert tick.lrs[limit] < 0.05 * 3e-3 < tick.lrs[limit // 2]  # at the floor when the run ends


def test_a_run_resumed_with_a_later_limit_refits_to_it_and_one_without_a_limit_to_the_budget(
    tmp_path, caplog
):
    """Fitted to the 30 updates of trainer.max_steps=30 (the budget holds 90), resumed with 60: the
    rate rises back from the floor, never jumping, and decays to it at update 60; resumed again with
    no limit (Lightning's 1,000 epochs), to the budget's end."""
    clock = Clock()
    first = _fit(clock, tmp_path / "a")
    _run(tmp_path / "a", 100, first, clock, save=True, max_steps=30)
    assert first.forecast_updates == 30
    ckpt = tmp_path / "a" / "e2.ckpt"  # after update 30
    assert torch.load(ckpt, weights_only=True)["global_step"] == 30
    later = Clock()
    longer = _fit(later, tmp_path / "b")
    with caplog.at_level(logging.INFO, logger="training.budget.fit"):
        module, tick = _run(tmp_path / "b", 100, longer, later, resume=str(ckpt), save=True, max_steps=60)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert any(
        "the run's limit changed on resume (trainer.max_steps=60): update 30 to update 60" in s for s in said
    )
    assert longer.forecast_updates == 60 and module.learning_rate.fitted.end == 60
    rates = [tick.lrs[s] for s in range(31, 61)]
    assert rates[0] < 0.05 * 3e-3 and max(rates) > 0.2 * 3e-3 and rates[-1] < 0.05 * 3e-3
    assert all(abs(b - a) <= 3e-3 / 5 for a, b in zip(rates, rates[1:], strict=False))  # no jump
    caplog.clear()
    unbounded = _fit(Clock(), tmp_path / "c")
    with caplog.at_level(logging.INFO, logger="training.budget.fit"):
        _run(tmp_path / "c", 61, unbounded, unbounded.clock, resume=str(tmp_path / "b" / "e5.ckpt"))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    # no limit given: Lightning's 1,000 epochs
    limit = "the run's limit changed on resume (trainer.max_epochs=1000): update 60 to update 10,000"
    assert any(limit in s for s in said)
    assert unbounded.forecast_updates > 60 and unbounded.said["ended_by"] == "trainer.max_time"


def test_the_weights_of_the_budgets_last_part_are_averaged(tmp_path):
    clock = Clock()
    fit = _fit(clock, tmp_path, budget_s=30.0)
    module, _ = _run(tmp_path, 40, fit, clock, schedule="linear")
    # 6 + 24 * 0.9 = 27 updates forecast: updates 22, 25, 27 (the last fifth), taken as they came.
    assert fit.forecast_updates == 27 and fit.taken == [22, 25, 27] and fit.points == [22, 25, 27]
    paths, weights = fit.average()
    assert [p.name for p in paths] == [f"average-point-update{s:08d}.ckpt" for s in (22, 25, 27)]
    assert weights == [1.0, 1.0, 1.0]
    last = {f"model.{k}": v for k, v in module.model.state_dict().items()}
    assert torch.load(paths[-1], weights_only=True)["state_dict"].keys() == last.keys()


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


class Paced(L.Callback):
    """A clock for a run that validates: each update costs ``cost(update)`` seconds, each validation
    ``val_s``; records each update's rate, the weights after each update, and the schedule the
    learning rate had before and after each validation."""

    def __init__(self, clock: Clock, cost, val_s: float) -> None:  # noqa: ANN001
        self.clock, self.cost, self.val_s = clock, cost, val_s
        self.lrs, self.weights, self.around_validation = {}, {}, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.lrs[trainer.global_step + 1] = trainer.optimizers[0].param_groups[0]["lr"]
        self._before = pl_module.learning_rate.fitted

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.clock.now += self.cost(trainer.global_step)
        self.weights[trainer.global_step] = {k: v.clone() for k, v in pl_module.model.state_dict().items()}

    def on_validation_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        self._before = pl_module.learning_rate.fitted

    def on_validation_batch_end(self, trainer, pl_module, *args) -> None:  # noqa: ANN001, ANN002
        self.clock.now += self.val_s


class Validated(TranslationModule):
    """The toy module, validating (a loss-free stand-in) so that the fit paces and refits."""

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0) -> None:  # noqa: ANN001
        pass

    def on_validation_epoch_end(self) -> None:
        pass


def _validated_run(tmp_path, steps: int, fit: BudgetFit, paced: Paced, resume: str | None = None):
    batch, _, vocab = _toy_batch()
    torch.manual_seed(0)
    lr = {"peak": 3e-3, "warmup_steps": 50, "schedule": "linear", "total_steps": 1000}
    module = Validated(_tiny(vocab), lr=lr)
    checkpoints = ModelCheckpoint(dirpath=tmp_path, filename="e{epoch}", save_top_k=-1, save_last=True)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, callbacks=[paced, fit, checkpoints, StopAt(steps)],
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    loader = DataLoader([batch] * PER_EPOCH, batch_size=None)
    validation = DataLoader([batch], batch_size=None)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=validation, ckpt_path=resume)
    return module, trainer


@pytest.mark.parametrize("refits", [0, 1])
def test_with_validation_the_fit_paces_it_refits_on_drift_without_a_jump_and_averages_what_it_took(
    tmp_path, caplog, refits
):
    """150 s: an update costs 1 s, then (a shared machine) 1.3 s from update 45; a validation 4 s.
    The first validation sets validation every 4 epochs (4 s against 40 s of updates: 9%); the one
    after update 80 sees the speed drift (the 70 updates since the first validation in 80.8 s) and
    fits again to 117 updates, from the rate the run has, where ``budget.refits`` allows one."""
    clock = Clock()
    paced = Paced(clock, lambda step: 1.0 if step < 45 else 1.3, val_s=4.0)
    settings = BudgetSettings(average_fraction=0.3, refits=refits)
    fit = BudgetFit(150.0, settings, 3, tmp_path, probe=5, clock=clock)
    with caplog.at_level(logging.INFO, logger="training.budget.fit"):
        module, trainer = _validated_run(tmp_path, 113, fit, paced)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert fit.val_every == 4 == trainer.check_val_every_n_epoch  # paced: every 4th epoch validates
    assert fit.val_seconds == [4.0, 4.0, 4.0]  # after updates 10, 40 and 80
    assert fit.refits == refits and sum("the speed drifted" in s for s in said) == refits  # its count
    assert fit.forecast_updates == (117 if refits else 133)
    # Never a jump: each update's rate moves from the one before along a segment (a refit starts
    # where the rate is; one that restarted the decay from the peak would jump by ~1e-3).
    rates = [paced.lrs[s] for s in sorted(paced.lrs)]
    assert all(abs(b - a) <= 3e-3 / 36 for a, b in zip(rates, rates[1:], strict=False))
    assert rates[-1] < (3e-3 / 10 if refits else 3e-3 / 3)  # refitted: near the floor at the new end
    # The average is the mean of the weights the run had at the updates it took, exactly.
    # Refitted, the last part's epoch ends; else 110 of 110, 120, 130, and the weights the run
    # ended with (at 113, before the budget's end) stand for the rest.
    assert fit.taken == ([90, 100, 110] if refits else [110, 113])
    paths, weights = fit.average()
    assert len(paths) == len(fit.taken) and weights == [1.0] * len(paths)
    for name in ("encoder.layers.0.self_attn.in_proj.weight", "output.weight"):
        taken = torch.stack([paced.weights[s][name].double() for s in fit.taken])
        files = [torch.load(p, weights_only=True)["state_dict"][f"model.{name}"].double() for p in paths]
        assert torch.equal(torch.stack(files), taken)


def test_a_run_resumed_with_a_longer_budget_refits_to_its_new_end_and_no_checkpoint_holds_the_model_twice(
    tmp_path, caplog
):
    """30 s: 27 updates, a line to the floor at 27. Resumed there with 60 s: the rate rises back
    from the floor (never a jump) and decays to the floor at the new end, ~25 updates later."""
    clock = Clock()
    first = BudgetFit(30.0, BudgetSettings(), 3, tmp_path / "a", probe=5, clock=clock)
    _run(tmp_path / "a", 27, first, clock, save=True, schedule="linear")
    assert first.forecast_updates == 27
    ckpt = tmp_path / "a" / "e2.ckpt"  # after update 27, at the floor
    saved = torch.load(ckpt, weights_only=True)
    assert (
        saved["global_step"] == 27
        and saved["lr_schedulers"][0]["rate"]["fitted"]["segments"][-1]["end"] == 27
    )
    resumed_clock = Clock()
    longer = BudgetFit(60.0, BudgetSettings(), 3, tmp_path / "b", probe=5, clock=resumed_clock)
    with caplog.at_level(logging.INFO, logger="training.budget.fit"):
        module, tick = _run(
            tmp_path / "b", 60, longer, resumed_clock, resume=str(ckpt), save=True, schedule="linear"
        )
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("schedule fit")]
    assert any("trainer.max_time changed on resume, 30 s to 60 s" in s for s in said)
    end = longer.forecast_updates
    assert end > 45  # 27 done, 30 s more at 1 s an update, a tenth kept for validation
    rates = [tick.lrs[s] for s in range(28, end + 1)]
    assert rates[0] == pytest.approx(0.0, abs=1e-12)  # where it was: the old end's floor
    assert max(rates) > 0.2 * 3e-3 and rates[-1] == pytest.approx(
        0.0, abs=1e-12
    )  # up, then down to the new end
    assert all(abs(b - a) <= 3e-3 / 5 for a, b in zip(rates, rates[1:], strict=False))  # no jump
    for path in [*(tmp_path / "a").glob("e*.ckpt"), *(tmp_path / "b").glob("e*.ckpt")]:
        checkpoint = torch.load(path, weights_only=True)
        state = checkpoint["callbacks"]
        assert not [t for t in _tensors(state) if t.dtype == torch.float64], path
        assert sum(t.numel() for t in _tensors(state)) < 100, path  # no copy of the weights beside them


def _tensors(value) -> list[torch.Tensor]:  # noqa: ANN001
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


class Stalled(Validated):
    """The toy module whose validation BLEU never improves: early stopping's patience runs out."""

    def on_validation_epoch_end(self) -> None:
        self.log("val/bleu", 1.0)


@pytest.mark.parametrize("waits", ["after_decay", "patience"])
def test_early_stopping_waits_for_the_decay_fitted_to_the_budget(tmp_path, caplog, waits):
    """150 s, 1 s an update, validation every epoch (0.5 s), no refit (the fake clock runs on
    past the budget: no timer stops this run): the rate is fitted to decay until about update 140.
    Patience 1 with BLEU that never improves stops after the second validation (update 20) with
    ``budget.early_stopping=patience``; with ``after_decay`` it stops at the first validation once
    the decay has ended, and says at each one before why it went on."""
    clock = Clock()
    paced = Paced(clock, lambda step: 1.0, val_s=0.5)
    fit = BudgetFit(150.0, BudgetSettings(early_stopping=waits, refits=0), 3, tmp_path, probe=5, clock=clock)
    stop = early_stopping(1, 0.0, hold=fit.holds_stopping)
    batch, _, vocab = _toy_batch()
    lr = {"peak": 3e-3, "warmup_steps": 50, "schedule": "linear", "total_steps": 1000}
    module = Stalled(_tiny(vocab), lr=lr)
    trainer = L.Trainer(
        max_steps=1000, accelerator="cpu", logger=False, enable_checkpointing=False,
        callbacks=[paced, fit, stop], enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        trainer.fit(
            module, DataLoader([batch] * PER_EPOCH, batch_size=None), DataLoader([batch], batch_size=None)
        )
    end = fit.said["decay_end"]
    held = [r.getMessage() for r in caplog.records if "but the run goes on" in r.getMessage()]
    assert fit.said["fitted"] and 120 < end < 150
    if waits == "patience":
        assert trainer.global_step == 2 * PER_EPOCH and not held
    else:  # the first epoch end at or past the decay's end
        assert end <= trainer.global_step < end + PER_EPOCH and trainer.global_step % PER_EPOCH == 0
        assert len(held) == trainer.global_step // PER_EPOCH - 2  # every validation from the 2nd on
        assert f"decays until update {end:,}" in held[0]
    assert stop.stopping_reason_message is not None and "did not improve" in stop.stopping_reason_message


def test_a_bad_early_stopping_setting_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"early_stopping='never' is not one of after_decay, patience"):
        BudgetSettings.from_dict({"early_stopping": "never"})
    assert BudgetSettings.from_dict({"early_stopping": "patience"}).early_stopping == "patience"


def test_early_stopping_waits_in_the_cpu_recipes_and_stops_as_before_by_default():
    """The default computes what runs did before the key (a resumed old checkpoint sees no change);
    the CPU recipes, whose decay is fitted to their 30 minutes, wait for it."""
    from tests.training.test_pipeline import compose_config

    assert compose_config([]).budget.early_stopping == "patience" == BudgetSettings().early_stopping
    assert compose_config(["experiment=multi30k_de_en"]).budget.early_stopping == "after_decay"


class StopAtBudget(L.Callback):
    """Stops the run once the fake clock has spent ``budget_s``, as the time limit does."""

    def __init__(self, clock: Clock, budget_s: float) -> None:
        self.clock, self.budget_s = clock, budget_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if self.clock.now >= self.budget_s:
            trainer.should_stop = True


@pytest.mark.parametrize("refits", [None, 3])
def test_on_a_host_that_speeds_up_the_decay_ends_where_the_budget_does(tmp_path, refits):
    """300 s, a validation every epoch (0.5 s): updates 10-59 cost 1.6 s (a neighbour's job), the
    rest 1.0 s, and the run trains 258. Forecasting again as often as the speed since the first
    validation moves the forecast (the default, ``budget.refits=-1``) ends the decay within the
    drift (3%) and an epoch of the end; a limit of 3 spends its refits on the slow epochs and trains
    a fifth of the run at the floor (206 of 258: a Zen 3's 60 minutes, at 3, trained 9% there)."""
    clock = Clock()
    paced = Paced(clock, lambda step: 1.6 if 10 <= step < 60 else 1.0, val_s=0.5)
    settings = BudgetSettings() if refits is None else BudgetSettings(refits=refits)
    fit = BudgetFit(300.0, settings, 3, tmp_path, probe=5, clock=clock)
    batch, _, vocab = _toy_batch()
    torch.manual_seed(0)
    lr = {"peak": 3e-3, "warmup_steps": 50, "schedule": "linear", "total_steps": 1000}
    trainer = L.Trainer(
        accelerator="cpu", logger=False, callbacks=[paced, fit, StopAtBudget(clock, 300.0)],
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        enable_checkpointing=False, max_epochs=-1,
    )  # fmt: skip
    loader = DataLoader([batch] * PER_EPOCH, batch_size=None)
    validation = DataLoader([batch], batch_size=None)
    trainer.fit(Validated(_tiny(vocab), lr=lr), train_dataloaders=loader, val_dataloaders=validation)
    trained = trainer.global_step
    at_floor = [step for step, rate in paced.lrs.items() if rate == 0.0]
    assert fit.val_every == 1 and trained == 258
    if refits is None:
        assert fit.refits > 3 and len(at_floor) <= 0.03 * trained + PER_EPOCH
        assert fit.said["decay_end"] >= trained - len(at_floor)
    else:
        assert fit.refits == 3 and len(at_floor) > 0.15 * trained  # the trap the limit leaves
    rates = [paced.lrs[s] for s in sorted(paced.lrs)]  # and still never a jump
    assert all(abs(b - a) <= 3e-3 / 20 for a, b in zip(rates, rates[1:], strict=False))
