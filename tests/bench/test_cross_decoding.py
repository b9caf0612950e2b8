"""bench/cross_decoding.py runs end to end on tiny shapes, every cross-capable mechanism."""

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


def test_cross_decoding_smoke(tmp_path):
    out = tmp_path / "cross.json"
    args = ["--source-length", "64", "--d-model", "32", "--heads", "2", "--steps", "4", "--warmup", "1"]
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "cross_decoding.py"),
            *args,
            "--threads",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["linear", "linformer", "performer", "softmax"]
    for name, r in results.items():
        assert f"| {name} " in proc.stdout and len(r["step_ms"]) == 4 and r["vs_softmax"] > 0
