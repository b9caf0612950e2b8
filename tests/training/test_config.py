"""conf/ as composed by Hydra agrees with the code: decoding defaults, and the model sizes."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from training.module import EvalDecoding
from transformer.search import DecodingConfig

CONF = Path(__file__).resolve().parents[2] / "conf"


def composed(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_conf_decoding_is_the_dataclass_defaults():
    decoding = OmegaConf.to_container(composed([]).decoding)
    defaults = asdict(EvalDecoding())
    assert decoding == defaults
    # Equal and of the same type: conf's 10 must not be 10.0, nor 1.5 an int.
    assert {k: type(v) for k, v in decoding.items()} == {k: type(v) for k, v in defaults.items()}
    # The search settings among them are the model package's, unchanged by the training module.
    assert {k: defaults[k] for k in asdict(DecodingConfig())} == asdict(DecodingConfig())
