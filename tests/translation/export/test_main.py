"""The export command line without the extras: its one-line errors and exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from common.checkpoint_fields import inference_fields
from data.tokenizer import SubwordTokenizer
from tests.toy_text import toy_pairs, train_word_spm
from tests.transformer.helpers import tiny_model
from translation.checkpoint import write_checkpoint
from translation.export.__main__ import INSTALL, main


@pytest.mark.parametrize(
    ("fmt", "package"), [("ctranslate2", "ctranslate2"), ("huggingface", "transformers")]
)
def test_a_missing_extra_says_how_to_install_it(
    fmt: str,
    package: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now raises ImportError
    # The checkpoint does not exist: the extra is checked before it is read.
    argv = ["--checkpoint", str(tmp_path / "none.ckpt"), "--format", fmt, "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and package in err and INSTALL in err
    assert INSTALL == 'python3 -m pip install -e ".[export]"'
    assert not (tmp_path / "out").exists()


def test_an_existing_output_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    argv = ["--checkpoint", str(tmp_path / "none.ckpt"), "--format", "ctranslate2", "--output", str(out)]
    assert main(argv) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"


def test_bad_checkpoint_and_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("translation.export.__main__.check_extra", lambda fmt: None)
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    argv = [
        "--checkpoint",
        str(tmp_path / "bad.ckpt"),
        "--format",
        "ctranslate2",
        "--output",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: checkpoint" in err and "not a PyTorch checkpoint" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", "x", "--format", "huggingface", "--output", "o", "--quantization", "int8"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("fmt", ["ctranslate2", "huggingface"])
def test_a_non_softmax_checkpoint_is_refused_in_one_line(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("translation.export.__main__.check_extra", lambda fmt: None)
    proto = train_word_spm([s for s, _ in toy_pairs(20, seed=0)])
    size = SubwordTokenizer(proto).vocab_size
    model = tiny_model(
        src_vocab_size=size, tgt_vocab_size=size, attention={"encoder_self": "performer", "features": 8}
    )
    path = write_checkpoint(tmp_path / "performer.ckpt", model, inference_fields(proto, None, "de", "en"))
    assert main(["--checkpoint", str(path), "--format", fmt, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "encoder_self=performer" in err and "softmax only" in err
    assert not (tmp_path / "o").exists()
