"""``finetune.reset``: what a fine-tuned run takes fresh, and what it carries on from its checkpoint.

- carried on, Adam's moments are the checkpoint's, exactly, and the learning rate continues the
  checkpoint's own schedule from its update: a decaying one along its own curve, to its own end,
  and one already at its floor is refused, saying why (at dc2bd7b it trained at the floor);
- a resumed fine-tuned run keeps the schedule it continued;
- carried on, early stopping compares with the checkpoint's best but counts from 0: a fine-tune is
  never stopped by its source's count; no best checkpoint is written where no validation beats
  the checkpoint's best;
- the data order continues: epoch ``e`` with an offset is epoch ``offset + e`` without, and the
  offset survives the sampler's state;
- what the checkpoint cannot give, or the run cannot take, is refused naming the part.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from data.batching import TokenBucketBatchSampler
from tests.training.test_finetune import LR, WARMUP, _overrides, toy  # noqa: F401 (fixture)
from tests.training.test_pipeline import compose_config
from training.lr.shapes import inverse_sqrt_factor, linear_factor
from training.pipeline import train
from training.start import FineTuneError
from training.start.carried import RESETTABLE, CarriedOptimizer, parse_reset

STEPS = ["checkpoint.every_n_updates=2", "trainer.log_every_n_steps=1"]


@pytest.fixture(scope="module")
def watched(toy, tmp_path_factory):  # noqa: F811
    """4 updates, validated every 2, stopping early after 3 validations without improvement."""
    out = tmp_path_factory.mktemp("watched") / "run"
    extra = ["trainer.max_steps=4", "early_stopping.patience=3", "average_last=2", *STEPS]
    results = train(compose_config(_overrides(toy, extra), out))
    return out / "checkpoints" / "last.ckpt", results


def _finetune(toy, out: Path, ckpt: Path, reset: list[str] | None, extra: list[str]) -> dict:  # noqa: F811
    """Fine-tuned from ``ckpt``, ``finetune.reset`` as given (None: the config's default)."""
    overrides = [f"init_from={ckpt}", *STEPS, *extra]
    if reset is not None:
        overrides.append(f"finetune.reset=[{','.join(reset)}]")
    return train(compose_config(_overrides(toy, overrides), out))


def _lr_rows(out: Path) -> list[float]:
    with open(out / "logs" / "metrics.csv", newline="") as f:
        return [float(r["train/lr"]) for r in csv.DictReader(f) if r.get("train/lr")]


def test_parts_are_checked_by_name():
    assert parse_reset(list(RESETTABLE)) == frozenset(RESETTABLE) and parse_reset([]) == frozenset()
    with pytest.raises(FineTuneError, match=r"finetune\.reset: schedules is not one of optimizer, sched"):
        parse_reset(["optimizer", "schedules"])
    with pytest.raises(FineTuneError, match=r"must be a list of parts"):
        parse_reset("optimizer")


def test_carried_on_adam_and_the_schedule_continue_from_the_checkpoints_update(toy, watched, tmp_path):  # noqa: F811
    ckpt, _ = watched
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 4
    out = tmp_path / "ft"
    results = _finetune(toy, out, ckpt, [], ["trainer.max_steps=2", "early_stopping.patience=5"])
    assert results["ending_update"] == 2 and results["finetune_reset"] == []
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    # Adam's step counts go on from the checkpoint's 4.
    assert {int(s["step"]) for s in last["optimizer_states"][0]["state"].values()} == {6}
    assert _lr_rows(out)[0] == pytest.approx(LR * inverse_sqrt_factor(5, WARMUP))  # update 1 reads 5's
    assert last["lr_schedulers"][0]["rate"]["offset"] == 4
    [state] = [s for k, s in last.items() if k.endswith("DataModule")]
    assert state["train_sampler"]["epoch_offset"] == saved["epoch"] + 1


def test_fresh_by_default(toy, watched, tmp_path):  # noqa: F811
    ckpt, _ = watched
    out = tmp_path / "ft"
    results = _finetune(toy, out, ckpt, None, ["trainer.max_steps=2"])
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert {int(s["step"]) for s in last["optimizer_states"][0]["state"].values()} == {2}
    assert _lr_rows(out)[0] == pytest.approx(LR * inverse_sqrt_factor(1, WARMUP))
    assert last["lr_schedulers"][0]["rate"]["offset"] == 0 and results["finetune_reset"] == sorted(RESETTABLE)
    assert len(list((out / "checkpoints").glob("best-*.ckpt"))) == 1


def test_a_resumed_finetuned_run_keeps_the_schedule_it_continued(toy, watched, tmp_path):  # noqa: F811
    ckpt, _ = watched
    first = tmp_path / "ft"
    keep_schedule = [p for p in RESETTABLE if p != "schedule"]
    _finetune(toy, first, ckpt, keep_schedule, ["trainer.max_steps=2"])
    out = shutil.copytree(first, tmp_path / "copy")
    resumed = tmp_path / "resumed"
    overrides = [*STEPS, "trainer.max_steps=4", f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"]
    assert train(compose_config(_overrides(toy, overrides), resumed))["ending_update"] == 4
    lrs = _lr_rows(resumed)  # the resumed run's rows: updates 3 and 4 read the schedule at 7 and 8
    assert lrs[-1] == pytest.approx(LR * inverse_sqrt_factor(8, WARMUP))


def test_carried_on_early_stopping_compares_with_the_checkpoints_best_but_never_stops_by_its_count(
    toy,  # noqa: F811
    tmp_path,
):
    """A source that ended by early stopping (its count at its patience): at lr 0 no validation of
    the fine-tune beats the source's best. Fresh, early stopping takes the first as its best and
    stops ``patience`` later; carried on, it compares with the source's best from the first
    validation on and stops after ``patience`` validations, not at the first (dc2bd7b's count)."""
    source = tmp_path / "source"
    stopped = ["lr.peak=0.0", "trainer.max_steps=40", "early_stopping.patience=1", *STEPS]
    first = train(compose_config(_overrides(toy, stopped), source))
    assert first["ending"] == "stopped early"
    ckpt = source / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    [waited] = [s["wait_count"] for k, s in saved["callbacks"].items() if k.startswith("EarlyStopping")]
    assert waited == 1  # the source stopped on it
    patience = 2
    extra = ["lr.peak=0.0", "trainer.max_steps=20", f"early_stopping.patience={patience}"]
    fresh = _finetune(toy, tmp_path / "fresh", ckpt, list(RESETTABLE), extra)
    carried = _finetune(toy, tmp_path / "carried", ckpt, ["optimizer", "schedule", "data_order"], extra)
    assert fresh["ending_update"] == 2 * (patience + 1)
    assert carried["ending_update"] == 2 * patience  # its own count, from 0
    # The best score carried on: no validation of this run beats the checkpoint's, so no best-* file.
    assert len(list((tmp_path / "fresh" / "checkpoints").glob("best-*.ckpt"))) == 1
    assert not list((tmp_path / "carried" / "checkpoints").glob("best-*.ckpt"))


def test_carried_on_adams_moments_are_the_checkpoints_exactly(toy, watched, tmp_path, monkeypatch):  # noqa: F811
    """The optimizer's state when training starts, every moment of every parameter, equals the
    checkpoint's to the bit (not only its step counts); fresh, there is none."""
    ckpt, _ = watched
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)["optimizer_states"][0]["state"]
    seen: dict = {}
    real = CarriedOptimizer.on_train_start

    def recording(self, trainer, pl_module) -> None:  # noqa: ANN001
        real(self, trainer, pl_module)
        for index, state in (
            trainer.optimizers[0].state_dict()["state"].items()
        ):  # copies: Adam steps in place
            seen[index] = {name: value.clone() for name, value in state.items()}

    monkeypatch.setattr(CarriedOptimizer, "on_train_start", recording)
    _finetune(
        toy, tmp_path / "ft", ckpt, [p for p in RESETTABLE if p != "optimizer"], ["trainer.max_steps=1"]
    )
    assert seen.keys() == saved.keys() and len(saved) > 10
    for index, state in saved.items():
        assert state.keys() == seen[index].keys()
        for name, value in state.items():
            assert torch.equal(seen[index][name], value), (index, name)


def test_the_data_order_continues_from_an_offset_and_keeps_it_in_its_state():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 30, 200), rng.integers(1, 30, 200)

    def batches(offset: int, epoch: int) -> list[list[int]]:
        sampler = TokenBucketBatchSampler(src, tgt, max_tokens=120, shuffle=True, seed=3)
        sampler.epoch_offset = offset
        sampler.set_epoch(epoch)
        return [list(b) for b in sampler]

    assert batches(5, 0) == batches(0, 5) and batches(5, 2) == batches(0, 7)
    assert batches(5, 0) != batches(0, 0)
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=120, shuffle=True, seed=3)
    sampler.epoch_offset = 5
    restored = TokenBucketBatchSampler(src, tgt, max_tokens=120, shuffle=True, seed=3)
    restored.load_state_dict(sampler.state_dict())
    assert restored.epoch_offset == 5


REFUSED = {
    "an average holds no optimizer": (
        "averaged.ckpt",
        ["early_stopping", "best_score", "schedule", "data_order"],
        [],
        r"finetune\.reset leaves out optimizer, but .*averaged\.ckpt holds 0 optimizer states, not "
        r"one \(an average of checkpoints holds their weights only\): add optimizer to finetune\.reset",
    ),
    "no early stopping in this run": (
        "last.ckpt",
        ["optimizer", "best_score", "schedule", "data_order"],
        [],
        r"leaves out early_stopping, but this run does not stop early \(early_stopping\.patience",
    ),
    "another metric": (
        "last.ckpt",
        ["optimizer", "early_stopping", "schedule", "data_order"],
        ["checkpoint.metric=chrf"],
        r"leaves out best_score, but .* holds no best checkpoint's score on val/chrf",
    ),
    "a schedule fitted to the budget": (
        "last.ckpt",
        ["optimizer", "early_stopping", "best_score", "data_order"],
        ["trainer.max_time=00:00:01:00", "budget.fit=budget"],
        r"leaves out schedule, but budget\.fit=budget fits a schedule of its own",
    ),
}


@pytest.mark.parametrize("name, reset, extra, said", REFUSED.values(), ids=REFUSED.keys())
def test_what_cannot_be_carried_is_refused_naming_the_part(toy, watched, tmp_path, name, reset, extra, said):  # noqa: F811
    ckpt = watched[0].parent / name
    with pytest.raises(FineTuneError, match=said) as err:
        _finetune(toy, tmp_path / "run", ckpt, reset, ["trainer.max_steps=2", *extra])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training


def test_a_carried_decaying_schedule_continues_its_sources_curve_or_is_refused_at_its_floor(toy, tmp_path):  # noqa: F811
    """A source trained along a line to the floor at update 8 (its run's length). Carried on from
    its update 4, a 3-update fine-tune takes the source's rates of updates 5, 6 and 7, not its own
    curve read there (which ended at its own 3 updates: at dc2bd7b it trained at the floor, 0,
    throughout); carried on from update 8, where the line has ended, it is refused, saying why."""
    source = tmp_path / "source"
    shape = ["lr.schedule=linear", "lr.warmup_steps=2"]
    train(compose_config(_overrides(toy, [*shape, "trainer.max_steps=8", *STEPS]), source))
    middle = source / "checkpoints" / "update00000004.ckpt"
    keep = ["optimizer", "data_order", "early_stopping", "best_score"]  # the schedule carried on
    out = tmp_path / "ft"
    _finetune(toy, out, middle, keep, [*shape, "trainer.max_steps=3"])
    expected = [LR * linear_factor(s, 2, 8) for s in (5, 6, 7)]
    assert _lr_rows(out) == pytest.approx(expected) and min(expected) > 0
    with pytest.raises(
        FineTuneError,
        match=r"leaves out schedule, but .*update00000008\.ckpt: its linear schedule "
        r"reaches its floor \(0x the peak\) at update 8, by the checkpoint's update 8",
    ):
        _finetune(
            toy,
            tmp_path / "late",
            source / "checkpoints" / "update00000008.ckpt",
            keep,
            [*shape, "trainer.max_steps=3"],
        )
    assert not (tmp_path / "late" / "checkpoints").exists()  # refused before training
