"""bench/loss_blocks.py runs end to end on a tiny model and reports every block size."""

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


def test_loss_blocks_smoke(tmp_path):
    out = tmp_path / "blocks.json"
    args = ["--tiny", "--rows", "64", "4", "--rounds", "1", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "loss_blocks.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["4", "64"]
    for figures in results.values():
        assert figures["round_s"] > 0 and figures["peak_bytes"] > 0
    assert "speed vs 64" in proc.stdout
