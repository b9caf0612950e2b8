"""Several training corpora in one run: mixed by weight, tagged sources whose tags stay one
SentencePiece piece, target-language tags for one model of several languages; validation sets of
their own places, languages and tags; bad entries named."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from data.corpora import TrainingCorpus, ValidationSet, parse_corpora, parse_valid_sets, target_tag
from data.corpus import CorpusLocation
from data.datamodule import TranslationDataModule
from data.tokenizer import SpmModelError, load_run_tokenizers
from tests.toy_text import make_pairs, write_split

VOCAB = 72


def _write(directory: Path, splits: dict[str, int], seed: int, langs: tuple[str, str] = ("de", "en")) -> Path:
    """A toy corpus ``{split}.{src}`` / ``{split}.{tgt}`` (the toy lexicon's two sides renamed)."""
    for i, (split, n) in enumerate(splits.items()):
        toy = directory / "toy"
        write_split(toy, split, make_pairs(n, seed + i, 2, 6, period=False), gz=False)
        for lang, side in zip(langs, ("de", "en"), strict=True):
            (toy / f"{split}.{side}").rename(directory / f"{split}.{lang}")
        toy.rmdir()
    return directory


def _datamodule(tmp_path: Path, **kwargs: object) -> TranslationDataModule:
    main = _write(tmp_path / "main", {"train": 300, "val": 20, "test": 20}, seed=1)
    args = {
        "data_dir": str(main),
        "test_split": "test",
        "vocab_size": VOCAB,
        "max_tokens": 200,
        "cache_dir": str(tmp_path / "cache"),
        "run_dir": str(tmp_path / "run"),
        "fallback_hub_id": None,
        "seed": 3,
    }
    args.update(kwargs)
    return TranslationDataModule(**args)


def test_a_back_translation_mix_draws_each_corpus_by_weight_with_its_tag_one_piece(tmp_path, caplog):
    bt = _write(tmp_path / "bt", {"train": 400}, seed=9)
    corpora = [
        {"name": "clean", "weight": 2},
        {"name": "bt", "data_dir": str(bt), "weight": 0.5, "tag": "<BT>"},
    ]
    dm = _datamodule(tmp_path, corpora=corpora)
    with caplog.at_level(logging.INFO, logger="data"):
        dm.setup("fit")
    sources = dm.corpus["train"]["src"]
    assert sum(s.startswith("<BT> ") for s in sources) == 400 and len(sources) == 700
    assert not any(s.startswith("<BT>") for s in dm.corpus["validation"]["src"])  # a training tag only
    tok = dm.src_tokenizer
    assert [p for p in tok.pieces("<BT> hund") if p != "\u2581"][0] == "<BT>"
    assert load_run_tokenizers(tmp_path / "run")[0].pieces("<BT>") == tok.pieces("<BT>")
    kept = {s["name"]: s["pairs"] for s in dm.corpus_summary}
    assert [s["per_epoch"] for s in dm.corpus_summary] == [2 * kept["clean"], round(0.5 * kept["bt"])]
    assert (
        "training corpora, pairs per epoch: clean 600 (300 pairs x 2); bt 200 (400 pairs x 0.5, tagged <BT>)"
        in (caplog.text)
    )
    sampler = dm.batch_sampler("train")
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        held = np.concatenate([np.asarray(b) for b in batches])
        from_bt = sum(sources[i].startswith("<BT> ") for i in dm._served["train"].rows[held])
        assert len(held) == 800 and from_bt == 200


def test_a_temperature_gives_each_corpus_its_share_of_pairs_to_the_one_over_t(tmp_path, caplog):
    bt = _write(tmp_path / "bt", {"train": 1200}, seed=9)
    corpora = [{"name": "clean"}, {"name": "bt", "data_dir": str(bt), "tag": "<BT>"}]
    dm = _datamodule(tmp_path, corpora=corpora, corpora_temperature=2.0)
    with caplog.at_level(logging.INFO, logger="data"):
        dm.setup("fit")
    pairs = np.array([s["pairs"] for s in dm.corpus_summary], dtype=float)
    per_epoch = np.array([s["per_epoch"] for s in dm.corpus_summary], dtype=float)
    assert per_epoch.sum() == pytest.approx(pairs.sum(), abs=1)
    assert per_epoch / per_epoch.sum() == pytest.approx(np.sqrt(pairs) / np.sqrt(pairs).sum(), abs=2e-3)
    assert dm.corpus_summary[0]["weight"] > 1 > dm.corpus_summary[1]["weight"]  # the small one upsampled


def test_a_temperature_and_a_weight_together_are_refused(tmp_path):
    refused = r"data.corpora\[1\].weight is set and so is data.corpora_temperature"
    with pytest.raises(ValueError, match=refused):
        _datamodule(tmp_path, corpora=[{"name": "a"}, {"name": "b", "weight": 0.5}], corpora_temperature=5)


def test_target_language_tags_make_one_model_for_several_languages(tmp_path):
    # main: en->de (validation and test); training: en->de and en->fr, each tagged with its target
    main = _write(tmp_path / "en_de", {"train": 200, "val": 10, "test": 10}, seed=1, langs=("en", "de"))
    fr = _write(tmp_path / "fr", {"train": 200}, seed=5, langs=("en", "fr"))
    corpora = [{"name": "en-de"}, {"name": "en-fr", "data_dir": str(fr), "tgt_lang": "fr"}]
    dm = _datamodule(
        tmp_path, data_dir=str(main), src_lang="en", tgt_lang="de", corpora=corpora, target_lang_tags=True
    )
    dm.setup("fit")
    train = dm.corpus["train"]["src"]
    assert (
        sum(s.startswith("<2de> ") for s in train) == 200
        and sum(s.startswith("<2fr> ") for s in train) == 200
    )
    assert all(s.startswith("<2de> ") for s in [*dm.corpus["validation"]["src"], *dm.corpus["test"]["src"]])
    assert dm.reserved == ["<2de>", "<2fr>"]
    for tag in dm.reserved:
        assert [p for p in dm.src_tokenizer.pieces(tag) if p != "\u2581"] == [tag]


def test_a_given_model_that_would_split_a_tag_is_refused(tmp_path):
    plain = _datamodule(tmp_path / "a")
    plain.setup("fit")
    model = tmp_path / "a" / "run" / "tokenizer" / "joint.model"
    dm = _datamodule(tmp_path / "b", spm_model=str(model), corpora=[{"name": "clean", "tag": "<BT>"}])
    with pytest.raises(SpmModelError, match=r"data.spm_model=.*joint\.model: the tag <BT> is not one piece"):
        dm.setup("fit")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "bt", "wieght": 2}, r"data.corpora\[1\].wieght is not a setting of a corpus"),
        ({"weight": 2}, r"data.corpora\[1\].name is missing"),
        ({"name": "a"}, r"data.corpora\[1\].name 'a' is used twice"),
        ({"name": "bt", "weight": 0}, r"data.corpora\[1\].weight must be a positive number, not 0"),
        ({"name": "bt", "weight": "two"}, r"data.corpora\[1\].weight must be a positive number"),
        ({"name": "bt", "tag": "<B T>"}, r"data.corpora\[1\].tag must be one word"),
    ],
)
def test_a_bad_corpus_entry_is_refused_naming_it(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_corpora([{"name": "a"}, entry], CorpusLocation("de", "en", "/d"))


def test_an_entry_takes_the_main_corpus_settings_it_does_not_give():
    entries = [
        {"name": "bt", "data_dir": "/bt", "split": "mono", "tag": "<BT>"},
        {"name": "clean", "tgt_lang": "fr"},
    ]
    [own, inherited] = parse_corpora(entries, CorpusLocation("de", "en", "/main"))
    assert own == TrainingCorpus("bt", CorpusLocation("de", "en", "/bt", train_split="mono"), 1.0, "<BT>")
    assert inherited == TrainingCorpus("clean", CorpusLocation("de", "fr", "/main"), 1.0, None)
    assert own.source_prefix(target_lang_tags=True) == "<2en> <BT> "
    assert target_tag("fr") == "<2fr>"


def test_validation_sets_replace_the_main_validation_split_each_with_its_languages_and_tags(tmp_path):
    # main en->de without a validation split; the sets: its own domain's (en->de) and an en->fr one
    main = _write(tmp_path / "en_de", {"train": 200, "test": 10}, seed=1, langs=("en", "de"))
    fr = _write(tmp_path / "fr", {"train": 200, "dev": 7}, seed=5, langs=("en", "fr"))
    new = _write(tmp_path / "new", {"val": 9}, seed=8, langs=("en", "de"))
    corpora = [{"name": "en-de"}, {"name": "en-fr", "data_dir": str(fr), "tgt_lang": "fr"}]
    valid_sets = [
        {"name": "new", "data_dir": str(new), "tag": "<new>"},
        {"name": "fr", "data_dir": str(fr), "split": "dev", "tgt_lang": "fr"},
    ]
    args = {"src_lang": "en", "tgt_lang": "de", "corpora": corpora, "target_lang_tags": True}
    dm = _datamodule(tmp_path, data_dir=str(main), valid_sets=valid_sets, **args)
    assert dm.validation_splits == ["validation/new", "validation/fr"]
    assert dm.valid_set_names == ["new", "fr"]
    dm.setup("fit")
    assert "validation" not in dm.corpus  # not read: the sets replace it
    assert all(s.startswith("<2de> <new> ") for s in dm.source_texts("validation/new"))
    assert all(s.startswith("<2fr> ") for s in dm.source_texts("validation/fr"))
    assert dm.reference_texts("validation/fr") == [t for _, t in make_pairs(7, 6, 2, 6, period=False)]
    assert dm.reserved == ["<new>", "<2de>", "<2fr>"]
    assert [p for p in dm.src_tokenizer.pieces("<new>") if p != "\u2581"] == ["<new>"]
    loaders = dm.val_dataloader()
    served = [sorted(i for batch in loader for i in batch["ids"].tolist()) for loader in loaders]
    assert served == [list(range(9)), list(range(7))]
    with pytest.raises(ValueError, match="texts by id exist for 'validation/new', 'validation/fr', 'test'"):
        dm.source_texts("validation")
    default = _datamodule(tmp_path / "default")
    assert default.validation_splits == ["validation"] and default.valid_set_names == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "b", "splt": "dev"}, r"data.valid_sets\[1\].splt is not a setting of a validation set"),
        ({"split": "dev"}, r"data.valid_sets\[1\].name is missing"),
        ({"name": "a"}, r"data.valid_sets\[1\].name 'a' is used twice"),
        ({"name": "a/b"}, r"data.valid_sets\[1\].name 'a/b' must be letters, digits"),
        ({"name": "b", "weight": 2}, r"data.valid_sets\[1\].weight is not a setting of a validation set"),
        ({"name": "b", "tag": "<B T>"}, r"data.valid_sets\[1\].tag must be one word"),
    ],
)
def test_a_bad_validation_set_entry_is_refused_naming_it(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_valid_sets([{"name": "a"}, entry], CorpusLocation("de", "en", "/d"))


def test_a_validation_set_takes_the_main_corpus_settings_it_does_not_give():
    entries = [{"name": "old", "data_dir": "/old", "split": "dev", "tag": "<old>"}, {"name": "main"}]
    [own, inherited] = parse_valid_sets(entries, CorpusLocation("de", "en", "/main"))
    assert own == ValidationSet("old", CorpusLocation("de", "en", "/old", valid_split="dev"), "<old>")
    assert inherited == ValidationSet("main", CorpusLocation("de", "en", "/main"), None)
    assert own.split_key == "validation/old" and own.source_prefix(target_lang_tags=True) == "<2en> <old> "
    assert parse_valid_sets(None, CorpusLocation("de", "en", "/main")) == []
