"""bench/constraints.py runs end to end on the toy checkpoint and a toy test set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_translate import toy_checkpoint
from tests.toy_text import toy_pairs, write_split

__all__ = ["toy_checkpoint"]  # a fixture, used by name

# The bench tier: runs a benchmark script end to end (python3 -m pytest -m slow; README, "Test").
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_constraints_bench_smoke(toy_checkpoint: Path, tmp_path: Path) -> None:
    # References with a word the source does not ask for: the one constraint of most lines.
    pairs = [(s, t + " slowly") for s, t in toy_pairs(30, seed=4)]
    write_split(tmp_path, "test_2016_flickr", pairs)
    out = tmp_path / "constraints.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "constraints.py"), "--checkpoint", str(toy_checkpoint)]
        + ["--data-dir", str(tmp_path), "--threads", "1", "--rounds", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    without, with_ = record["results"]["without constraints"], record["results"]["with constraints"]
    assert with_["constraints"] >= 20 and with_["unmet_lines"] == 0
    assert without["kept"] == 0.0 and with_["kept"] == with_["kept_as_words"] == 1.0
    assert record["time_ratio"] > 0 and "| with constraints" in proc.stdout
