"""Long runs on 2 gloo processes: a signal to either rank stops both at the same update, and a
resumed run ends bit-exactly where a run never stopped ends (dropout on, every batch once).

One run never stopped is shared; each other run starts from it in some way and must end with its
weights (atol 0) and its batches, rank by rank.
"""

from __future__ import annotations

import json
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

# train.py with each rank's training batches recorded (update and example ids), its pid written
# once it trains, optionally slowed, and its exit status written when it ends. A script file, not
# ``python -c``: Lightning starts rank 1 by running sys.argv[0] again.
DDP_TRAIN = """
import os, sys, time
import training.module as m
real = m.TranslationModule.training_step
def training_step(self, batch, batch_idx):
    out = os.environ["OUT_DIR"]
    with open(os.path.join(out, f"batches.{self.global_rank}"), "a") as f:
        f.write(f"{self.trainer.global_step} {batch['ids'].tolist()}\\n")
    pid = os.path.join(out, f"pid.{self.global_rank}")
    if not os.path.exists(pid):  # whole or absent: the test reads it while this rank runs
        with open(pid + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid + ".tmp", pid)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
    return real(self, batch, batch_idx)
m.TranslationModule.training_step = training_step
if not any(a.startswith("--config-path") for a in sys.argv):
    sys.argv.insert(1, "--config-path=" + os.environ["CONF_DIR"])
import train
code = 0
try:
    train.main()
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
    raise
finally:
    with open(os.path.join(os.environ["OUT_DIR"], f"exit.{os.getpid()}"), "w") as f:
        f.write(str(code))
"""
EVERY = 3  # validation and update checkpoints every 3 updates
MAX_STEPS = 9  # 5 batches an epoch: checkpoints at 3, 6 (epoch 1) and 9
RANKS = (0, 1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    corpus = write_toy_corpus(base / "corpus")
    script = base / "ddp_train.py"
    script.write_text(DDP_TRAIN)
    overrides = [*toy_overrides(corpus, base / "cache", base / "runs"), "test=false", "logger=csv"]
    overrides += ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    overrides += ["trainer.ddp_timeout=60", "trainer.limit_train_batches=5", "trainer.limit_val_batches=1"]
    overrides += ["trainer.num_sanity_val_steps=0", "data.max_tokens=128", "trainer.max_epochs=-1"]
    overrides += [f"checkpoint.every_n_updates={EVERY}", "model.dropout=0.1"]
    return base, script, overrides


def _start(setup, run: str, extra: list[str], sleep: float = 0.0) -> tuple[subprocess.Popen, Path]:
    base, script, overrides = setup
    out = base / f"{run}.out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONF_DIR": str(ROOT / "conf"), "OUT_DIR": str(out)}
    env.update(STEP_SLEEP=str(sleep), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    args = [*overrides, f"hydra.run.dir={base / 'runs' / run}", *extra]
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=base,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the test can end every process it started
    )
    return proc, out


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _batches(out: Path, rank: int) -> list[tuple[int, str]]:
    path = out / f"batches.{rank}"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(step), ids) for step, ids in (line.split(" ", 1) for line in lines)]


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def straight(setup):
    proc, out = _start(setup, "straight", [f"trainer.max_steps={MAX_STEPS}"])
    log = _finish(proc)
    assert proc.returncode == 0, log[-3000:]
    return setup[0] / "runs" / "straight", out


def _resume_and_compare(setup, straight, ckpt: Path, stopped_out: Path, name: str) -> None:
    """Resumes from ``ckpt``; the run ends with the straight run's weights and batches, rank by rank."""
    saved = torch.load(ckpt, weights_only=True)["global_step"]
    proc, out = _start(setup, name, [f"trainer.max_steps={MAX_STEPS}", f"ckpt_path={ckpt}"])
    log = _finish(proc)
    assert proc.returncode == 0, log[-3000:]
    assert "no longer be bit-exact" not in log  # the same 2 processes
    straight_dir, straight_out = straight
    for rank in RANKS:  # every batch once: what the checkpoint holds, then what the resumed run trained
        seen = [r for r in _batches(stopped_out, rank) if r[0] < saved] + _batches(out, rank)
        assert seen == _batches(straight_out, rank), f"rank {rank}"
    a = _weights(straight_dir / "checkpoints" / "last.ckpt")
    b = _weights(ckpt.parent / "last.ckpt")  # the resumed run writes on into the run it resumes
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)


@pytest.fixture(scope="module")
def stopped(setup):
    """A run stopped at update 6 (mid-epoch 1, a checkpointed update): its checkpoint and batches."""
    proc, out = _start(setup, "stopped", ["trainer.max_steps=6"])
    log = _finish(proc)
    assert proc.returncode == 0, log[-3000:]
    return setup[0] / "runs" / "stopped" / "checkpoints" / "update00000006.ckpt", out


@pytest.mark.slow
def test_a_run_stopped_at_an_update_checkpoint_resumes_bit_exactly_on_two_ranks(setup, straight, stopped):
    """Resumed from update 6 to 9: with dropout on, both ranks' RNG states are restored, so the
    weights equal the straight run's."""
    ckpt, out = stopped
    rng = torch.load(ckpt, weights_only=True)["rng"]["per_rank"]
    assert len(rng) == 2 and not torch.equal(rng[0]["torch"], rng[1]["torch"])  # each rank's own
    _resume_and_compare(setup, straight, ckpt, out, "stopped_resumed")


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_one_process_with_one_warning(setup, stopped):
    ckpt = stopped[0]
    proc, out = _start(
        setup, "fewer", [f"trainer.max_steps={MAX_STEPS}", f"ckpt_path={ckpt}", "trainer.devices=1"]
    )
    log = _finish(proc)
    assert proc.returncode == 0, log[-3000:]
    assert log.count("the run can no longer be bit-exact") == 1, log[-3000:]
    assert torch.load(ckpt.parent / "last.ckpt", weights_only=True)["global_step"] == MAX_STEPS
    assert _batches(out, 0) and not _batches(out, 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "rank, signum", [(0, signal.SIGUSR1), (1, signal.SIGTERM)], ids=["rank0-SIGUSR1", "rank1-SIGTERM"]
)
def test_a_signal_to_either_rank_stops_both_at_one_update_and_the_run_resumes_exactly(
    setup, straight, rank, signum
):
    name = f"signalled{rank}"
    proc, out = _start(setup, name, [f"trainer.max_steps={MAX_STEPS}"], sleep=0.4)
    try:
        deadline = time.monotonic() + 180
        while len(_batches(out, 0)) < 3 or not all((out / f"pid.{r}").exists() for r in RANKS):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.05)
        pids = {r: int((out / f"pid.{r}").read_text()) for r in RANKS}
        os.kill(pids[rank], signum)
        signalled = time.monotonic()
        while not all((out / f"exit.{pids[r]}").exists() for r in RANKS):
            assert time.monotonic() - signalled < 60, "a rank did not exit within 60 s of the signal"
            time.sleep(0.05)
        took = time.monotonic() - signalled
    finally:
        log = _finish(proc, timeout=60)
    codes = {r: int((out / f"exit.{pids[r]}").read_text()) for r in RANKS}
    assert codes == {0: 128 + signum, 1: 128 + signum}, log[-3000:]
    assert took < 20, log[-3000:]  # seconds, not trainer.ddp_timeout
    run = setup[0] / "runs" / name
    ckpt = run / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)["global_step"]
    trained = [len(_batches(out, r)) for r in RANKS]
    assert trained == [saved, saved] and 3 <= saved < MAX_STEPS, log[-3000:]  # both stopped there
    results = json.loads((run / "results.json").read_text())
    assert results["ending"] == "preempted" and results["ending_update"] == saved
    assert signal.Signals(signum).name in results["ending_detail"] and "last.ckpt" in results["ending_detail"]
    _resume_and_compare(setup, straight, ckpt, out, f"{name}_resumed")
