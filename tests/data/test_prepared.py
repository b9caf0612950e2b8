"""Corpus preparation: blank training pairs dropped, over-long pairs dropped, each with its counts."""

from __future__ import annotations

import logging
from pathlib import Path

import datasets
import pytest

from data.prepared import drop_long_pairs, load_parallel_corpus
from tests.data.conftest import write_file


def test_blank_training_pairs_dropped_with_counts_eval_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = ["gut", "", "auch", " \t\u2028", "ok", "x"]
    tgt = ["good", "leer", "", "blank", "\x0c", "y"]
    for split in ("train", "val", "test_2016_flickr"):
        write_file(tmp_path / f"{split}.de", "".join(s + "\n" for s in src))
        write_file(tmp_path / f"{split}.en", "".join(t + "\n" for t in tgt))
    with caplog.at_level(logging.INFO, logger="data.prepared"):
        corpus = load_parallel_corpus("de", "en", data_dir=str(tmp_path))
    assert corpus["train"]["src"] == ["gut", "x"]
    assert corpus["train"]["id"] == [0, 5]  # ids stay the line numbers
    assert len(corpus["validation"]) == len(corpus["test"]) == 6
    assert "kept 2 of 6 pairs; dropped 2 with an empty side, 2 with a whitespace-only side" in (caplog.text)


def test_drop_long_pairs_reports_counts(caplog: pytest.LogCaptureFixture) -> None:
    ds = datasets.Dataset.from_dict({"id": [0, 1, 2, 3], "src": list("abcd"), "tgt": list("abcd")})
    with caplog.at_level(logging.INFO, logger="data.prepared"):
        kept = drop_long_pairs(ds, [3, 9, 4, 5], [2, 4, 10, 5], max_len=5)
    assert kept["id"] == [0, 3]
    assert "kept 2 of 4 pairs; dropped 2 longer than 5 tokens" in caplog.text
