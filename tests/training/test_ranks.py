"""Under DDP a rank that hangs or raises stops every process, and the log names the rank and the update.

Two gloo processes on the CPU with ``trainer.ddp_timeout=5``: rank 1 sleeps in (or raises from) its
training step of the second update. In the hang test rank 1 also starts later than the timeout
after rank 0, as on a slow node: until training starts the ranks wait
``trainer.ddp_rendezvous_timeout`` for each other, not the 5 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import ROOT, toy_overrides
from training.ranks import RankWatch, ddp_strategy, missing_ranks

# train.py with a fault injected into rank FAULT_RANK's training step of update 2. A script file,
# not ``python -c``: Lightning starts the other rank by running sys.argv[0] again.
FAULTY_TRAIN = """
import os, sys, time
if os.environ.get("LOCAL_RANK") == "1":  # Lightning's second process: a slow start
    time.sleep(float(os.environ.get("START_DELAY", "0")))
import training.module as m
real = m.TranslationModule.training_step
def training_step(self, batch, batch_idx):
    if self.global_rank == int(os.environ["FAULT_RANK"]) and self.trainer.global_step == 1:
        if os.environ["FAULT"] == "raise":
            raise RuntimeError(f"injected failure on rank {self.global_rank}")
        with open(os.environ["SLEEPER_PID"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)
    return real(self, batch, batch_idx)
m.TranslationModule.training_step = training_step
if not any(a.startswith("--config-path") for a in sys.argv):
    sys.argv.insert(1, "--config-path=" + os.environ["CONF_DIR"])
import train
train.main()
"""
TIMEOUT_S = 5
START_DELAY_S = 2 * TIMEOUT_S  # rank 1 starts this much later: longer than the collectives' timeout


def test_missing_ranks_are_read_from_torchs_message():
    assert missing_ranks("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 5000 ms") == [1]
    assert missing_ranks("Ranks 1, 3 failed to pass monitoredBarrier in 5000 ms") == [1, 3]
    assert missing_ranks("Connection closed by peer") == []


def test_a_timeout_must_be_positive_and_only_ddp_gets_one():
    with pytest.raises(ValueError, match="trainer.ddp_timeout must be a positive"):
        RankWatch(0)
    with pytest.raises(ValueError, match="trainer.ddp_rendezvous_timeout must be a positive"):
        RankWatch(5, 0)
    with pytest.raises(ValueError, match="trainer.ddp_timeout must be a positive"):
        ddp_strategy("ddp", -1)
    assert ddp_strategy("auto", 5) == "auto"
    with pytest.raises(ValueError, match="trainer.ddp_rendezvous_timeout must be a positive"):
        ddp_strategy("ddp", 5, 0)
    assert ddp_strategy("ddp", 5, 900)._timeout.total_seconds() == 900  # joining
    assert ddp_strategy("ddp", 5, 900).collective_timeout.total_seconds() == 5
    assert ddp_strategy("ddp", 5)._timeout.total_seconds() == 5  # no rendezvous timeout: the one


def _running(pid_file: Path) -> bool:
    """Whether the process whose pid is in ``pid_file`` still runs (a zombie has ended)."""
    stat = Path(f"/proc/{pid_file.read_text()}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or reaped during the read
        return False


def _run_with_fault(tmp_path: Path, fault: str, start_delay_s: float = 0) -> tuple[int, str, float, bool]:
    """Exit status, output, seconds taken, and whether the hung rank still ran after the main process.

    ``start_delay_s``: how much later than rank 0 rank 1 starts.
    """
    corpus = write_toy_corpus(tmp_path / "corpus")
    script = tmp_path / "faulty_train.py"
    script.write_text(FAULTY_TRAIN)
    overrides = [*toy_overrides(corpus, tmp_path / "cache", tmp_path / "runs"), "test=false", "logger=csv"]
    overrides += ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    overrides += [f"trainer.ddp_timeout={TIMEOUT_S}", "trainer.max_epochs=1", "trainer.limit_val_batches=1"]
    overrides += [
        "trainer.num_sanity_val_steps=0",
        "data.max_tokens=128",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    pid_file = tmp_path / "sleeper.pid"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONF_DIR": str(ROOT / "conf"), "PYTHONUNBUFFERED": "1"}
    env.update(FAULT=fault, FAULT_RANK="1", SLEEPER_PID=str(pid_file), START_DELAY=str(start_delay_s))
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(script), *overrides],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the test can end every process it started
    )
    try:
        out = proc.communicate(timeout=240)[0]
        time.sleep(1)
        hung_still_running = pid_file.exists() and _running(pid_file)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, time.monotonic() - start, hung_still_running


@pytest.mark.slow
def test_a_rank_that_hangs_stops_the_others_within_the_timeout_naming_it(tmp_path):
    code, out, elapsed, hung_still_running = _run_with_fault(tmp_path, "sleep", START_DELAY_S)
    assert code != 0, out[-3000:]
    assert (tmp_path / "sleeper.pid").exists(), out[-3000:]  # rank 1 joined late, trained, then hung
    assert elapsed < 120 + START_DELAY_S, out[-3000:]  # not the 300 s rank 1 sleeps
    message = "update 2, epoch 0: rank 0 waited for the other processes before the backward pass and rank 1"
    assert message in out and f"did not arrive within trainer.ddp_timeout={TIMEOUT_S} s" in out, out[-3000:]
    assert "RankTimeoutError" in out
    assert not hung_still_running  # ended with the others, not left holding its device


@pytest.mark.slow
def test_a_rank_that_raises_stops_every_process_with_its_error_in_the_log(tmp_path):
    code, out, elapsed, _ = _run_with_fault(tmp_path, "raise")
    assert code != 0, out[-3000:]
    assert "RuntimeError: injected failure on rank 1" in out, out[-3000:]
    assert elapsed < 120, out[-3000:]
