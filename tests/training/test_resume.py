"""Resuming keeps the run's history and refuses what would change it silently.

- the validation of a checkpointed update is never lost: early stopping's counter, the best score
  and the best checkpoint after a resume equal those of the run never stopped;
- ``logs/metrics.csv`` holds every row written before the resume; TensorBoard goes on in one directory;
- a changed config is refused naming each key and both values, unless allowed (then it takes effect);
- a damaged checkpoint is an error naming it; ``ckpt_path=last`` offers, or takes, a loadable one.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
import torch

from common.checkpoint_file import CheckpointError
from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training import module as module_mod
from training.lr.shapes import inverse_sqrt_factor
from training.pipeline import train
from training.start.resume import check_config, find_resumed, run_dir_of


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


def _run(toy, out: Path, extra: list[str]) -> dict:
    overrides = [*toy_overrides(*toy), "test=false", "trainer.max_epochs=-1", "trainer.limit_train_batches=5"]
    overrides += ["trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0", *extra]
    return train(compose_config(overrides, out))


def _callback_state(ckpt: Path, prefix: str) -> dict:
    states = torch.load(ckpt, weights_only=True)["callbacks"]
    [key] = [k for k in states if k.startswith(prefix) and "val/bleu" in k]
    return states[key]


def _early_stopping(run: Path) -> dict:
    state = _callback_state(run / "checkpoints" / "last.ckpt", "EarlyStopping")
    return {k: float(v) if torch.is_tensor(v) else v for k, v in state.items()}


def test_early_stopping_after_a_resume_stops_where_the_straight_run_stops(toy, tmp_path):
    """lr 0: BLEU never improves; patience 2 stops at the third validation, update 12, also when
    the run is stopped at update 8 and resumed (the validation at 8 is not lost)."""
    common = ["lr.peak=0.0", "early_stopping.patience=2", "checkpoint.every_n_updates=4"]
    straight = _run(toy, tmp_path / "straight", [*common, "trainer.max_steps=40"])
    _run(toy, tmp_path / "stopped", [*common, "trainer.max_steps=8"])
    ckpt = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert _early_stopping(tmp_path / "stopped")["wait_count"] == 1  # the validation at 8 counted
    resumed = _run(toy, tmp_path / "resumed", [*common, "trainer.max_steps=40", f"ckpt_path={ckpt}"])
    assert straight["ending"] == resumed["ending"] == "stopped early"
    assert straight["ending_update"] == resumed["ending_update"] == 12
    assert _early_stopping(tmp_path / "straight") == _early_stopping(tmp_path / "stopped")  # written on there


def _scripted_bleu(monkeypatch, by_update: dict[int, float]) -> None:
    """Validation BLEU by update, so that the best changes at a known update."""
    real = module_mod.TranslationModule._score

    def score(self, split):
        scores, nll, hypotheses = real(self, split)
        if split == "validation":
            scores = dataclasses.replace(scores, bleu=by_update[self.trainer.global_step])
        return scores, nll, hypotheses

    monkeypatch.setattr(module_mod.TranslationModule, "_score", score)


def _rows(run: Path) -> list[tuple]:
    with open(run / "logs" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    keys = ("step", "epoch", "train/loss", "val/bleu", "val/loss")
    return [tuple(row.get(k, "") for k in keys) for row in rows if any(row.get(k) for k in keys[2:])]


def test_the_best_checkpoint_metrics_and_tensorboard_continue_across_a_resume(toy, tmp_path, monkeypatch):
    """Validations at 3, 6 and 9, the best at 6; stopped at 6 and resumed: the same best (its file
    there), the same metrics.csv rows, and TensorBoard's event files in the resumed run's directory."""
    _scripted_bleu(monkeypatch, {3: 1.0, 6: 2.0, 9: 1.5})
    common = ["checkpoint.every_n_updates=3", "trainer.log_every_n_steps=1"]
    _run(toy, tmp_path / "straight", [*common, "trainer.max_steps=9"])
    _run(toy, tmp_path / "stopped", [*common, "trainer.max_steps=6"])
    ckpt = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    _run(toy, tmp_path / "resumed", [*common, "trainer.max_steps=9", f"ckpt_path={ckpt}"])

    a = _callback_state(tmp_path / "straight" / "checkpoints" / "last.ckpt", "ModelCheckpoint")
    b = _callback_state(ckpt, "ModelCheckpoint")  # the resumed run writes on into the run it resumes
    assert (
        Path(a["best_model_path"]).name
        == Path(b["best_model_path"]).name
        == "best-step00000006-bleu2.00.ckpt"
    )
    assert float(a["best_model_score"]) == float(b["best_model_score"]) == 2.0
    assert Path(b["best_model_path"]).is_file()
    straight_rows = _rows(tmp_path / "straight")
    assert sum(1 for r in straight_rows if r[3]) == 3  # three validations
    assert _rows(tmp_path / "resumed") == straight_rows  # every row before the resume, none twice
    assert not (tmp_path / "resumed" / "tensorboard").exists()
    assert len(list((tmp_path / "stopped" / "tensorboard").glob("events.out.tfevents.*"))) == 2


# ------------------------------------------------------------------ changed config


def test_a_changed_setting_is_refused_naming_it_and_both_values():
    saved = {"lr": {"peak": 5e-4, "warmup_steps": 4000}, "trainer": {"max_steps": 10}, "seed": 1}
    current = {"lr": {"peak": 1e-3, "warmup_steps": 4000}, "trainer": {"max_steps": 20}, "seed": 2}
    with pytest.raises(CheckpointError) as err:
        check_config(saved, current, [])
    message = str(err.value)
    assert "lr.peak: 0.0005 in the checkpoint, 0.001 now" in message
    assert "seed: 1 in the checkpoint, 2 now" in message
    assert "max_steps" not in message  # a limit cannot change the result
    assert "resume.allow_changes=[lr.peak,seed]" in message
    allowed = check_config(saved, current, ["lr", "seed"])  # a group allows its keys
    assert allowed == [
        "lr.peak: 0.0005 in the checkpoint, 0.001 now (allowed by resume.allow_changes)",
        "seed: 1 in the checkpoint, 2 now (allowed by resume.allow_changes)",
    ]
    # A checkpoint written before the lr group: its optimizer.lr is read as lr.peak.
    old = {"optimizer": {"lr": 5e-4, "warmup_steps": 4000}, "trainer": {"max_steps": 10}, "seed": 1}
    assert check_config(old, {**saved, "trainer": {"max_steps": 20}}, []) == []
    with pytest.raises(CheckpointError, match="lr.peak: 0.0005 in the checkpoint, 0.001 now"):
        check_config(old, current, ["seed"])
    assert check_config(saved, {**saved, "trainer": {"max_steps": 99}}, []) == []


def test_a_resumed_run_refuses_a_new_lr_unless_allowed_and_then_uses_it(toy, tmp_path):
    common = ["checkpoint.every_n_updates=2", "lr.warmup_steps=4"]
    _run(toy, tmp_path / "first", [*common, "trainer.max_steps=2"])
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    resumed = [*common, "trainer.max_steps=4", f"ckpt_path={ckpt}", "lr.peak=1e-2"]
    with pytest.raises(CheckpointError, match=r"lr.peak: 0.003 in the checkpoint, 0.01 now"):
        _run(toy, tmp_path / "refused", resumed)
    _run(toy, tmp_path / "allowed", [*resumed, "resume.allow_changes=[lr.peak]"])
    saved = torch.load(ckpt, weights_only=True)
    assert saved["global_step"] == 4
    # The schedule goes on from update 4 with the new peak.
    assert saved["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(
        1e-2 * inverse_sqrt_factor(5, 4)
    )


# ---------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("damage", ["truncated", "empty", "text"])
def test_a_damaged_checkpoint_is_an_error_naming_it(tmp_path, damage):
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {}, "global_step": 3, "loops": {}}, good)
    bad = tmp_path / "bad.ckpt"
    data = {"truncated": good.read_bytes()[: good.stat().st_size // 2], "empty": b"", "text": b"not a ckpt"}
    bad.write_bytes(data[damage])
    with pytest.raises(CheckpointError, match=f"{bad}: (truncated or corrupted|not a PyTorch checkpoint)"):
        find_resumed(str(bad), tmp_path, "x", tmp_path / "out")
    path, checkpoint = find_resumed(str(good), tmp_path, "x", tmp_path / "out")
    assert path == good and checkpoint["global_step"] == 3


def test_last_offers_or_takes_the_newest_loadable_checkpoint_beside_a_damaged_one(tmp_path, caplog):
    ckpts = tmp_path / "runs" / "x" / "run1" / "checkpoints"
    ckpts.mkdir(parents=True)
    for step in (4, 8):
        torch.save({"state_dict": {}, "global_step": step, "loops": {}}, ckpts / f"update{step:08d}.ckpt")
    (ckpts / "update00000012.ckpt").write_bytes(b"")  # damaged too: skipped
    (ckpts / "last.ckpt").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError) as err:
        find_resumed("last", tmp_path / "runs", "x", tmp_path / "out")
    message = str(err.value)
    assert f"{ckpts / 'last.ckpt'}: not a PyTorch checkpoint" in message
    assert f"{ckpts / 'update00000008.ckpt'} (update 8)" in message
    assert "resume.take_newest_loadable=true" in message
    path, checkpoint = find_resumed(
        "last", tmp_path / "runs", "x", tmp_path / "out", take_newest_loadable=True
    )
    assert path == ckpts / "update00000008.ckpt" and checkpoint["global_step"] == 8
    assert run_dir_of(path) == tmp_path / "runs" / "x" / "run1"
    assert "resuming from" in caplog.text and "update00000008.ckpt" in caplog.text


def test_a_requeued_slurm_job_resumes_from_its_run_directorys_newest_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "wmt" / "4242"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {}, "global_step": 10, "loops": {}}, run / "hpc_ckpt_1.ckpt")
    torch.save({"state_dict": {}, "global_step": 12, "loops": {}}, run / "checkpoints" / "last.ckpt")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert find_resumed(None, tmp_path / "runs", "wmt", run) is None  # outside SLURM: a fresh start
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    path, checkpoint = find_resumed(None, tmp_path / "runs", "wmt", run)
    assert (
        path == run / "checkpoints" / "last.ckpt"
        and run_dir_of(path) == run
        and checkpoint["global_step"] == 12
    )
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")  # damaged: the next newest, with a warning
    assert find_resumed(None, tmp_path / "runs", "wmt", run)[0] == run / "hpc_ckpt_1.ckpt"
    assert find_resumed(None, tmp_path / "runs", "wmt", tmp_path / "fresh") is None


def test_an_averaged_checkpoint_is_tested_but_not_resumed_from(tmp_path):
    averaged = tmp_path / "averaged.ckpt"
    torch.save({"state_dict": {}, "averaged_from": ["a", "b"]}, averaged)  # no training state
    assert find_resumed(str(averaged), tmp_path, "x", tmp_path / "out", training=False)[0] == averaged
    with pytest.raises(CheckpointError, match=f"{averaged}: holds no training state to resume from"):
        find_resumed(str(averaged), tmp_path, "x", tmp_path / "out")


def test_a_setting_added_since_the_checkpoint_is_no_change_at_its_default():
    saved = {"optimizer": {"eps": 1e-9}, "data": {"max_len": 250}}
    defaults = {"optimizer": {"eps": 1e-8, "name": "adam"}, "data": {"max_len": 250, "bad_lines": "error"}}
    current = {"optimizer": {"eps": 1e-9, "name": "adam"}, "data": {"max_len": 250, "bad_lines": "error"}}
    assert check_config(saved, current, [], defaults) == []
    # The same keys at other values change what the run computes: refused, naming them.
    changed = {"optimizer": {"eps": 1e-9, "name": "adamw"}, "data": {"max_len": 250, "bad_lines": "skip"}}
    with pytest.raises(CheckpointError, match=r"data\.bad_lines: '<absent>' in the checkpoint, 'skip' now"):
        check_config(saved, changed, [], defaults)
    with pytest.raises(CheckpointError, match="optimizer.name"):  # without defaults, any new key
        check_config(saved, current, [])


def test_the_default_config_is_the_composed_train_yaml():
    from training.pipeline import default_config

    defaults = default_config()
    assert defaults["data"]["bad_lines"] == "error" and defaults["trainer"]["ddp_timeout"] == 600


def test_a_checkpoint_written_before_newer_settings_existed_resumes(toy, tmp_path):
    common = ["checkpoint.every_n_updates=2", "lr.warmup_steps=4"]
    _run(toy, tmp_path / "first", [*common, "trainer.max_steps=2"])
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)
    added = [("data", "bad_lines"), ("data", "spm_model"), ("trainer", "ddp_rendezvous_timeout")]
    added += [("data", "valid_sets"), ("checkpoint", "metric"), ("checkpoint", "select_on")]
    for group, key in added:
        del saved["run_config"][group][key]  # as a checkpoint written before the key was added
    old = tmp_path / "old.ckpt"
    torch.save(saved, old)
    results = _run(toy, tmp_path / "resumed", [*common, "trainer.max_steps=4", f"ckpt_path={old}"])
    assert results["ending_update"] == 4


@pytest.mark.parametrize("sampling", [[], ["data.spm_sampling_alpha=0.2"]], ids=["best", "sampled"])
def test_an_ema_run_resumes_bit_exactly_and_its_checkpoints_hold_the_ema_for_translation(
    toy, tmp_path, sampling
):
    """ema.decay: stopped at update 3 and resumed (across an epoch end, dropout on) == 6 straight:
    the EMA, the training weights and the count of updates averaged, to the bit; also where each
    batch's subwords are sampled (its draw seeded by the data seed, epoch and batch). The
    checkpoint's state_dict, what translate.py loads, is the EMA; the training weights are kept
    beside it."""
    from translation.checkpoint import load_checkpoint

    common = ["ema.decay=0.9", "checkpoint.every_n_updates=3", *sampling]
    _run(toy, tmp_path / "straight", [*common, "trainer.max_steps=6"])
    _run(toy, tmp_path / "stopped", [*common, "trainer.max_steps=3"])
    ckpt = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    _run(toy, tmp_path / "resumed", [*common, "trainer.max_steps=6", f"ckpt_path={ckpt}"])
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(ckpt, weights_only=True)  # the resumed run writes on into the run it resumes
    assert a["global_step"] == b["global_step"] == 6
    assert int(a["ema"]["n_averaged"]) == int(b["ema"]["n_averaged"]) == 6
    for saved in ("state_dict", "training_weights"):
        x = a[saved] if saved == "state_dict" else a["ema"][saved]
        y = b[saved] if saved == "state_dict" else b["ema"][saved]
        assert x.keys() == y.keys()
        for name in x:
            torch.testing.assert_close(y[name], x[name], rtol=0, atol=0, msg=f"{saved} {name}")
    trained = a["ema"]["training_weights"]
    assert set(trained) <= set(a["state_dict"])  # the parameters' keys, tied names too
    assert any(not torch.equal(a["state_dict"][k], trained[k]) for k in trained)
    model = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.ckpt").model
    for name, p in model.named_parameters():
        assert torch.equal(p, a["state_dict"][f"model.{name}"]), name  # the translator's is the EMA


def test_a_resumed_runs_config_names_the_vocabulary_it_used(toy, tmp_path):
    """config.yaml is written once the vocabulary is known: a fresh run's names the model it
    trained, a resumed run's the checkpoint's (at dc2bd7b it said data.spm_model: null)."""
    from omegaconf import OmegaConf

    common = ["checkpoint.every_n_updates=2", "lr.warmup_steps=4"]
    _run(toy, tmp_path / "first", [*common, "trainer.max_steps=2"])
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    _run(toy, tmp_path / "resumed", [*common, "trainer.max_steps=4", f"ckpt_path={ckpt}"])
    spm = torch.load(ckpt, weights_only=True)["nmt"]["src_spm"]
    for run in ("first", "resumed"):
        data = OmegaConf.load(tmp_path / run / "config.yaml").data
        assert data.spm_model == str(tmp_path / run / "tokenizer" / "joint.model"), run
        assert Path(data.spm_model).read_bytes() == spm and data.joint_vocab is True


# The learning rate's keys and state as dc2bd7b wrote them, before they were the lr and budget groups
# and one state in the scheduler's.
_OLD_LR = {"peak": "lr", "min_ratio": "min_lr_ratio"}


def as_written_before_the_lr_group(checkpoint: dict) -> dict:
    """``checkpoint`` in the layout of a checkpoint written at dc2bd7b."""
    old = dict(checkpoint)
    hparams = dict(old["hyper_parameters"])
    lr = hparams.pop("lr")
    hparams["optimizer"] = {**hparams["optimizer"], **{_OLD_LR.get(k, k): v for k, v in lr.items()}}
    old["hyper_parameters"] = hparams
    scheduler = dict(old["lr_schedulers"][0])
    rate = scheduler.pop("rate")
    old["lr_schedulers"] = [{**scheduler, "lr_lambdas": [None]}]
    if rate["offset"]:
        old["schedule_offset"] = rate["offset"]
    if rate["fitted"] is not None:
        old["fitted_schedule"] = rate["fitted"]
    config = {k: v for k, v in old["run_config"].items() if k not in ("lr", "budget")}
    config["optimizer"] = {
        **config["optimizer"],
        **{_OLD_LR.get(k, k): v for k, v in old["run_config"]["lr"].items()},
    }
    budget = dict(old["run_config"]["budget"])
    budget.pop("early_stopping", None)  # added after dc2bd7b
    config["validation"] = {"max_share": budget.pop("validation_share")}
    config["schedule"] = budget
    old["run_config"] = config
    return old


def test_a_checkpoint_written_before_the_lr_group_resumes_bit_exactly_and_translates(toy, tmp_path):
    from translation import Translator

    common = ["checkpoint.every_n_updates=2", "lr.warmup_steps=4", "lr.schedule=linear", "lr.total_steps=10"]
    _run(toy, tmp_path / "first", [*common, "trainer.max_steps=2", "trainer.max_epochs=-1"])
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    new = torch.load(ckpt, weights_only=True)
    old = tmp_path / "old.ckpt"
    torch.save(as_written_before_the_lr_group(new), old)
    finished = {}
    for name, path in (("new", ckpt), ("old", old)):
        results = _run(toy, tmp_path / name, [*common, "trainer.max_steps=4", f"ckpt_path={path}"])
        assert results["ending_update"] == 4
        last = sorted((tmp_path / name).rglob("update00000004.ckpt")) or [ckpt.parent / "update00000004.ckpt"]
        finished[name] = torch.load(last[0], weights_only=True)
    for key, value in finished["new"]["state_dict"].items():
        assert torch.equal(finished["old"]["state_dict"][key], value), key
    assert Translator.from_checkpoint(old).translate(["ein haus"]) == Translator.from_checkpoint(
        ckpt
    ).translate(["ein haus"])
