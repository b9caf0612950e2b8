"""bench/length_penalty.py chooses on validation only, measures lengths as sacreBLEU does, and runs
end to end on an untrained checkpoint and a toy corpus."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.length_penalty import choose, scored
from tests.test_translate import untrained_checkpoint
from tests.toy_text import make_pairs, write_split

ROOT = Path(__file__).resolve().parents[2]


def result(val: list[float], test: list[float]) -> dict:
    """One checkpoint's sweep over alphas 0.6, 2.0 (BLEU only)."""
    return {
        "val": {a: {"bleu": b} for a, b in zip((0.6, 2.0), val, strict=True)},
        "test_2016_flickr": {a: {"bleu": b} for a, b in zip((0.6, 2.0), test, strict=True)},
    }


def test_the_choice_is_the_best_mean_validation_bleu_whatever_the_test_says() -> None:
    runs = {"a": result([40.0, 42.0], [50.0, 10.0]), "b": result([41.0, 40.5], [50.0, 10.0])}
    assert choose(runs, [0.6, 2.0]) == 2.0  # mean validation 41.25 against 40.5
    runs["b"] = result([43.0, 40.5], [10.0, 50.0])
    assert choose(runs, [0.6, 2.0]) == 0.6  # 41.5 against 41.25


def test_the_length_ratio_is_output_over_reference_words() -> None:
    half = scored(["a dog"], ["a dog runs fast"])
    assert half["ratio"] == pytest.approx(0.5)
    assert half["bleu"] < scored(["a dog runs fast"], ["a dog runs fast"])["bleu"] == pytest.approx(100.0)


@pytest.mark.slow
def test_length_penalty_smoke(tmp_path: Path) -> None:
    checkpoint = untrained_checkpoint(tmp_path)
    for split, seed in (("val", 1), ("test_2016_flickr", 2)):
        write_split(tmp_path / "corpus", split, make_pairs(12, seed=seed, max_len=5, period=False))
    out = tmp_path / "lp.json"
    args = ["--checkpoints", str(checkpoint), "--alphas", "0", "2", "--data-dir", str(tmp_path / "corpus")]
    args += ["--lines", "8", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "length_penalty.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(out.read_text())
    assert found["alphas"] == [0.0, 0.6, 2.0]  # the baseline added
    sweep = found["results"][str(checkpoint)]
    assert set(sweep) == {"val", "test_2016_flickr"}
    assert all(set(by_alpha) == {"0.0", "0.6", "2.0"} for by_alpha in sweep.values())
    best = max(found["alphas"], key=lambda a: sweep["val"][str(a)]["bleu"])
    assert sweep["val"][str(found["chosen"])]["bleu"] == sweep["val"][str(best)]["bleu"]
    assert "chosen on validation: alpha" in proc.stdout
