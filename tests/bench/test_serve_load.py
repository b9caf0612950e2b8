"""bench/serve_load.py runs end to end on a tiny model: both systems, their rates and ratio, and
the server's translations equal to translate.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serve_load import rate_rows
from tests.toy_text import toy_pairs
from tests.translation.serve.helpers import require_serve, write_toy_checkpoint

# The bench tier: runs a benchmark script end to end (python3 -m pytest -m slow; README, "Test").
pytestmark = pytest.mark.slow
require_serve()

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_serve_load_prints_both_rates_and_equal_translations(tmp_path: Path) -> None:
    checkpoint = write_toy_checkpoint(tmp_path / "toy.ckpt")
    source = tmp_path / "input.de"
    source.write_text("".join(s + "\n" for s, _ in toy_pairs(30, seed=2)))
    args = ["--checkpoint", str(checkpoint), "--input", str(source), "--lines", "24", "--clients", "4"]
    args += ["--request-lines", "5", "--beam-size", "2", "--threads", "1", "--json", str(tmp_path / "r.json")]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "serve_load.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| server, 4 clients " in proc.stdout and "| translate.py (less start-up) " in proc.stdout
    assert "server: 5 requests in " in proc.stdout
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results["equal_lines"] == 24
    decoding = results["translate_py_wall_s"] - results["translate_py_start_up_s"]
    if decoding > 0:
        assert results["ratio"] == pytest.approx(decoding / results["server_s"])
    else:  # a toy's 24 lines can decode within the start-up's noise: said, and no ratio made up
        assert results["ratio"] is None and "did not outlast its start-up's noise" in proc.stdout


def test_rate_rows_give_no_rate_where_the_decoding_is_not_positive() -> None:
    measured = rate_rows(wall=5.0, decoding=4.0, server=2.0, clients=4, lines=100)
    assert [row[-1] for row in measured] == ["0.80", "1.00", "2.00"]
    assert measured[1][2] == "25.0" and measured[2][2] == "50.0"
    unmeasured = rate_rows(wall=3.0, decoding=-0.1, server=2.0, clients=4, lines=24)
    assert [row[-1] for row in unmeasured] == ["-", "1.00", "-"] and unmeasured[1][2] == "-"
