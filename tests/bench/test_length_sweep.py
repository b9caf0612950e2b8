"""bench/length_sweep.py runs end to end on a tiny model and reports ratios and crossovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.length_sweep import crossover

# The bench tier: runs a benchmark script end to end (python3 -m pytest -m slow; README, "Test").
pytestmark = pytest.mark.slow


ROOT = Path(__file__).resolve().parents[2]


def test_crossover_is_the_shortest_length_from_which_it_stays_ahead():
    assert crossover({64: 0.5, 256: 1.2, 1024: 0.9, 4096: 2.0}) == 4096
    assert crossover({64: 0.5, 256: 1.2, 1024: 1.5}) == 256
    assert crossover({64: 0.5, 256: 0.8}) is None


def test_length_sweep_smoke(tmp_path):
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    args = ["--lengths", "16", "32", "--tokens", "64", "--d-model", "16", "--heads", "2", "--layers", "1"]
    args += ["--steps", "1", "--vocab", "32", "--threads", "1", "--mechanisms", "linear", "nystrom"]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "length_sweep.py"),
            *args,
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert sorted(data["results"]) == ["linear", "nystrom", "softmax"]  # softmax added as the baseline
    for name, rows in data["results"].items():
        for length in ("16", "32"):
            r = rows[length]
            assert r["tokens_s"] > 0 and r["peak_bytes"] > 0 and r["batch"] == 64 // int(length), (name, r)
    assert data["results"]["nystrom"]["16"]["attention"]["decoder_self"] == "softmax"  # not causal
    assert set(data["crossover"]["linear"]) == {"faster_from", "less_memory_from"}
    assert png.stat().st_size > 0
