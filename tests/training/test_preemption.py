"""SIGTERM and SIGUSR1 to a training process: it saves last.ckpt, exits with 128 + the signal, and a
run resumed with ``ckpt_path=last`` continues from the update the signal arrived in."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from types import SimpleNamespace

import pytest
import torch

from tests.toy_text import write_toy_corpus
from tests.training.test_kill_resume import _records, _start
from tests.training.test_pipeline import compose_config, toy_overrides
from training import module as module_mod
from training import preemption
from training.pipeline import train
from training.preemption import Preempted, PreemptionCheckpoint, requeue_command

MAX_STEPS = 10


def test_preempted_says_the_signal_the_update_and_how_to_resume():
    err = Preempted(signal.SIGUSR1, 7, "/runs/x/checkpoints/last.ckpt")
    assert err.code == 128 + signal.SIGUSR1
    assert "SIGUSR1" in str(err) and "update 7" in str(err) and "ckpt_path=last" in str(err)
    assert "last.ckpt" in str(err)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_signalled_run_saves_last_and_a_resumed_run_continues_from_it(tmp_path, signum):
    corpus = write_toy_corpus(tmp_path / "corpus")
    runs = tmp_path / "runs"
    common = [*toy_overrides(corpus, tmp_path / "cache", runs), "test=false", "logger=csv", "name=pre"]
    common += ["trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0", "trainer.max_epochs=-1"]
    common += [f"trainer.max_steps={MAX_STEPS}", "trainer.check_val_every_n_epoch=100"]

    log = tmp_path / "signalled.log"
    proc = _start([*common, f"hydra.run.dir={runs / 'pre' / 'a'}"], log, tmp_path, sleep=0.3)
    deadline = time.monotonic() + 120
    while len(_records(log)) < 3:  # a few updates in, mid-epoch, no checkpoint written yet
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signum)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signum, out[-3000:]
    assert f"preempted by {signal.Signals(signum).name}" in out
    saved = torch.load(runs / "pre" / "a" / "checkpoints" / "last.ckpt", weights_only=True)
    trained = _records(log)
    assert 3 <= saved["global_step"] == len(trained) < MAX_STEPS  # saved at the update it stopped at
    results = json.loads((runs / "pre" / "a" / "results.json").read_text())
    assert results["ending"] == "preempted" and results["ending_update"] == saved["global_step"]
    assert signal.Signals(signum).name in results["ending_detail"] and "last.ckpt" in results["ending_detail"]

    resumed_log = tmp_path / "resumed.log"
    resumed = _start(
        [*common, f"hydra.run.dir={runs / 'pre' / 'b'}", "ckpt_path=last"], resumed_log, tmp_path, 0
    )
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out[-3000:]
    steps = [step for step, _ in _records(resumed_log)]
    assert steps == list(range(saved["global_step"], MAX_STEPS))  # on from the saved update, none twice


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


def _val_bleu_rows(run) -> list[str]:
    with open(run / "logs" / "metrics.csv", newline="") as f:
        return [row["step"] for row in csv.DictReader(f) if row.get("val/bleu")]


@pytest.mark.parametrize("during", ["training", "validation"])
def test_a_signal_at_a_validated_update_stops_after_its_validation_and_resumes_exactly(
    toy, tmp_path, monkeypatch, during
):
    """SIGUSR1 during update 3 (validated and checkpointed) or during its validation: the run stops
    after that validation with last.ckpt holding it, and the resumed run neither repeats nor loses
    it, ending with the weights of the run never stopped."""
    common = [
        *toy_overrides(*toy),
        "test=false",
        "logger=csv",
        "trainer.max_epochs=-1",
        "trainer.max_steps=6",
    ]
    common += [
        "trainer.limit_train_batches=5",
        "trainer.limit_val_batches=1",
        "trainer.num_sanity_val_steps=0",
    ]
    common += ["checkpoint.every_n_updates=3"]
    train(compose_config(common, tmp_path / "straight"))

    sent = []
    hook = "training_step" if during == "training" else "validation_step"
    real = getattr(module_mod.TranslationModule, hook)

    def signalling(self, batch, batch_idx):
        if not sent and self.trainer.global_step == (2 if during == "training" else 3):
            sent.append(True)
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(self, batch, batch_idx)

    monkeypatch.setattr(module_mod.TranslationModule, hook, signalling)
    with pytest.raises(Preempted) as err:
        train(compose_config(common, tmp_path / "stopped"))
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert err.value.code == 128 + signal.SIGUSR1 and err.value.update == 3
    assert err.value.checkpoint == str(last)
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == 3
    assert _val_bleu_rows(tmp_path / "stopped") == ["2"]  # update 3's validation ran, once
    assert (tmp_path / "stopped" / "checkpoints" / "update00000003.ckpt").is_file()

    monkeypatch.setattr(module_mod.TranslationModule, hook, real)
    train(compose_config([*common, f"ckpt_path={last}"], tmp_path / "resumed"))
    assert _val_bleu_rows(tmp_path / "resumed") == _val_bleu_rows(tmp_path / "straight") == ["2", "5"]
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(last, weights_only=True)["state_dict"]
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)


def test_under_slurm_the_requeue_signal_requeues_the_job_from_rank_zero(monkeypatch, tmp_path):
    assert requeue_command({"SLURM_JOB_ID": "123"}) == ["scontrol", "requeue", "123"]
    array = {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}
    assert requeue_command(array) == ["scontrol", "requeue", "7_3"]
    calls = []
    monkeypatch.setattr(preemption.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    callback = PreemptionCheckpoint(tmp_path)
    callback.requeue_signal, callback.signum = signal.SIGUSR1, signal.SIGUSR1
    callback.requeue(SimpleNamespace(is_global_zero=False))  # another rank: nothing
    callback.requeue(SimpleNamespace(is_global_zero=True))
    assert calls == [["scontrol", "requeue", "123"]]
    callback.signum = signal.SIGTERM  # scancel, or SLURM's own SIGTERM: stop, no requeue
    callback.requeue(SimpleNamespace(is_global_zero=True))
    assert len(calls) == 1
