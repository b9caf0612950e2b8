"""The model card: what the checkpoint and its run know, placeholders for the rest."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from translation.checkpoint import load_checkpoint
from translation.export.__main__ import usage
from translation.export.card import CardFacts, card_facts, model_card


def copy_into_run(checkpoint: Path, run: Path, name: str, datamodule: dict | None = None) -> Path:
    """``checkpoint`` as ``run/checkpoints/<name>.ckpt``, optionally with data-module hyperparameters."""
    contents = torch.load(checkpoint, weights_only=True)
    if datamodule is not None:
        contents["datamodule_hyper_parameters"] = datamodule
    path = run / "checkpoints" / f"{name}.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(contents, path)
    return path


def test_scores_are_taken_from_the_run_only_for_the_tested_checkpoint(
    toy_checkpoints, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    multi30k = {"hub_id": None, "data_dir": None, "test_split": "test_2016_flickr"}
    averaged = copy_into_run(toy_checkpoints["joint"], run, "averaged", multi30k)
    last = copy_into_run(toy_checkpoints["joint"], run, "last")
    (run / "config.yaml").write_text("name: toy\ntest_ckpt: averaged\n")
    (run / "results.json").write_text(json.dumps({"test/bleu": 39.614, "test/chrf": 59.13, "val/bleu": 1.0}))

    facts = card_facts(averaged)
    assert facts.scores == {"BLEU": 39.614, "chrF": 59.13} and facts.test_set == "test_2016_flickr"
    assert facts.multi30k and "Multi30k" in facts.data
    card = model_card(load_checkpoint(averaged), facts, "huggingface", "print('usage')")
    assert card.startswith("---\nlanguage:\n- de\n- en\n")
    assert "| test_2016_flickr | 39.61 | 59.13 |" in card
    assert "non-commercial research" in card and "bentrevett/multi30k" in card
    assert "print('usage')" in card and "<fill in" not in card

    assert card_facts(last).scores == {}  # results.json is the averaged checkpoint's


def test_what_is_unknown_is_left_to_fill_in(toy_checkpoints) -> None:
    facts = card_facts(toy_checkpoints["separate"])  # no run around it, no data-module entry
    assert facts == CardFacts()
    card = model_card(load_checkpoint(toy_checkpoints["separate"]), facts, "ctranslate2", "", "int8")
    assert "| <fill in> | <fill in> | <fill in> |" in card
    assert "license: <fill in>" in card and "library_name: ctranslate2" in card
    assert "Weights stored as int8" in card and "SentencePiece vocabularies of" in card


def test_the_card_and_the_snippets_give_the_checkpoints_search(toy_checkpoints, tmp_path: Path) -> None:
    """A run's test figures come from its own search (the Multi30k de→en recipe's length penalty is
    2.5): the card names it, not the project's defaults, and the snippets use its beam size."""
    contents = torch.load(toy_checkpoints["joint"], weights_only=True)
    contents["hyper_parameters"]["decoding"] = {"beam_size": 3, "alpha": 2.5, "max_len_b": 7}
    path = tmp_path / "searched.ckpt"
    torch.save(contents, path)
    checkpoint = load_checkpoint(path)
    facts = CardFacts(scores={"BLEU": 41.99}, test_set="test_2016_flickr")
    for fmt, call in (("ctranslate2", "beam_size=3)"), ("huggingface", "num_beams=3)")):
        snippet = usage(fmt, checkpoint, "out")
        card = model_card(checkpoint, facts, fmt, snippet)
        assert call in snippet and "beam_size=5" not in snippet and "num_beams=5" not in snippet
        assert "beam 3, GNMT length penalty 2.5" in card and "+ 7 output pieces" in card
        assert "beam 5" not in card

    defaults = model_card(load_checkpoint(toy_checkpoints["joint"]), facts, "ctranslate2", "")
    assert "beam 5, GNMT length penalty 0.6" in defaults  # no search carried: translate.py's defaults
