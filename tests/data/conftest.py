"""Fixtures for the data tests: a tiny synthetic corpus on disk, a toy SentencePiece model; no network."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from data.spm_training import train_sentencepiece
from data.tokenizer import SubwordTokenizer
from tests.toy_text import make_pairs, write_split

VOCAB = 40  # small enough for one side of the toy lexicon with the unigram model


def write_file(path: Path, text: str | bytes) -> Path:
    """``text`` (a str as UTF-8) written to ``path``, gzip-compressed where it ends in ``.gz``."""
    payload = text.encode("utf-8") if isinstance(text, str) else text
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


@pytest.fixture
def tiny_corpus_dir(tmp_path: Path) -> Path:
    """Multi30k-shaped directory: train (400 pairs), val (30), test_2016_flickr (25)."""
    directory = tmp_path / "corpus"
    write_split(directory, "train", make_pairs(400, seed=1))
    write_split(directory, "val", make_pairs(30, seed=2))
    write_split(directory, "test_2016_flickr", make_pairs(25, seed=3), gz=False)
    return directory


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    return make_pairs(300, seed=7)


@pytest.fixture(scope="module")
def joint(pairs: list[tuple[str, str]]) -> SubwordTokenizer:
    return train_sentencepiece([s for s, _ in pairs] + [t for _, t in pairs], VOCAB)
