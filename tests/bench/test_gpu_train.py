"""bench/gpu_train.py runs end to end on the CPU with a tiny model (the GPU figures need a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_train_bench_smoke_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_train.json"
    args = ["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1", "--batches", "1"]
    args += ["--max-tokens", "512", "--vocab", "500", "--no-compile", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_train.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| tiny ours eager " in proc.stdout and "| tiny torch eager " in proc.stdout
    data = json.loads(out.read_text())
    tiny = data["results"]["tiny"]
    assert 0.95 < tiny["info"]["flop_counter_over_analytic_padded"] < 1.05  # the formula counts the matmuls
    for label in ("ours eager", "torch eager"):
        r = tiny["results"][label]
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] <= r["mfu_padded"] and len(r["step_seconds"]) == 2


def test_gpu_train_refuses_batches_first_seen_while_timed():
    args = ["--device", "cpu", "--models", "tiny", "--steps", "2", "--warmup", "1", "--batches", "2"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_train.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--warmup 1 < --batches 2" in proc.stderr
