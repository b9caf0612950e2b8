"""The data: keys read into typed values: refused naming the key, defaults in one place, saved plain."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data.corpus import CorpusLocation
from data.datamodule import TranslationDataModule
from data.length_buckets import LengthBuckets
from data.settings import BatchSettings, DataSettings, config_defaults

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize("key", ["src_lang", "tgt_lang", "train_split", "valid_split", "test_split"])
def test_a_location_without_a_language_or_split_name_is_refused_naming_the_key(key: str) -> None:
    with pytest.raises(ValueError, match=rf"data\.{key} must name a language or split, not ''"):
        CorpusLocation(**{key: ""})
    with pytest.raises(ValueError, match=rf"data\.{key} must name"):
        TranslationDataModule(**{key: None})  # refused when the module is built, before any reading


def test_an_unknown_or_bad_key_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"data\.max_token is not a data setting; they are src_lang, "):
        TranslationDataModule(max_token=2048)
    with pytest.raises(ValueError, match=r"data\.bad_lines must be one of error, skip, not 'drop'"):
        DataSettings.from_config({"bad_lines": "drop"})
    with pytest.raises(ValueError, match=r"data\.length_buckets must be positive and strictly ascending"):
        DataSettings.from_config({"length_buckets": [32, 16]})
    # Hydra's own keys are not data settings, and are passed over.
    assert DataSettings.from_config({"_target_": "x", "_convert_": "all"}) == DataSettings.from_config({})


def test_each_key_lands_in_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NMT_CACHE_DIR", "/cache/root")
    settings = DataSettings.from_config(
        {"data_dir": "/d", "valid_split": "dev", "vocab_size": 100, "max_tokens": 300, "length_buckets": [8]}
    )
    assert settings.location == CorpusLocation(data_dir="/d", valid_split="dev")
    assert settings.corpora.training[0].location is settings.location  # no list: the main corpus
    assert settings.tokenizer.vocab_size == 100 and settings.tokenizer.joint_vocab
    assert settings.batches == BatchSettings(max_tokens=300, length_buckets=LengthBuckets((8,)))
    assert settings.batches.budget("train") == settings.batches.budget("test") == 300  # eval: null
    assert BatchSettings(eval_max_tokens=500).budget("validation/new") == 500
    assert settings.cache_dir == "/cache/root"  # null: $NMT_CACHE_DIR


def test_conf_data_multi30k_spells_out_the_defaults() -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(overrides=["+data=multi30k"]).data)
    assert list(cfg)[2:] == list(config_defaults())  # after _target_ and _convert_, in this order
    assert DataSettings.from_config(cfg) == DataSettings.from_config({})


def test_the_keys_are_saved_as_given_every_key_present() -> None:
    dm = TranslationDataModule(data_dir="/d", corpora=[{"name": "a"}], length_buckets=[8, 16])
    assert dict(dm.hparams) == {
        **config_defaults(),
        "data_dir": "/d",
        "corpora": [{"name": "a"}],
        "length_buckets": [8, 16],
    }
    assert dm.listed and dm.settings.corpora.training[0].location == CorpusLocation(data_dir="/d")
