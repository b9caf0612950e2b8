"""bench/inductor_cpu.py runs end to end on tiny tensors and reports every case, eager and compiled."""

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


def test_inductor_cpu_bench_times_each_case_eager_and_compiled(tmp_path):
    out = tmp_path / "inductor_cpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "inductor_cpu.py"), "--shape", "4", "8", "--repeats", "1"]
        + ["--threads", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert len(results) == 6
    names = "\n".join(results)
    parts = ("into bool", "where(bool mask", "as 0/1 in bf16", "partitioner", "ban_recompute", "dropout")
    for part in parts:
        assert part in names
    for name, r in results.items():
        assert r["eager_ms"] > 0 and r["compiled_ms"] > 0, name
        assert f"| {name} " in proc.stdout  # the table row
