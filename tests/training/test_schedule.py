"""The schedules' shapes: a linear warmup from 0 to the peak, then each decay to its end (or the
peak kept, or lowered on validation plateaus); the run length they need is taken from the
Trainer, or refused naming the setting."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest

from training.module import TranslationModule
from training.pipeline import default_config
from training.plateau import PlateauDecay
from training.resume import CheckpointError, check_config
from training.schedule import cosine_factor, linear_factor, schedule_factor

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


def _validations(plateau: PlateauDecay, values: list[float]) -> list[float]:
    """The rate of each update after each validation of ``values``, through the callback's hook."""
    module = SimpleNamespace(lr_scale=1.0)
    module.lr_factor = lambda step: module.lr_scale  # past warmup: constant's 1 times the scale
    group = {"initial_lr": 2.0, "lr": 2.0}
    trainer = SimpleNamespace(
        sanity_checking=False,
        callback_metrics={},
        global_step=100,
        optimizers=[SimpleNamespace(param_groups=[group])],
    )
    rates = []
    for value in values:
        trainer.callback_metrics = {"val/bleu": value}
        plateau.on_validation_end(trainer, module)
        rates.append(group["lr"])
    return rates


def test_plateau_halves_the_rate_after_patience_validations_without_improvement_down_to_its_floor():
    plateau = PlateauDecay("val/bleu", "max", factor=0.5, patience=2, min_ratio=0.2)
    rates = _validations(plateau, [10, 12, 11, 12, 13, 13, 12.5, 14, 1, 1, 1, 1, 1, 1])
    # 12 -> 11, 12: two without improvement (12 is not better than 12): halved; 13 improves; ...
    assert rates == [2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4]
    assert plateau.scale == pytest.approx(0.2)  # 0.25 held at the floor, 0.2 of the peak
    again = PlateauDecay("val/bleu", "max", factor=0.5, patience=2, min_ratio=0.2)
    again.load_state_dict(plateau.state_dict())  # what a checkpoint holds: a resumed run goes on alike
    assert again.state_dict() == plateau.state_dict()
    module = SimpleNamespace(lr_scale=1.0)
    again.on_train_start(None, module)
    assert module.lr_scale == plateau.scale


def test_plateau_on_a_loss_lowers_where_it_stops_falling_and_refuses_bad_settings():
    plateau = PlateauDecay("val/loss", "min", factor=0.1, patience=1)
    assert [plateau.observe(v) for v in [3.0, 2.5, 2.6, 2.4, 2.4]] == [False, False, True, False, True]
    assert plateau.scale == pytest.approx(0.01)
    with pytest.raises(ValueError, match="optimizer.plateau_factor must be within"):
        PlateauDecay("val/bleu", "max", factor=1.5, patience=2)
    with pytest.raises(ValueError, match="optimizer.plateau_patience must be at least 1"):
        PlateauDecay("val/bleu", "max", factor=0.5, patience=0)


def test_a_decaying_schedule_without_a_length_past_its_warmup_is_refused():
    with pytest.raises(ValueError, match="optimizer.total_steps"):
        schedule_factor("cosine", WARMUP, None)
    with pytest.raises(ValueError, match="optimizer.total_steps"):
        schedule_factor("linear", WARMUP, WARMUP)
    with pytest.raises(ValueError, match="optimizer.schedule='step' is not one of"):
        schedule_factor("step", WARMUP, TOTAL)


def _module(**settings) -> TranslationModule:
    model = dict(
        src_vocab_size=12, tgt_vocab_size=12, d_model=16, n_heads=2,
        n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0, share_embeddings=True,
    )  # fmt: skip
    return TranslationModule(model, optimizer={"lr": 1.0, "warmup_steps": 2, **settings})


def test_the_module_takes_the_length_from_total_steps_or_the_trainer_or_refuses_naming_it():
    config = _module(schedule="linear", total_steps=6).configure_optimizers()
    scheduler = config["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(7):
        lrs.append(scheduler.get_last_lr()[0])
        config["optimizer"].step()
        scheduler.step()
    assert lrs == pytest.approx([0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])

    module = _module(schedule="cosine")
    with pytest.raises(ValueError, match="set optimizer.total_steps, or bound the run with trainer.max_"):
        module.configure_optimizers()  # no Trainer, no total_steps
    trainer = L.Trainer(max_steps=-1, max_epochs=-1, logger=False, enable_checkpointing=False)
    module.trainer = trainer
    with pytest.raises(ValueError, match="optimizer.total_steps"):
        module.configure_optimizers()
    module.trainer = L.Trainer(max_steps=8, logger=False, enable_checkpointing=False)
    factor = module.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]
    assert factor(7) == pytest.approx(0.0) and factor(3) < 1.0  # update 8 is the last


def test_a_resume_refuses_a_new_run_length_where_it_sets_the_schedules_end():
    saved = {"optimizer": {"schedule": "cosine", "total_steps": None}, "trainer": {"max_steps": 100}}
    longer = {**saved, "trainer": {"max_steps": 200}}
    with pytest.raises(CheckpointError, match="trainer.max_steps: 100 in the checkpoint, 200 now"):
        check_config(saved, longer, [])
    fixed = {"optimizer": {"schedule": "cosine", "total_steps": 100}, "trainer": {"max_steps": 100}}
    assert check_config(fixed, {**fixed, "trainer": {"max_steps": 50}}, []) == []  # a limit only
    # A checkpoint from before the schedules: read as inverse_sqrt, whose shape needs no run length.
    now = {"optimizer": {"schedule": "inverse_sqrt", "total_steps": None, "min_lr_ratio": 0.0}}
    old = {"trainer": {"max_steps": 1}}
    assert check_config(old, {**now, "trainer": {"max_steps": 2}}, [], default_config()) == []
