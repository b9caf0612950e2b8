"""data.filters for any language, on a small English-Chinese mix made here: lengths in characters or
SentencePiece pieces where words miscount Chinese, a side in the wrong script or language,
duplicates across corpora, training pairs that are also in the test set; each dropped by its
filter and counted under its name, per corpus."""

from __future__ import annotations

import itertools
import logging
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from data import language_id
from data.corpus import CorpusLocation
from data.datamodule import TranslationDataModule
from data.filters import PairFilter, PairFilters
from data.piece_lengths import dropped_in_pieces
from data.prepared import _source_key, prepare_corpus
from data.scripts import script_of, script_share, scripts_of
from data.settings import DataSettings
from tests.data.conftest import write_file

# A word-for-word English-Chinese lexicon: "a big dog runs in the park" is 一只大狗在公园里跑。,
# seven words against one, as Chinese has no spaces.
ADJECTIVES = {"big": "大", "small": "小", "red": "红", "old": "老", "young": "年轻"}
NOUNS = {"dog": "狗", "cat": "猫", "bird": "鸟", "horse": "马", "rabbit": "兔子", "duck": "鸭子"}
VERBS = {"runs": "跑", "jumps": "跳", "sits": "坐", "sleeps": "睡觉", "eats": "吃东西"}
PLACES = {"in the park": "在公园里", "on the street": "在街上", "at home": "在家", "by the river": "在河边"}


def en_zh_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` distinct good pairs of the lexicon, drawn without replacement."""
    combos = list(itertools.product(ADJECTIVES, NOUNS, VERBS, PLACES))
    chosen = random.Random(seed).sample(combos, n)
    return [
        (
            f"a {adj} {noun} {verb} {place}",
            f"一只{ADJECTIVES[adj]}{NOUNS[noun]}{PLACES[place]}{VERBS[verb]}。",
        )
        for adj, noun, verb, place in chosen
    ]


GOOD = en_zh_pairs(330, seed=1)  # disjoint: web's, more's, validation's, test's
WEB, MORE, VALID, TEST = GOOD[:200], GOOD[200:290], GOOD[290:310], GOOD[310:]
# What each filter is for, one of each, mixed into the corpus "web".
GERMAN = ("Der Hund läuft schnell über die Wiese.", "狗在草地上跑得很快。")  # source not English
PINYIN = ("Please turn off your phone.", "Qing guanbi shouji.")  # a "Chinese" side in Latin letters
JAPANESE = ("A cat is sleeping on the sofa.", "今日は天気がいいです。")  # kana: 4 of 10 letters Han
COPY = ("iPhone 15 Pro", "iPhone 15 Pro")
LOPSIDED = ("a big dog runs in the park and a small cat sleeps at home by the river", "好。")
IN_TEST = TEST[0]  # the test set's first pair, also offered for training
ON_WEB = WEB[0]  # offered again by the corpus "more"


def _write(directory: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_file(directory / f"{split}.en", "".join(s + "\n" for s, _ in pairs))
    write_file(directory / f"{split}.zh", "".join(t + "\n" for _, t in pairs))


def test_words_drop_the_good_en_zh_pairs_that_characters_and_pieces_keep():
    sources, targets = [s for s, _ in WEB], [t for _, t in WEB]
    in_words = PairFilter(PairFilters(length_ratio=3))  # today's default unit
    assert not in_words.keep(sources, targets).any()  # every pair: 6 to 8 words against 1
    assert in_words.counts["length_ratio"] == len(WEB)
    in_characters = PairFilter(PairFilters(length_ratio=3, length_unit="characters"))
    assert in_characters.keep(sources, targets).all()
    assert in_characters.keep([LOPSIDED[0]], [LOPSIDED[1]]).tolist() == [False]
    # In pieces, the run below keeps them all (its SentencePiece model is trained on them).


def test_lengths_in_pieces_count_each_pair_under_its_first_reason():
    src, tgt = np.array([1, 12, 7, 4]), np.array([1, 3, 2, 3])
    dropped = dropped_in_pieces(
        PairFilters(min_len=2, max_len=9, length_ratio=3, length_unit="pieces"), src, tgt
    )
    assert {reason: hit.tolist() for reason, hit in dropped.items()} == {
        "min_len": [True, False, False, False],
        "max_len": [False, True, False, False],
        "length_ratio": [False, False, True, False],
    }


def test_each_side_is_judged_by_the_script_of_its_language():
    assert script_share("一只大狗在公园里跑。", scripts_of("zh")) == 1.0
    assert script_share(PINYIN[1], scripts_of("zh_CN")) == 0.0
    assert script_share(JAPANESE[1], scripts_of("zh")) == pytest.approx(0.4)
    assert script_share(JAPANESE[1], scripts_of("ja")) == 1.0  # Han and kana
    assert (
        script_share("안녕하세요", scripts_of("ko")) == 1.0
        and script_share("Привет", scripts_of("ru")) == 1.0
    )
    assert script_share("2015 !", scripts_of("en")) is None  # no letter: left to the other filters
    assert script_share("Ｈｅｌｌｏ", scripts_of("en")) == 1.0  # full-width Latin is Latin
    assert [script_of(c) for c in "aß狗ーか가й1"] == [
        "Latin",
        "Latin",
        "Han",
        "Katakana",
        "Hiragana",
        "Hangul",
        "Cyrillic",
        None,
    ]
    script = PairFilter(PairFilters(script=0.5), "en", "zh")
    pairs = [WEB[1], PINYIN, JAPANESE, GERMAN]  # German is in Latin letters: the script filter keeps it
    assert script.keep([s for s, _ in pairs], [t for _, t in pairs]).tolist() == [True, False, False, True]
    assert script.summary() == "2 script"


def test_a_side_in_another_language_is_dropped_and_counted(tmp_path, caplog):
    pytest.importorskip(
        "py3langid", reason='the langid extra is not installed: python3 -m pip install -e ".[langid]"'
    )
    corpus = tmp_path / "corpus"
    written = [
        ("Two men are playing football on the grass.", "两个男人在草地上踢足球。"),
        GERMAN,
        ("The children are reading books in the library.", "孩子们在图书馆里看书。"),
        JAPANESE,
    ]
    _write(corpus, "train", written)
    for split in ("val", "test_2016_flickr"):
        _write(corpus, split, written[:1])
    with caplog.at_level(logging.INFO, logger="data.prepared"):
        prepared = prepare_corpus(
            CorpusLocation("en", "zh", data_dir=str(corpus)),
            cache_dir=str(tmp_path / "cache"),
            filters=PairFilters(language=0.3),
        )
    assert prepared.filtered == {"language": 2}  # the German source, the Japanese target
    assert prepared.splits["train"]["id"] == [0, 2]
    assert "data.filters dropped 2 pairs (language)" in caplog.text
    check = language_id.LanguageCheck(0.99)  # a threshold above what a short sentence gets
    assert not check.is_in(written[0][1], "zh") and language_id.LanguageCheck(0.0).is_in(written[0][1], "zh")
    with pytest.raises(ValueError, match=r"data.filters.language: py3langid cannot identify 'xx'"):
        DataSettings.from_config({"src_lang": "en", "tgt_lang": "xx", "filters": {"language": 0.5}})


def test_the_language_filter_without_its_extra_names_the_key_and_the_install_command(monkeypatch):
    language_id._identifier.cache_clear()
    monkeypatch.setitem(sys.modules, "py3langid", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)
    try:
        with pytest.raises(
            ValueError, match=r'data.filters.language needs py3langid.*pip install -e "\.\[langid\]"'
        ):
            DataSettings.from_config({"tgt_lang": "zh", "filters": {"language": 0.5}})
    finally:
        language_id._identifier.cache_clear()
    assert DataSettings.from_config({"tgt_lang": "zh", "filters": {"script": 0.5}})  # no extra needed


def test_settings_are_checked_naming_the_key():
    with pytest.raises(
        ValueError, match=r"data.filters.length_unit must be one of words, characters, pieces"
    ):
        PairFilters(length_unit="tokens")
    with pytest.raises(
        ValueError, match=r"data.filters.eval_overlap must be null, source or pair, not 'both'"
    ):
        PairFilters(eval_overlap="both")
    with pytest.raises(ValueError, match=r"data.filters.script must be null or a share in \(0, 1\]"):
        PairFilters(script=0)
    with pytest.raises(ValueError, match=r"data.filters.script: no script is known for the language 'xx'"):
        DataSettings.from_config({"src_lang": "xx", "filters": {"script": 0.5}})


def test_settings_not_applied_where_a_corpus_is_read_keep_its_cache_key():
    args = (
        CorpusLocation("en", "zh", data_dir="/d"),
        CorpusLocation("en", "zh", data_dir="/d").resolve(),
        {},
        "error",
        "",
        ["train"],
    )
    plain = _source_key(*args)
    assert _source_key(*args, PairFilters()) == plain  # the defaults: a config without filters
    assert _source_key(*args, PairFilters(length_unit="pieces", length_ratio=3, max_len=200)) == plain
    words = _source_key(*args, PairFilters(length_ratio=3))
    assert words != plain and _source_key(*args, PairFilters(length_ratio=3, length_unit="words")) == words
    assert _source_key(*args, PairFilters(length_ratio=3, length_unit="characters")) != words


def _mix(tmp_path: Path) -> dict:
    """The data keys of a run on two en->zh corpora, "web" (the bad pairs mixed in) and "more"."""
    main, web, more = tmp_path / "main", tmp_path / "web", tmp_path / "more"
    _write(main, "val", VALID)
    _write(main, "test", TEST)
    bad = [GERMAN, PINYIN, JAPANESE, COPY, LOPSIDED, IN_TEST, WEB[5]]  # WEB[5]: a duplicate within web
    mixed = WEB[:100] + bad[:4] + WEB[100:] + bad[4:]
    _write(web, "train", mixed)
    _write(more, "train", MORE[:50] + [ON_WEB] + MORE[50:])
    return {
        "data_dir": str(main),
        "src_lang": "en",
        "tgt_lang": "zh",
        "test_split": "test",
        "corpora": [
            {"name": "web", "data_dir": str(web)},
            {"name": "more", "data_dir": str(more), "tag": "<BT>"},
        ],
        "vocab_size": 180,
        "spm_model_type": "bpe",  # English words become pieces of so small a text; unigram keeps letters
        "max_tokens": 400,
        "cache_dir": str(tmp_path / "cache"),
        "fallback_hub_id": None,
    }


FILTERS = {
    "empty": True,
    "length_unit": "pieces",
    "length_ratio": 3,
    "copies": True,
    "eval_overlap": "source",
    "cross_duplicates": True,
    "duplicates": True,
    "script": 0.5,
}


def test_each_filter_drops_its_pairs_of_a_mixed_en_zh_run_counted_per_corpus(tmp_path, caplog):
    dm = TranslationDataModule(**_mix(tmp_path), filters=FILTERS)
    with caplog.at_level(logging.INFO, logger="data"):
        dm.setup("fit")
    assert dm.filtered == {  # what results.json records (training/pipeline.py)
        "web": {"length_ratio": 1, "copies": 1, "eval_overlap": 1, "duplicates": 1, "script": 2},
        "more": {"cross_duplicates": 1},
    }
    read = set(zip(dm.corpus["train"]["src"], dm.corpus["train"]["tgt"], strict=True))
    for dropped in (COPY, IN_TEST, PINYIN, JAPANESE, ("<BT> " + ON_WEB[0], ON_WEB[1])):
        assert dropped not in read  # where read, before SentencePiece
    assert GERMAN in read and LOPSIDED in read  # the language filter is off; lengths come in pieces
    assert len(dm.corpus["train"]) == 200 + 90 + 2  # the good ones of both, German, the lopsided pair
    lopsided = dm.corpus["train"]["src"].index(LOPSIDED[0])
    assert lopsided not in dm._served["train"].rows and len(dm.lengths["train"][0]) == 291
    assert [s["pairs"] for s in dm.corpus_summary] == [201, 90]  # every good en->zh pair kept
    assert "web: data.filters dropped 1 pairs (length_ratio), counted in SentencePiece pieces" in caplog.text
    assert (
        "data.filters dropped 1 pairs (copies), 1 pairs (eval_overlap), 1 pairs (duplicates)" in caplog.text
    )
    assert "data.filters dropped 1 pairs (cross_duplicates)" in caplog.text
    # Validation and test are never filtered.
    assert len(dm.corpus["validation"]) == len(VALID) and len(dm.corpus["test"]) == len(TEST)


def test_the_overlap_of_a_single_corpus_with_its_own_test_set_is_dropped_and_follows_the_test_set(tmp_path):
    args = _mix(tmp_path)
    web = Path(args.pop("corpora")[0]["data_dir"])
    main = Path(args["data_dir"])
    for name in ("train.en", "train.zh"):
        (main / name).write_bytes((web / name).read_bytes())
    dm = TranslationDataModule(**args, filters={"eval_overlap": "pair"})
    dm.setup("fit")
    assert dm.filtered == {"train": {"eval_overlap": 1}}
    assert IN_TEST[0] not in dm.corpus["train"]["src"] and len(dm.corpus["test"]) == len(TEST)
    _write(main, "test", [*TEST, WEB[7]])  # a changed test set: the training split is read afresh
    again = TranslationDataModule(**args, filters={"eval_overlap": "pair"})
    again.setup("fit")
    assert again.filtered == {"train": {"eval_overlap": 2}}
