"""bench/sampling_lengths.py counts pieces as the run segments them, and runs end to end on a toy corpus."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sampling_lengths import SETTINGS, pieces
from data.spm_training import train_sentencepiece
from tests.toy_text import make_pairs, write_split

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def toy():
    pairs = make_pairs(300, seed=7)
    return pairs, train_sentencepiece([s for s, _ in pairs] + [t for _, t in pairs], 40)


def test_pieces_counts_the_best_segmentation_or_a_seeded_draw(toy):
    pairs, tokenizer = toy
    texts = [s for s, _ in pairs[:50]]
    assert pieces(tokenizer, texts, None, -1) == sum(len(ids) for ids in tokenizer.encode(texts))
    drawn = pieces(tokenizer, texts, 0.1, -1)
    assert drawn == sum(len(ids) for ids in tokenizer.sample_encode(texts, 0.1, -1, seed=0))
    assert drawn == pieces(tokenizer, texts, 0.1, -1)  # seeded: the same draw each time


@pytest.mark.slow
def test_sampling_lengths_smoke(tmp_path, toy):
    pairs, tokenizer = toy
    write_split(tmp_path / "corpus", "train", pairs)
    model = tmp_path / "toy.model"
    model.write_bytes(tokenizer.model_proto)
    out = tmp_path / "lengths.json"
    args = ["--model", str(model), "--data-dir", str(tmp_path / "corpus"), "--lines", "100"]
    args += ["--json", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sampling_lengths.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert [(s["alpha"], s["nbest"]) for s in result["settings"]] == list(SETTINGS)
    best = result["best_pieces"]
    for setting in result["settings"]:
        assert set(setting["ratio"]) == {"de", "en"}
        assert all(r > 0 for r in setting["ratio"].values())
    assert set(best) == {"de", "en"} and min(best.values()) > 0
    assert "| alpha |" in proc.stdout
