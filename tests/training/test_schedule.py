"""The learning rate's shapes: a linear warmup from 0 to the peak, then each decay to its end (or the
peak kept, or lowered on validation plateaus, here through a real Trainer); the run length they
need is taken from the Trainer, or refused naming the setting."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from common.checkpoint_file import CheckpointError
from tests.training.test_module import _tiny, _toy_batch
from training.lr import RateOnValidation, RateScheduler
from training.lr.plateau import Plateau
from training.lr.shapes import cosine_factor, linear_factor, schedule_factor
from training.module import TranslationModule
from training.pipeline import default_config
from training.start.resume import check_config

WARMUP, TOTAL = 10, 50


@pytest.mark.parametrize("name", ["cosine", "linear", "inverse_sqrt", "constant", "plateau"])
def test_warmup_rises_linearly_to_the_peak_at_its_end(name):
    factor = schedule_factor(name, WARMUP, TOTAL)
    rising = [factor(s) for s in range(1, WARMUP + 1)]
    assert rising == pytest.approx([s / WARMUP for s in range(1, WARMUP + 1)])
    assert max(factor(s) for s in range(1, 3 * TOTAL)) == pytest.approx(1.0) == factor(WARMUP)


@pytest.mark.parametrize("floor", [0.0, 0.1])
def test_cosine_and_linear_decay_to_their_floor_at_the_last_update_and_stay(floor):
    assert cosine_factor(0, WARMUP, TOTAL, floor) == linear_factor(0, WARMUP, TOTAL, floor) == 0.0
    for factor in (cosine_factor, linear_factor):
        decay = [factor(s, WARMUP, TOTAL, floor) for s in range(WARMUP, TOTAL + 1)]
        assert all(a > b for a, b in zip(decay, decay[1:], strict=False))  # strictly down to the end
        assert decay[-1] == pytest.approx(floor)
        assert factor(TOTAL + 100, WARMUP, TOTAL, floor) == pytest.approx(floor)
    middle = (WARMUP + TOTAL) // 2
    assert cosine_factor(middle, WARMUP, TOTAL, floor) == pytest.approx(floor + (1 - floor) / 2)
    assert linear_factor(middle, WARMUP, TOTAL, floor) == pytest.approx(floor + (1 - floor) / 2)
    # A quarter into the decay: the cosine still near its peak, the line a quarter down.
    quarter = WARMUP + (TOTAL - WARMUP) // 4
    q = (quarter - WARMUP) / (TOTAL - WARMUP)
    assert cosine_factor(quarter, WARMUP, TOTAL, floor) == pytest.approx(
        floor + (1 - floor) * (1 + math.cos(math.pi * q)) / 2
    )
    assert linear_factor(quarter, WARMUP, TOTAL, floor) == pytest.approx(1 - (1 - floor) * q)


@pytest.mark.parametrize("name", ["constant", "plateau"])
def test_constant_and_plateau_keep_the_peak_after_warmup_without_a_run_length(name):
    factor = schedule_factor(name, WARMUP)
    assert [factor(s) for s in range(WARMUP, 10 * TOTAL)] == [1.0] * (10 * TOTAL - WARMUP)


def test_plateau_halves_its_scale_after_patience_validations_without_improvement_down_to_its_floor():
    plateau = Plateau("max", factor=0.5, patience=2, min_ratio=0.2)
    scales = []
    for value in [10, 12, 11, 12, 13, 13, 12.5, 14, 1, 1, 1, 1, 1, 1]:
        plateau.observe(value)
        scales.append(plateau.scale)
    # 12 -> 11, 12: two without improvement (12 is not better than 12): halved; 13 improves; ...
    assert scales == pytest.approx([1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.2, 0.2, 0.2, 0.2, 0.2])
    again = Plateau("max", factor=0.5, patience=2, min_ratio=0.2)
    again.load_state_dict(plateau.state_dict())  # what a checkpoint holds: a resumed run goes on alike
    assert again.state_dict() == plateau.state_dict()


def test_plateau_on_a_loss_lowers_where_it_stops_falling_and_refuses_bad_settings():
    plateau = Plateau("min", factor=0.1, patience=1)
    assert [plateau.observe(v) for v in [3.0, 2.5, 2.6, 2.4, 2.4]] == [False, False, True, False, True]
    assert plateau.scale == pytest.approx(0.01)
    with pytest.raises(ValueError, match="lr.plateau_factor must be within"):
        Plateau("max", factor=1.5, patience=2)
    with pytest.raises(ValueError, match="lr.plateau_patience must be at least 1"):
        Plateau("max", factor=0.5, patience=0)


class _Scripted(TranslationModule):
    """The toy module, whose validation logs the next of ``values`` as ``val/bleu``."""

    def __init__(self, values: list[float], **kwargs) -> None:
        super().__init__(**kwargs)
        self.values, self.rates = list(values), {}

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0) -> None:  # noqa: ANN001
        pass

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.log("val/bleu", self.values[self.current_epoch])

    def on_train_batch_start(self, batch, batch_idx) -> None:  # noqa: ANN001
        self.rates[self.trainer.global_step + 1] = self.trainer.optimizers[0].param_groups[0]["lr"]


def _plateau_run(tmp_path, values: list[float], epochs: int, resume: str | None = None) -> _Scripted:
    batch, _, vocab = _toy_batch()
    torch.manual_seed(0)
    lr = {
        "peak": 2.0e-3,
        "schedule": "plateau",
        "warmup_steps": 1,
        "plateau_factor": 0.5,
        "plateau_patience": 1,
    }
    module = _Scripted(values, model=_tiny(vocab), lr=lr)
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", logger=False, callbacks=[RateOnValidation("val/bleu")],
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )  # fmt: skip
    loader = DataLoader([batch] * 3, batch_size=None)
    trainer.fit(
        module,
        train_dataloaders=loader,
        val_dataloaders=DataLoader([batch], batch_size=None),
        ckpt_path=resume,
    )
    return module


def test_a_plateau_in_a_real_run_lowers_the_next_updates_rate_and_a_resume_keeps_it(tmp_path):
    """3 updates an epoch, validation after each: 30, 31, 31 (stall: halved), 30 (halved), 32."""
    values = [30.0, 31.0, 31.0, 30.0, 32.0]
    straight = _plateau_run(tmp_path / "a", values, epochs=5)
    peak = 2.0e-3
    expected = [peak] * 9 + [peak / 2] * 3 + [peak / 4] * 3  # updates 1-9, 10-12, 13-15
    assert [straight.rates[s] for s in range(1, 16)] == pytest.approx(expected)
    assert straight.learning_rate.plateau.scale == 0.25
    ckpt = next((tmp_path / "a").rglob("*.ckpt"))  # the last epoch's: Lightning keeps one
    saved = torch.load(ckpt, weights_only=True)
    assert saved["lr_schedulers"][0]["rate"]["plateau"]["scale"] == 0.25  # one state, the scheduler's
    assert not any(k.startswith("PlateauDecay") for k in saved["callbacks"])


def test_a_resumed_plateau_run_takes_the_rate_where_it_was(tmp_path):
    values = [30.0, 31.0, 31.0, 30.0, 32.0, 32.0]
    first = _plateau_run(tmp_path / "a", values, epochs=4)  # stops after the second lowering
    ckpt = next((tmp_path / "a").rglob("*.ckpt"))
    resumed = _plateau_run(tmp_path / "b", values, epochs=6, resume=str(ckpt))
    straight = _plateau_run(tmp_path / "c", values, epochs=6)
    assert first.learning_rate.plateau.scale == 0.25
    assert [resumed.rates[s] for s in range(13, 19)] == [straight.rates[s] for s in range(13, 19)]


def test_a_decaying_schedule_without_a_length_past_its_warmup_is_refused():
    with pytest.raises(ValueError, match="lr.total_steps"):
        schedule_factor("cosine", WARMUP, None)
    with pytest.raises(ValueError, match="lr.total_steps"):
        schedule_factor("linear", WARMUP, WARMUP)
    with pytest.raises(ValueError, match="lr.schedule='step' is not one of"):
        schedule_factor("step", WARMUP, TOTAL)


def _module(**settings) -> TranslationModule:
    model = dict(
        src_vocab_size=12, tgt_vocab_size=12, d_model=16, n_heads=2,
        n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0, share_embeddings=True,
    )  # fmt: skip
    return TranslationModule(model, lr={"peak": 1.0, "warmup_steps": 2, **settings})


def test_the_module_takes_the_length_from_total_steps_or_the_trainer_or_refuses_naming_it():
    config = _module(schedule="linear", total_steps=6).configure_optimizers()
    scheduler = config["lr_scheduler"]["scheduler"]
    assert isinstance(scheduler, RateScheduler)
    lrs = []
    for _ in range(7):
        lrs.append(config["optimizer"].param_groups[0]["lr"])
        config["optimizer"].step()
        scheduler.step()
    assert lrs == pytest.approx([0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])

    module = _module(schedule="cosine")
    with pytest.raises(ValueError, match="set lr.total_steps, or bound the run with trainer.max_"):
        module.configure_optimizers()  # no Trainer, no total_steps
    trainer = L.Trainer(max_steps=-1, max_epochs=-1, logger=False, enable_checkpointing=False)
    module.trainer = trainer
    with pytest.raises(ValueError, match="lr.total_steps"):
        module.configure_optimizers()
    module.trainer = L.Trainer(max_steps=8, logger=False, enable_checkpointing=False)
    module.configure_optimizers()
    factor = module.learning_rate.factor
    assert factor(8) == pytest.approx(0.0) and factor(4) < 1.0  # update 8 is the last


def test_a_resume_refuses_a_new_run_length_where_it_sets_the_schedules_end():
    saved = {"lr": {"schedule": "cosine", "total_steps": None}, "trainer": {"max_steps": 100}}
    longer = {**saved, "trainer": {"max_steps": 200}}
    with pytest.raises(CheckpointError, match="trainer.max_steps: 100 in the checkpoint, 200 now"):
        check_config(saved, longer, [])
    fixed = {"lr": {"schedule": "cosine", "total_steps": 100}, "trainer": {"max_steps": 100}}
    assert check_config(fixed, {**fixed, "trainer": {"max_steps": 50}}, []) == []  # a limit only
    # A checkpoint from before the lr group: its optimizer.schedule read as lr.schedule.
    old = {"optimizer": {"schedule": "cosine", "total_steps": None}, "trainer": {"max_steps": 100}}
    with pytest.raises(CheckpointError, match="trainer.max_steps: 100 in the checkpoint, 200 now"):
        check_config(old, longer, [])
    # A checkpoint from before the schedules: read as inverse_sqrt, whose shape needs no run length.
    now = {"lr": {"schedule": "inverse_sqrt", "total_steps": None, "min_ratio": 0.0}}
    older = {"trainer": {"max_steps": 1}}
    assert check_config(older, {**now, "trainer": {"max_steps": 2}}, [], default_config()) == []
