"""Cleaning training pairs where they are read (data.filters): each reason drops what it says,
counted, in the cache key; validation and test untouched."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from data.corpus import CorpusLocation
from data.filters import PairFilter, PairFilters, normalise
from data.prepared import prepare_corpus
from tests.data.conftest import write_file

PAIRS = [
    ("ein hund läuft", "a dog runs"),  # kept
    ("\u200b \u2060", "zero width"),  # empty once normalised
    ("ja", "yes"),  # one word: under min_len 2
    ("ein sehr langer satz mit vielen wörtern", "too short"),  # 7 words against 2: ratio 3.5
    ("Berlin Berlin", "berlin  berlin"),  # a copy, once normalised
    ("ein hund läuft", "a dog runs"),  # a duplicate of the first
    ("EIN HUND LÄUFT", "A DOG RUNS"),  # a duplicate too, lowercased
    ("zwei katzen schlafen", "two cats sleep"),  # kept
]
ALL = PairFilters(empty=True, min_len=2, max_len=6, length_ratio=3, copies=True, duplicates=True)


def test_each_filter_drops_its_pairs_and_counts_them_by_their_first_reason():
    pair_filter = PairFilter(ALL)  # the long pair is over max_len before its ratio is looked at
    keep = pair_filter.keep([s for s, _ in PAIRS], [t for _, t in PAIRS])
    assert keep.tolist() == [True, False, False, False, False, False, False, True]
    assert pair_filter.counts == {
        "empty": 1,
        "min_len": 1,
        "max_len": 1,
        "length_ratio": 0,
        "copies": 1,
        "eval_overlap": 0,
        "cross_duplicates": 0,
        "duplicates": 2,
        "script": 0,
        "language": 0,
    }  # fmt: skip
    ratio_only = PairFilter(PairFilters(length_ratio=3))
    assert ratio_only.keep([s for s, _ in PAIRS], [t for _, t in PAIRS]).tolist().count(False) == 1
    assert ratio_only.summary() == "1 length_ratio"
    assert normalise(" A\u00a0\u200bb  C ") == "a b c"


def test_settings_are_checked_when_the_config_is_read():
    assert not PairFilters().active and PairFilters.from_dict(None) == PairFilters()
    with pytest.raises(ValueError, match="data.filters: unknown setting.*dedup"):
        PairFilters.from_dict({"dedup": True})
    with pytest.raises(ValueError, match="data.filters.length_ratio must be null or at least 1"):
        PairFilters(length_ratio=0.5)


def _corpus(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for split in ("train", "val", "test_2016_flickr"):
        write_file(directory / f"{split}.de", "".join(s + "\n" for s, _ in PAIRS))
        write_file(directory / f"{split}.en", "".join(t + "\n" for _, t in PAIRS))
    return directory


def test_the_training_split_is_cleaned_where_read_counted_and_cached_apart(tmp_path, caplog):
    corpus, cache = _corpus(tmp_path / "corpus"), tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="data.prepared"):
        cleaned = prepare_corpus(
            CorpusLocation("de", "en", data_dir=str(corpus)), cache_dir=str(cache), filters=ALL
        )
    assert cleaned.splits["train"]["id"] == [0, 7]  # the line numbers of the two kept
    assert len(cleaned.splits["validation"]) == len(cleaned.splits["test"]) == len(PAIRS)
    assert cleaned.filtered == {"empty": 1, "min_len": 1, "max_len": 1, "copies": 1, "duplicates": 2}
    assert "data.filters dropped 1 pairs (empty), 1 pairs (min_len)" in caplog.text
    again = prepare_corpus(
        CorpusLocation("de", "en", data_dir=str(corpus)), cache_dir=str(cache), filters=ALL
    )
    assert again.reused and again.filtered == cleaned.filtered
    plain = prepare_corpus(CorpusLocation("de", "en", data_dir=str(corpus)), cache_dir=str(cache))
    assert not plain.reused and len(plain.splits["train"]) == len(PAIRS)  # another cache entry
