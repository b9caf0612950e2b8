"""SIGTERM and SIGUSR1 to a training process: it saves last.ckpt, exits with 128 + the signal, and a
run resumed with ``ckpt_path=last`` continues from the update the signal arrived in."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

from tests.toy_text import write_toy_corpus
from tests.training.test_kill_resume import _records, _start
from tests.training.test_pipeline import toy_overrides
from training.preemption import Preempted

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
