"""A checkpoint's search settings (its test stage's) are what translating with it uses by default.

Training stores ``conf/train.yaml``'s ``decoding`` group in the checkpoint's hyperparameters; the
Python API, ``translate.py`` and the server search with its :class:`decoding.SearchSettings`
fields where the caller gives none, and a setting given overrides. Checked as equalities: a
checkpoint that carries settings translates as one that carries none with those settings given,
on an untrained model whose outputs the settings visibly change.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import translate
from decoding import DecodingConfig, SearchSettings
from tests.test_translate import TEST_SOURCES, lines_of, untrained_checkpoint
from translation.checkpoint import load_checkpoint
from translation.serve.__main__ import request_defaults
from translation.translator import SearchOptions, Translator

# What the tuned checkpoint's test stage searched with, beside a training-only key. A short length
# limit, so that the untrained model's outputs (which run to the limit) differ from the defaults'.
DECODING = {"beam_size": 3, "alpha": 2.0, "max_len_b": 2, "valid_beam_size": 1}
TUNED = SearchSettings(beam_size=3, alpha=2.0, max_len_b=2)
GIVEN = ["--beam-size", "3", "--length-penalty", "2.0", "--max-len-b", "2"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained checkpoint without search settings (``write_checkpoint``'s, as an export's)."""
    return untrained_checkpoint(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def tuned(plain: Path) -> Path:
    """The same weights with the hyperparameters training writes: ``decoding`` among them."""
    checkpoint = torch.load(plain, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["decoding"] = dict(DECODING)
    path = plain.with_name("tuned.ckpt")
    torch.save(checkpoint, path)
    return path


def cli(capsysbinary: pytest.CaptureFixture, *args: str) -> tuple[list[str], str]:
    """stdout lines and stderr of ``translate.py ARGS`` on TEST_SOURCES, which must succeed."""
    status = translate.main([*args, "--threads", "1", *TEST_SOURCES])
    captured = capsysbinary.readouterr()
    assert status == 0, captured.err.decode()
    return lines_of(captured.out), captured.err.decode()


def test_the_checkpoint_s_search_settings_are_read(plain: Path, tuned: Path) -> None:
    assert load_checkpoint(tuned).search == TUNED
    assert load_checkpoint(plain).search == SearchSettings()


def test_the_python_api_searches_with_the_checkpoint_s_settings(plain: Path, tuned: Path) -> None:
    torch.set_num_threads(1)
    ours, other = Translator.from_checkpoint(tuned), Translator.from_checkpoint(plain)
    assert ours.default_options() == SearchOptions(beam_size=3, alpha=2.0, max_len_b=2)
    assert other.default_options() == SearchOptions()
    by_default = ours.translate(TEST_SOURCES)
    assert by_default == other.translate(TEST_SOURCES, beam_size=3, alpha=2.0, max_len_b=2)
    assert by_default != other.translate(TEST_SOURCES)  # the settings change these outputs
    assert ours.translate(TEST_SOURCES, SearchOptions()) == other.translate(TEST_SOURCES)
    ensemble = Translator.from_checkpoints([tuned, plain])
    assert ensemble.search_settings == TUNED  # the first checkpoint's


def test_translate_py_takes_the_checkpoint_s_settings_where_no_option_is_given(
    plain: Path, tuned: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    by_default, log = cli(capsysbinary, "--checkpoint", str(tuned))
    assert by_default == cli(capsysbinary, "--checkpoint", str(plain), *GIVEN)[0]
    assert "--beam-size 3, --length-penalty 2.0, --max-len-b 2, the checkpoint's" in log
    defaults = ["--beam-size", "5", "--length-penalty", "0.6", "--max-len-b", "10"]
    overridden, log = cli(capsysbinary, "--checkpoint", str(tuned), *defaults)
    assert overridden == cli(capsysbinary, "--checkpoint", str(plain))[0] != by_default
    assert "the checkpoint's" not in log
    one_given, _ = cli(capsysbinary, "--checkpoint", str(tuned), "--length-penalty", "0.6")
    assert one_given == cli(capsysbinary, "--checkpoint", str(plain), *GIVEN[:2], *GIVEN[4:])[0]


def test_an_option_that_does_not_fit_the_checkpoint_s_beam_names_it(
    tuned: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    status = translate.main(["--checkpoint", str(tuned), "--nbest", "4", "--quiet", "ein hund"])
    err = capsysbinary.readouterr().err.decode()
    assert status == 2
    assert "--nbest 4 must be between 1 and the beam size (the checkpoint's 3: --beam-size changes it)" in err


def test_the_server_s_request_defaults_are_the_checkpoint_s_search() -> None:
    assert request_defaults(TUNED, None, False) == DecodingConfig(beam_size=3, alpha=2.0, max_len_b=2)
    assert request_defaults(TUNED, 7, False) == DecodingConfig(beam_size=7, alpha=2.0, max_len_b=2)
    assert request_defaults(SearchSettings(), None, True) == DecodingConfig(greedy=True)
    with pytest.raises(ValueError, match="beam_size must be at least 1"):
        request_defaults(TUNED, 0, False)
