"""bench/attention_scaling.py and bench/attention_decoding.py run end to end on tiny shapes."""

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
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(script: str, args: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_attention_scaling_smoke(tmp_path):
    from bench.attention_scaling import MECHANISMS

    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    args = ["--lengths", "64", "--d-model", "32", "--heads", "2", "--timeout", "60", "--threads", "1"]
    args += ["--roles", "encoder", "--scopes", "core", "--precisions", "fp32", "--repeats", "1"]
    stdout = _run("attention_scaling.py", [*args, "--json", str(out), "--plot", str(png)])
    assert "## encoder, fp32, core" in stdout and "issue 23's targets" not in stdout  # no 4K or 16K run
    for name in MECHANISMS:
        assert f"| {name} " in stdout
    results = json.loads(out.read_text())["results"]
    assert sorted(r["mechanism"] for r in results) == sorted(MECHANISMS)
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in results), results
    # The peak is the exact memory child's; the timing child's is kept beside it.
    assert all(r["memory"] == "exact" and "rss_peak_mib" in r for r in results), results
    assert png.stat().st_size > 0


def test_attention_decoding_smoke(tmp_path):
    out = tmp_path / "decoding.json"
    stdout = _run(
        "attention_decoding.py", ["--steps", "32", "--d-model", "32", "--heads", "2", "--json", str(out)]
    )
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["linear", "local", "lsh", "performer", "softmax"]
    for name, r in results.items():
        assert f"| {name} " in stdout and len(r["step_ms"]) == 32
    # The RNN state of linear attention does not grow; softmax's K/V cache does.
    assert results["linear"]["state_first_bytes"] == results["linear"]["state_last_bytes"]
    assert results["softmax"]["state_last_bytes"] > results["softmax"]["state_first_bytes"]
