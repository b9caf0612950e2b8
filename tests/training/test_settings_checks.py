"""What the config says is checked before anything is written or prepared (training/pipeline.py, step 1):
keys that moved, BLEU's tokenizer and its extras, and the lr and budget groups, each refusal naming
its key."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from omegaconf import open_dict

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training.moved_keys import MOVED, MovedKeyError, migrate_config, refuse_moved, split_legacy_optimizer
from training.pipeline import ConfigError, train


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return (
        write_toy_corpus(base / "corpus", {"train": 40, "val": 4, "test": 4}),
        base / "cache",
        base / "runs",
    )


def _refused_before_anything(toy, tmp_path: Path, extra: list[str], said: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=said) as err:
        train(compose_config([*toy_overrides(*toy), *extra], out))
    assert "\n" not in str(err.value)
    assert not (out / "tokenizer").exists() and not (out / "checkpoints").exists()  # nothing prepared
    assert not list(toy[1].glob("**/*.arrow"))  # no corpus read into the cache


def test_a_mistyped_bleu_tokenizer_is_refused_before_the_first_update(toy, tmp_path):
    """At dc2bd7b the run trained, then failed at its first real validation (the sanity check does
    not score), possibly hours in."""
    _refused_before_anything(
        toy, tmp_path, ["bleu_tokenize=13b"], r"bleu_tokenize=13b: BLEU's tokenizer '13b'"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("MeCab") is not None, reason="MeCab is installed (the cjk extra)"
)
def test_a_bleu_tokenizer_whose_extra_is_missing_says_what_to_install_before_the_first_update(toy, tmp_path):
    said = r'bleu_tokenize=ja-mecab: .*python3 -m pip install "sacrebleu\[ja\]".*pip install -e "\.\[cjk\]"'
    _refused_before_anything(toy, tmp_path, ["bleu_tokenize=ja-mecab"], said)


def test_a_moved_key_in_an_experiment_file_or_in_allow_changes_is_refused_naming_its_new_name(toy, tmp_path):
    """A command line is refused by train.py before Hydra (tests/test_train.py); a key Hydra merges
    from a file, or one that resume.allow_changes names, here."""
    cfg = compose_config(toy_overrides(*toy), tmp_path / "run")
    with open_dict(cfg):
        cfg.optimizer.lr = 1e-3  # as an experiment file's optimizer: {lr: 1e-3} merges it
    with pytest.raises(ConfigError, match=r"the config: optimizer\.lr is now lr\.peak"):
        train(cfg)
    said = r"resume\.allow_changes: schedule is now budget"
    _refused_before_anything(toy, tmp_path, ["resume.allow_changes=[schedule]"], said)
    with pytest.raises(MovedKeyError, match="validation.max_share is now budget.validation_share"):
        refuse_moved({"resume": {"allow_changes": ["validation.max_share"]}})


def test_every_moved_key_has_a_home_in_the_config_and_old_configs_read_under_it():
    conf = yaml.safe_load((Path(__file__).parents[2] / "conf" / "train.yaml").read_text())
    for old, new in MOVED.items():
        group, key = new.split(".")
        assert key in conf[group], new
        assert old.split(".")[1] not in (conf.get(old.split(".")[0]) or {}), old
    saved = {"optimizer": {"name": "adam", "lr": 1e-3, "min_lr_ratio": 0.1}, "schedule": {"fit": "budget"}}
    assert migrate_config(saved) == {
        "optimizer": {"name": "adam"},
        "lr": {"peak": 1e-3, "min_ratio": 0.1},
        "budget": {"fit": "budget"},
    }
    assert saved["optimizer"]["lr"] == 1e-3  # a copy
    assert split_legacy_optimizer({"name": "adamw", "lr": 2e-3, "schedule": "cosine"}) == (
        {"name": "adamw"},
        {"peak": 2e-3, "schedule": "cosine"},
    )


@pytest.mark.parametrize(
    "extra, said",
    [
        (["lr.min_ratio=1.5"], r"lr\.min_ratio must be within \[0, 1\]"),
        (["budget.fit=sometimes"], r"budget\.fit='sometimes' is not one of none, budget"),
        (["+budget.refit=1"], r"budget: unknown key\(s\) refit"),
    ],
)
def test_bad_lr_and_budget_settings_are_refused_naming_the_key(toy, tmp_path, extra, said):
    _refused_before_anything(toy, tmp_path, extra, said)
