"""Corpus preparation: blank training pairs dropped, over-long pairs dropped, each with its counts;
each defect of a corpus an error naming the file, the line and the fix, or, for bad training lines
under ``bad_lines="skip"``, pairs dropped and counted by file and line."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import datasets
import pytest

from data.corpus import CorpusError, CorpusLocation
from data.prepared import drop_long_pairs, prepare_corpus
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
        corpus = prepare_corpus(CorpusLocation("de", "en", data_dir=str(tmp_path))).splits
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


# ------------------------------------------------------------------ corpus defects (issue 54)

_GOOD = b"gut\nauch gut\nnoch eins\n"


def _corpus(directory: Path, train_de: bytes = _GOOD, train_en: bytes = b"good\nfine\none more\n") -> Path:
    """A three-line corpus whose train.de (plain, or gzip where the bytes say ``.gz``) is ``train_de``."""
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("val", "test_2016_flickr"):
        write_file(directory / f"{split}.de", _GOOD)
        write_file(directory / f"{split}.en", b"good\nfine\none more\n")
    (directory / "train.de").write_bytes(train_de)
    (directory / "train.en").write_bytes(train_en)
    return directory


def _gz(directory: Path, payload: bytes) -> None:
    """``train.de`` replaced by a ``train.de.gz`` holding exactly ``payload``."""
    (directory / "train.de").unlink()
    (directory / "train.de.gz").write_bytes(payload)


@pytest.mark.parametrize(
    ("defect", "message"),
    [
        (
            "counts",
            r"line counts differ: \S+train\.de has 3 lines, \S+train\.en has 2 lines; .*a line missing",
        ),
        ("utf8", r"train\.de: invalid UTF-8 at line 2, byte 5 .*iconv .*data\.bad_lines=skip"),
        ("nul", r"train\.de: NUL byte at line 3, byte 4 of the line: remove .*data\.bad_lines=skip"),
        ("empty", r"the train split is empty: \S+train\.de and \S+train\.en hold no lines"),
        ("blank", r"no training pair is left in \S+train\.de .*each of its 3 pairs has an empty"),
        ("not gzip", r"train\.de\.gz is not gzip data .*compress it with gzip, or remove \.gz"),
        ("truncated gzip", r"train\.de\.gz: corrupt or truncated gzip data after line 0 .*compress it again"),
    ],
)
def test_each_corpus_defect_is_a_corpus_error_naming_file_line_and_fix(
    tmp_path: Path, defect: str, message: str
) -> None:
    directory = tmp_path / "corpus"
    train_de = {
        "utf8": b"gut\nauch \xff gut\nnoch eins\n",
        "nul": b"gut\nauch gut\nnoch\x00eins\n",
        "empty": b"",
        "blank": b"\n \n\t\n",
    }.get(defect, _GOOD)
    train_en = {"counts": b"good\nfine\n", "empty": b""}.get(defect, b"good\nfine\none more\n")
    _corpus(directory, train_de, train_en)
    if defect == "not gzip":
        _gz(directory, b"not gzip at all\n")
    if defect == "truncated gzip":
        _gz(directory, gzip.compress(_GOOD * 1000)[:40])
    with pytest.raises(CorpusError, match=message):
        prepare_corpus(CorpusLocation("de", "en", data_dir=str(directory), fallback_hub_id=None))


@pytest.mark.parametrize("split", ["val", "test_2016_flickr"])
def test_an_empty_validation_or_test_split_is_an_error_naming_it(tmp_path: Path, split: str) -> None:
    directory = _corpus(tmp_path / "corpus")
    write_file(directory / f"{split}.de", b"")
    write_file(directory / f"{split}.en", b"")
    name = "validation" if split == "val" else "test"
    with pytest.raises(CorpusError, match=rf"the {name} split is empty: \S+{split}\.de and"):
        prepare_corpus(CorpusLocation("de", "en", data_dir=str(directory), fallback_hub_id=None))


def test_bad_lines_skip_drops_undecodable_and_nul_pairs_counting_them_by_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = _corpus(
        tmp_path / "corpus",
        b"gut\nauch \xff gut\nnoch eins\nletzte\n",
        b"good\nfine\none\x00more\nlast\n",
    )
    with caplog.at_level(logging.INFO, logger="data"):
        corpus = prepare_corpus(
            CorpusLocation("de", "en", data_dir=str(directory)), bad_lines="skip", cache_dir=tmp_path / "c"
        ).splits
    assert corpus["train"]["src"] == ["gut", "letzte"]
    assert corpus["train"]["id"] == [0, 3]  # ids stay the line numbers
    assert f"{directory / 'train.de'} line 2: invalid UTF-8 at byte 5" in caplog.text
    assert f"{directory / 'train.en'} line 3: NUL byte at byte 3 of the line: pair skipped" in caplog.text
    summary = (
        f"train: skipped 2 pairs: {directory / 'train.de'} 1 (line 2), {directory / 'train.en'} 1 (line 3)"
    )
    assert summary in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="data"):  # a cached corpus still says what it skipped
        again = prepare_corpus(
            CorpusLocation("de", "en", data_dir=str(directory)), bad_lines="skip", cache_dir=tmp_path / "c"
        ).splits
    assert again["train"]["src"] == ["gut", "letzte"]
    assert "reusing corpus" in caplog.text and "skipped 2 pairs" in caplog.text
    with pytest.raises(CorpusError, match="invalid UTF-8 at line 2"):  # error: not the skip's cache entry
        prepare_corpus(CorpusLocation("de", "en", data_dir=str(directory)), cache_dir=tmp_path / "c")


def test_bad_lines_skip_leaves_validation_and_test_errors(tmp_path: Path) -> None:
    directory = _corpus(tmp_path / "corpus")
    write_file(directory / "val.de", b"gut\nauch \xff gut\nnoch eins\n")
    with pytest.raises(CorpusError, match=r"val\.de: invalid UTF-8 at line 2.*drops training pairs only"):
        prepare_corpus(CorpusLocation("de", "en", data_dir=str(directory)), bad_lines="skip")
    with pytest.raises(ValueError, match="data.bad_lines must be one of error, skip, not 'drop'"):
        prepare_corpus(CorpusLocation("de", "en", data_dir=str(directory)), bad_lines="drop")


def test_windows_line_ends_are_line_ends_with_one_warning_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = _corpus(tmp_path / "corpus", b"gut\r\nauch gut\r\nnoch eins\r\n")
    with caplog.at_level(logging.WARNING, logger="data"):
        corpus = prepare_corpus(CorpusLocation("de", "en", data_dir=str(directory))).splits
    assert corpus["train"]["src"] == ["gut", "auch gut", "noch eins"]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        f"{directory / 'train.de'}: 3 lines end with \\r\\n (Windows line ends), read as line ends"
    ]
