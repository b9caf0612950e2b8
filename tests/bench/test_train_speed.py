"""bench/train_speed.py runs end to end on a tiny model, and its bound on the step's fraction of the
peak times exactly the step's matrix products."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The bench tier: runs a benchmark script end to end (python3 -m pytest -m slow; README, "Test").
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

# Run in a child: importing the script makes the training process's allocator settings.
COUNT_PRODUCTS = """
import sys
sys.path.insert(0, "bench")
import train_speed as ts

for sizes in (ts.Sizes(), ts.Sizes(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=500)):
    for shape in ((215, 16, 19), (372, 11, 11), (3, 700, 650), (1, 1, 1)):
        counted = sum(c * 2 * b * m * k * n for (b, m, k, n, _), c in ts.step_products(sizes, *shape).items())
        print(counted == 3 * ts.forward_flops(sizes, *shape), shape)
"""


def test_the_bound_multiplies_what_the_flop_formula_counts():
    proc = subprocess.run(
        [sys.executable, "-c", COUNT_PRODUCTS], cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 8 and all(line.startswith("True") for line in lines), proc.stdout


def test_train_speed_smoke_prints_both_models_and_the_products_bound():
    args = ["--tiny", "--rounds", "2", "--warmup", "1", "--batches", "2", "--threads", "1"]
    args += ["--precisions", "fp32"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train_speed.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| ours fp32 " in proc.stdout and "| torch fp32 " in proc.stdout
    bound = [line for line in proc.stdout.splitlines() if line.startswith("| fp32 ")]
    assert len(bound) == 1, proc.stdout
    step_ms, products_ms, products_fraction, step_fraction = (float(x) for x in bound[0].split("|")[2:6])
    assert 0 < products_ms < step_ms  # the products are part of the step
    assert 0 < step_fraction < products_fraction
