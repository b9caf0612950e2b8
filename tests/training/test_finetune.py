"""Fine-tuning (``init_from``): a checkpoint's weights, model and vocabulary; a fresh training state.

- at learning rate 0 a fine-tuning run validates exactly as its checkpoint did;
- the update counter, the schedule (warmup from its first step) and the run's history start afresh;
- the checkpoint's SentencePiece model is used, not one trained on the new corpus;
- a weights-only averaged checkpoint is a starting point too;
- a fine-tuned run resumes with ``ckpt_path`` alone, and a requeued SLURM job from its own checkpoint;
- a model key that differs from the checkpoint's, a tokenizer that is not its own, or
  ``ckpt_path`` beside it is refused, naming the keys (and values).
"""

from __future__ import annotations

import csv
import logging
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training.lr.shapes import inverse_sqrt_factor
from training.pipeline import train
from training.start import FineTuneError

LR, WARMUP = 3e-3, 20  # toy_overrides' lr.peak and lr.warmup_steps


def _overrides(toy: tuple[Path, Path, Path], extra: list[str]) -> list[str]:
    quick = [
        "test=false",
        "trainer.max_epochs=-1",
        "trainer.limit_val_batches=2",
        "trainer.num_sanity_val_steps=0",
    ]
    return [*toy_overrides(*toy), *quick, *extra]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


@pytest.fixture(scope="module")
def trained(toy, tmp_path_factory):
    """4 updates, validated and saved every 2, the last 2 averaged: the run directory and its results."""
    out = tmp_path_factory.mktemp("trained") / "run"
    extra = ["trainer.max_steps=4", "checkpoint.every_n_updates=2", "average_last=2"]
    return out, train(compose_config(_overrides(toy, extra), out))


def _finetune(toy, out: Path, ckpt: Path, extra: list[str], caplog) -> tuple[dict, str]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        results = train(compose_config(_overrides(toy, [f"init_from={ckpt}", *extra]), out))
    return results, caplog.text


def test_at_learning_rate_zero_a_finetuned_run_validates_as_its_checkpoint_did(
    toy, trained, tmp_path, caplog
):
    run, base = trained
    ckpt = run / "checkpoints" / "last.ckpt"
    extra = ["lr.peak=0.0", "trainer.max_steps=2", "checkpoint.every_n_updates=2"]
    results, log = _finetune(toy, tmp_path / "ft", ckpt, extra, caplog)
    assert (results["val/loss"], results["val/bleu"]) == (base["val/loss"], base["val/bleu"])
    said = next(line for line in log.splitlines() if "init_from: starting from the weights of" in line)
    assert f"{ckpt} (trained 4 updates)" in said
    for fresh in (
        "Adam's moments",
        "warmup from update 0",
        "update counter starts from 0",
        "data order",
        "best score",
    ):
        assert fresh in said


@pytest.fixture(scope="module")
def on_a_new_corpus(toy, trained, tmp_path_factory):
    """Fine-tuned from last.ckpt for 2 updates on another corpus, with another data.vocab_size."""
    _, cache, runs = toy
    base = tmp_path_factory.mktemp("new")
    corpus = write_toy_corpus(base / "corpus", {"train": 300, "val": 8, "test": 8}, seed=7)
    out = base / "run"
    ckpt = trained[0] / "checkpoints" / "last.ckpt"
    overrides = _overrides((corpus, cache, runs), [f"init_from={ckpt}", "data.vocab_size=48"])
    overrides += ["trainer.max_steps=2", "checkpoint.every_n_updates=2", "trainer.log_every_n_steps=1"]
    with _Recorded("data") as said:  # caplog is per test; this run serves two
        results = train(compose_config(overrides, out))
    return out, ckpt, results, said


class _Recorded(logging.Handler):
    """The INFO messages of one logger while in the ``with`` block, as a list of strings."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.INFO)
        self.logger, self.messages = logging.getLogger(name), []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> list[str]:
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)
        return self.messages

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)


def test_a_finetuned_run_counts_updates_and_warms_up_from_zero(on_a_new_corpus):
    out, ckpt, results, _ = on_a_new_corpus
    assert results["ending_update"] == 2  # not the checkpoint's 4 plus 2
    assert (results["init_from"], results["init_from_updates"]) == (str(ckpt), 4)  # results.json
    with open(out / "logs" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/lr")]
    assert int(rows[0]["step"]) == 0  # none of the checkpoint's run's rows
    assert float(rows[0]["train/lr"]) == pytest.approx(LR * inverse_sqrt_factor(1, WARMUP))
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 2 and last["lr_schedulers"][0]["last_epoch"] == 2
    assert {int(s["step"]) for s in last["optimizer_states"][0]["state"].values()} == {2}  # Adam's own count
    best = [p.name for p in (out / "checkpoints").glob("best-*.ckpt")]
    assert len(best) == 1 and best[0].startswith(
        "best-step00000002-"
    )  # judged over this run's validations only


def test_the_checkpoints_sentencepiece_model_is_used_and_none_trained_on_the_new_corpus(on_a_new_corpus):
    out, ckpt, _, said = on_a_new_corpus
    spm = torch.load(ckpt, map_location="cpu", weights_only=True)["nmt"]["src_spm"]
    assert not any("training SentencePiece" in m or "reusing SentencePiece" in m for m in said), said
    assert any(m.startswith("SentencePiece: using data.spm_model=") for m in said)
    assert (out / "tokenizer" / "joint.model").read_bytes() == spm
    last = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["nmt"]["src_spm"] == spm and last["nmt"]["tgt_spm"] is None
    config = OmegaConf.load(out / "config.yaml")  # what a resume of this run must give again
    assert config.data.spm_model == str(out / "tokenizer" / "joint.model") and config.init_from == str(ckpt)


def test_a_finetuned_run_resumes_with_ckpt_path_alone_and_keeps_its_vocabulary(
    toy, on_a_new_corpus, tmp_path
):
    """The same command with ckpt_path instead of init_from: the checkpoint's config gives data.spm_model."""
    finetuned, ckpt, _, _ = on_a_new_corpus
    out = shutil.copytree(finetuned, tmp_path / "finetuned")  # resuming writes on in its checkpoints/
    corpus = Path(OmegaConf.load(out / "config.yaml").data.data_dir)
    overrides = _overrides((corpus, *toy[1:]), ["data.vocab_size=48", "trainer.max_steps=4"])
    overrides += ["checkpoint.every_n_updates=2", "trainer.log_every_n_steps=1"]
    with _Recorded("data") as said:
        results = train(
            compose_config([*overrides, f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"], tmp_path)
        )
    assert results["ending_update"] == 4
    assert not any("training SentencePiece" in m for m in said), said
    spm = torch.load(ckpt, map_location="cpu", weights_only=True)["nmt"]["src_spm"]
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["nmt"]["src_spm"] == spm


def test_a_requeued_finetuning_job_resumes_from_its_own_checkpoint(
    toy, trained, tmp_path, caplog, monkeypatch
):
    """Under SLURM a requeued job starts the same command into the same run directory: it resumes
    from the checkpoint there, not from init_from's weights."""
    ckpt = trained[0] / "checkpoints" / "last.ckpt"
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    common = ["checkpoint.every_n_updates=2", "trainer.log_every_n_steps=1"]
    _finetune(toy, tmp_path / "job", ckpt, [*common, "trainer.max_steps=2"], caplog)
    results, log = _finetune(toy, tmp_path / "job", ckpt, [*common, "trainer.max_steps=4"], caplog)
    assert results["ending_update"] == 4
    own = tmp_path / "job" / "checkpoints" / "last.ckpt"
    assert f"init_from: not loaded; the requeued run resumes from {own}" in log
    assert "init_from: starting from the weights" not in log


def test_a_weights_only_averaged_checkpoint_is_a_starting_point(toy, trained, tmp_path, caplog):
    """lr 0: the fine-tuned run's weights are the average's, exactly."""
    averaged = trained[0] / "checkpoints" / "averaged.ckpt"
    extra = ["lr.peak=0.0", "trainer.max_steps=1", "checkpoint.every_n_updates=1"]
    results, log = _finetune(toy, tmp_path / "ft", averaged, extra, caplog)
    assert results["ending_update"] == 1
    assert f"{averaged} (the average of 2 checkpoints, the last trained 4 updates)" in log
    start = torch.load(averaged, map_location="cpu", weights_only=True)["state_dict"]
    after = torch.load(tmp_path / "ft" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert start.keys() == after.keys() and all(torch.equal(start[k], after[k]) for k in start)


REFUSALS = {
    "a model key": (["model.d_ff=64"], r"model\.d_ff is 128 in the checkpoint, 64 in this run"),
    "two model keys": (
        ["model.d_ff=64", "model.n_heads=2"],
        r"model\.n_heads is 4 in the checkpoint, 2 in this run; model\.d_ff is 128 in the checkpoint, "
        r"64 in this run\. Drop the override",
    ),
    "ckpt_path too": (
        ["ckpt_path={ckpt}"],
        r"init_from=.*last\.ckpt and ckpt_path=.*last\.ckpt are both given",
    ),
    "another vocabulary layout": (
        ["data.joint_vocab=false"],
        r"data\.joint_vocab is True in the checkpoint .*, False",
    ),
    "another spm model": (
        ["data.spm_model={other}"],
        r"data\.spm_model=.*other\.model is not the SentencePiece model",
    ),
    "no such file": (["init_from={ckpt}.absent"], r"init_from=.*\.absent: no such checkpoint file"),
}


@pytest.mark.parametrize("extra, said", REFUSALS.values(), ids=REFUSALS.keys())
def test_what_cannot_go_with_the_checkpoint_is_refused_naming_keys_and_values(
    toy, trained, tmp_path, extra, said
):
    ckpt = trained[0] / "checkpoints" / "last.ckpt"
    other = tmp_path / "other.model"
    other.write_bytes((trained[0] / "tokenizer" / "joint.model").read_bytes() + b"\0")
    extra = [e.format(ckpt=ckpt, other=other) for e in extra]
    cfg = compose_config(_overrides(toy, [f"init_from={ckpt}", *extra]), tmp_path / "run")
    with pytest.raises(FineTuneError, match=said) as err:
        train(cfg)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training


def test_a_finetuned_run_validates_the_new_and_the_old_domain_each_under_its_name(
    toy, trained, tmp_path_factory
):
    """valid_sets lists the new corpus's validation split and the old one's: both are logged at every
    validation; at lr 0 the old domain's scores are the checkpoint's own run's, to the bit."""
    old, cache, runs = toy
    base = tmp_path_factory.mktemp("domains")
    new = write_toy_corpus(base / "corpus", {"train": 100, "val": 8, "test": 8}, seed=11)
    out = base / "run"
    ckpt = trained[0] / "checkpoints" / "last.ckpt"
    extra = [f"init_from={ckpt}", f"data.valid_sets=[{{name: new}}, {{name: old, data_dir: '{old}'}}]"]
    extra += ["lr.peak=0.0", "trainer.max_steps=2", "checkpoint.every_n_updates=2"]
    results = train(compose_config(_overrides((new, cache, runs), extra), out))
    with open(out / "logs" / "metrics.csv", newline="") as f:
        [row] = [r for r in csv.DictReader(f) if r.get("val/new/bleu")]
    for name in ("new", "old"):
        assert all(row[f"val/{name}/{m}"] for m in ("bleu", "chrf", "loss", "ppl"))
    assert float(row["val/old/loss"]) == trained[1]["val/loss"]
    assert float(row["val/old/bleu"]) == trained[1]["val/bleu"]
    assert results["valid_sets"]["old"]["loss"] == trained[1]["val/loss"]
    assert results["selected_by"] == "val/new/bleu"  # the first set, by default


def test_a_fine_tuned_run_may_change_the_models_regularisation_and_its_first_lines_say_so(
    toy, trained, tmp_path, caplog
):
    """Dropout is not in the weights: init_from takes model.dropout=0.3 and trains with it; before
    the data is prepared, the log names each model key that differs from the checkpoint's, with
    both values (at dc2bd7b it said nothing)."""
    ckpt = trained[0] / "checkpoints" / "last.ckpt"
    before = torch.load(ckpt, weights_only=True)["hyper_parameters"]["model"]
    extra = ["model.dropout=0.3", "model.attention_dropout=0.05", "trainer.max_steps=1"]
    results, _ = _finetune(toy, tmp_path / "ft", ckpt, extra, caplog)
    saved = torch.load(tmp_path / "ft" / "checkpoints" / "last.ckpt", weights_only=True)
    model = saved["hyper_parameters"]["model"]
    assert model["dropout"] == 0.3 and model["attention_dropout"] == 0.05 and results["ending_update"] == 1
    said = [r.getMessage() for r in caplog.records]
    first_data = next(i for i, m in enumerate(said) if m.startswith(("corpus:", "reusing corpus")))
    for key, value in (("dropout", 0.3), ("attention_dropout", 0.05)):
        line = f"init_from: model.{key} is {before[key]!r} in the checkpoint, {value!r} in this run"
        [at] = [i for i, m in enumerate(said) if m.startswith(line)]
        assert at < first_data  # among the first lines, before the data is prepared
    assert not any("model.d_model" in m for m in said)  # only the keys that differ
