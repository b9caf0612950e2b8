"""conf/ as composed by Hydra agrees with the code: decoding defaults, model sizes, experiment files."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from decoding.config import SearchSettings as DecodingConfig
from training.module import EvalDecoding

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


# d_model, n_heads, encoder and decoder layers, d_ff, max_positions, dropout of each size.
SIZES = {
    "tiny": (64, 4, 2, 2, 128, 256, 0.1),
    "small": (256, 4, 3, 3, 1024, 512, 0.1),
    "base": (512, 8, 6, 6, 2048, 1024, 0.1),
    "big": (1024, 16, 6, 6, 4096, 1024, 0.3),
}
DIMENSIONS = (
    "d_model",
    "n_heads",
    "n_encoder_layers",
    "n_decoder_layers",
    "d_ff",
    "max_positions",
    "dropout",
)


@pytest.mark.parametrize("size", SIZES)
def test_each_model_size_has_its_dimensions_and_every_key(size):
    model = OmegaConf.to_container(composed([f"model={size}"]).model)
    assert tuple(model[k] for k in DIMENSIONS) == SIZES[size]
    # Every size spells out every key of the base config, the rest unchanged from it.
    base = OmegaConf.to_container(composed(["model=base"]).model)
    assert list(model) == list(base)
    assert {k: v for k, v in model.items() if k not in DIMENSIONS} == {
        k: v for k, v in base.items() if k not in DIMENSIONS
    }


def test_the_multi30k_experiments_differ_in_name_language_pair_and_length_penalty_only():
    de_en, en_de = (
        OmegaConf.to_container(composed([f"experiment={e}"])) for e in ("multi30k_de_en", "multi30k_en_de")
    )
    assert (de_en["data"]["src_lang"], de_en["data"]["tgt_lang"], de_en["name"]) == (
        "de",
        "en",
        "multi30k_de_en",
    )
    assert (en_de["data"]["src_lang"], en_de["data"]["tgt_lang"], en_de["name"]) == (
        "en",
        "de",
        "multi30k_en_de",
    )
    for cfg in (de_en, en_de):
        del cfg["name"], cfg["data"]["src_lang"], cfg["data"]["tgt_lang"]
    # The length penalty was chosen on each direction's validation (BENCHMARKS.md, "Length penalty").
    assert (de_en["decoding"].pop("alpha"), en_de["decoding"].pop("alpha")) == (2.5, 2.0)
    assert de_en == en_de


@pytest.mark.parametrize("path", sorted((CONF / "experiment").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_experiment_starts_with_the_command_that_runs_it(path):
    # Hydra reads "# @package" only before any other line, so the command comes right after it,
    # with the settings the experiment leaves to the command line (``???``) where it has some.
    package, command = path.read_text().splitlines()[:2]
    assert package == "# @package _global_"
    assert command == f"# python train.py experiment={path.stem}" or command.startswith(
        f"# python train.py experiment={path.stem} "
    )
