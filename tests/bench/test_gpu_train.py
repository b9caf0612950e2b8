"""bench/gpu_train.py runs end to end on the CPU with a tiny model (the GPU figures need a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The bench tier: runs a benchmark script end to end (python3 -m pytest -m slow; README, "Test").
pytestmark = pytest.mark.slow


ROOT = Path(__file__).resolve().parents[2]


def _bench(args: list[str]) -> subprocess.CompletedProcess:
    """bench/gpu_train.py with ``args``, one thread."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_train.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_gpu_train_bench_smoke_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_train.json"
    args = ["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1", "--batches", "1"]
    args += ["--max-tokens", "512", "--vocab", "500", "--no-compile", "--threads", "1", "--json", str(out)]
    args += ["--loss-block-rows", "64", "--profile", str(tmp_path / "profile.txt")]
    proc = _bench(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| tiny ours eager " in proc.stdout and "| tiny torch eager " in proc.stdout
    data = json.loads(out.read_text())
    tiny = data["results"]["tiny"]
    assert 0.95 < tiny["info"]["flop_counter_over_analytic_padded"] < 1.05  # the formula counts the matmuls
    for label in ("ours eager", "torch eager", "ours eager blocks64"):
        r = tiny["results"][label]
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] <= r["mfu_padded"] and len(r["step_seconds"]) == 2
        assert r["profile"]["wall_ms"] > 0 and r["profile"]["device_busy_ms"] == 0  # no device on a CPU
    profile = (tmp_path / "profile.txt").read_text()
    assert profile.count("== tiny ") == 0 and profile.count("== ours eager") == 2  # ours, ours blocks64
    assert "aten::mm" in profile


def test_gpu_train_configs_leave_configurations_out(tmp_path):
    out = tmp_path / "gpu_train.json"
    args = ["--device", "cpu", "--models", "tiny", "--steps", "1", "--warmup", "1", "--batches", "1"]
    args += ["--max-tokens", "256", "--vocab", "300", "--no-compile", "--threads", "1", "--json", str(out)]
    args += ["--configs", "ours-eager"]
    proc = _bench(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(json.loads(out.read_text())["results"]["tiny"]["results"]) == ["ours eager"]


def test_gpu_train_refuses_batches_first_seen_while_timed():
    args = ["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1", "--batches", "2"]
    proc = _bench(args)
    assert proc.returncode == 2 and "--warmup 1 < --batches 2" in proc.stderr


def test_gpu_train_length_buckets_give_the_buckets_shapes_and_print_their_padding(tmp_path):
    out = tmp_path / "gpu_train.json"
    args = ["--device", "cpu", "--models", "tiny", "--steps", "1", "--warmup", "2", "--batches", "2"]
    args += ["--max-tokens", "256", "--vocab", "300", "--no-compile", "--threads", "1", "--json", str(out)]
    args += ["--configs", "ours-eager", "--length-buckets", "16", "32", "64", "128"]
    proc = _bench(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = json.loads(out.read_text())["results"]["tiny"]["info"]
    for rows, S, T in info["batch_shapes"]:
        assert S in (16, 32, 64, 128) and T in (16, 32, 64, 128) and rows == 256 // max(S, T)
    assert 0 < info["target_padding"] < 1 and info["length_buckets"] == [16, 32, 64, 128]
    said = f"target padding {info['target_padding']:.1%} with --length-buckets [16, 32, 64, 128]"
    assert said in proc.stdout
