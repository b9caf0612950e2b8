"""bench/gpu_attention.py and bench/gpu_decode.py run end to end on the CPU (their figures need a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import MULTI30K_DIR
from tests.translation.export.conftest import toy_checkpoints  # noqa: F401, F811 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_gpu_attention_smoke_reports_every_mechanism_and_role(tmp_path):
    out = tmp_path / "gpu_attention.json"
    args = [
        "--device",
        "cpu",
        "--lengths",
        "64",
        "--precisions",
        "fp32",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_attention.py"), *args],
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    from bench.attention_scaling import MECHANISMS

    assert {(r["mechanism"], r["role"]) for r in results} == {
        (m, role) for m in MECHANISMS for role in ("encoder", "decoder")
    }  # no row dropped
    statuses = {r["status"] for r in results}
    assert statuses <= {"ok", "refused"}, statuses  # nothing broke on the CPU
    sdpa = next(r for r in results if r["mechanism"] == "sdpa" and r["role"] == "encoder")
    assert sdpa["ms"] > 0 and sdpa["speed_vs_sdpa"] == 1.0


@pytest.mark.transformers
@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
@pytest.mark.skipif(
    not (MULTI30K_DIR / "test_2016_flickr.de.gz").is_file(),
    reason=f"needs the Multi30k corpus in {MULTI30K_DIR}",
)
def test_gpu_decode_smoke_compares_ours_with_hugging_face(tmp_path, toy_checkpoints):  # noqa: F811
    pytest.importorskip(
        "transformers", reason='needs the export extra: python3 -m pip install -e ".[export]"'
    )
    out = tmp_path / "gpu_decode.json"
    args = [
        "--checkpoint",
        str(toy_checkpoints["joint"]),
        "--device",
        "cpu",
        "--sentences",
        "4",
        "--reps",
        "1",
    ]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_decode.py"), *args, "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["sentences"] == 4
    for name in ("ours", "HF generate"):
        assert data[name]["sentences_per_s"] > 0 and 0 <= data[name]["bleu"] <= 100
