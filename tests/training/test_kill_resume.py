"""kill -9 mid-epoch, then ``ckpt_path=last``: the resumed run ends with the weights of a run never
interrupted, and every batch is trained on exactly once (the updates after the last checkpoint
are redone, none twice in the weights)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import ROOT, toy_overrides

# Runs train.py's main with each training batch recorded (step and example ids), then slowed a
# little so that the test can kill it at an arbitrary point mid-epoch.
CHILD = """
import os, sys, time
import training.module as m
real = m.TranslationModule.training_step
def training_step(self, batch, batch_idx):
    with open(os.environ["BATCH_LOG"], "a") as f:
        f.write(f"{self.trainer.global_step} {batch['ids'].tolist()}\\n")
    time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
    return real(self, batch, batch_idx)
m.TranslationModule.training_step = training_step
sys.argv = ["train.py", "--config-path=" + os.environ["CONF_DIR"], *sys.argv[1:]]
import train
train.main()
"""

BATCHES_PER_EPOCH = 8
EVERY = 3
MAX_STEPS = 12  # checkpoints at 3, 6, 9 (epoch 1) and 12


def _start(overrides: list[str], log: Path, cwd: Path, sleep: float) -> subprocess.Popen:
    env = {**os.environ, "BATCH_LOG": str(log), "STEP_SLEEP": str(sleep), "PYTHONPATH": str(ROOT)}
    env["CONF_DIR"] = str(ROOT / "conf")
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *overrides],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _records(log: Path) -> list[tuple[int, str]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(step), ids) for step, ids in (line.split(" ", 1) for line in lines)]


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_bit_exactly(tmp_path):
    corpus = write_toy_corpus(tmp_path / "corpus")
    runs = tmp_path / "runs"
    common = [*toy_overrides(corpus, tmp_path / "cache", runs), "test=false", "logger=csv"]
    common += [
        f"trainer.limit_train_batches={BATCHES_PER_EPOCH}",
        "trainer.limit_val_batches=1",
        "trainer.num_sanity_val_steps=0",
    ]
    common += [
        "trainer.max_epochs=-1",
        f"trainer.max_steps={MAX_STEPS}",
        f"checkpoint.every_n_updates={EVERY}",
    ]

    def run(name: str, out: str, log: Path, extra: list[str] = (), sleep: float = 0.0) -> subprocess.Popen:
        return _start(
            [*common, f"name={name}", f"hydra.run.dir={runs / name / out}", *extra], log, tmp_path, sleep
        )

    straight = run("straight", "a", tmp_path / "straight.log")
    assert straight.wait(timeout=300) == 0, straight.stdout.read()[-3000:]

    killed_log = tmp_path / "killed.log"
    killed = run("kr", "a", killed_log, sleep=0.25)
    deadline = time.monotonic() + 120
    while len(_records(killed_log)) < 2 * EVERY + 1:  # past the checkpoint at update 6, mid-epoch 0
        assert killed.poll() is None and time.monotonic() < deadline, killed.stdout.read()[-3000:]
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    ckpt_dir = runs / "kr" / "a" / "checkpoints"
    saved_step = torch.load(ckpt_dir / "last.ckpt", weights_only=True)["global_step"]
    assert saved_step % EVERY == 0 and 0 < saved_step % BATCHES_PER_EPOCH  # mid-epoch
    trained_before_kill = _records(killed_log)
    assert len(trained_before_kill) > saved_step  # some updates after the checkpoint are lost

    resumed_log = tmp_path / "resumed.log"
    resumed = run("kr", "b", resumed_log, extra=["ckpt_path=last"])
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read()[-3000:]

    # Every batch exactly once: what the checkpoint holds, then what the resumed run trained.
    seen = [r for r in trained_before_kill if r[0] < saved_step] + _records(resumed_log)
    assert seen == _records(tmp_path / "straight.log")
    assert [step for step, _ in seen] == list(range(MAX_STEPS))
    a = _weights(runs / "straight" / "a" / "checkpoints" / "last.ckpt")
    b = _weights(ckpt_dir / "last.ckpt")  # the resumed run writes on into the run it resumes
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
