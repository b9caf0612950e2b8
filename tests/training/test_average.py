"""``python3 -m training.average``: chosen checkpoints of one model averaged, others refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.checkpoint_fields import inference_fields
from tests.toy_text import train_word_spm
from tests.translation.test_checkpoint import SRC_TEXT, TGT_TEXT, model_for
from training.average import main
from translation.checkpoint import load_checkpoint, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def protos() -> dict[str, bytes]:
    return {"src": train_word_spm(SRC_TEXT), "tgt": train_word_spm(TGT_TEXT)}


def _checkpoint(path: Path, protos: dict[str, bytes], seed: int, **model) -> Path:
    torch.manual_seed(seed)
    net = model_for(protos["src"], protos["tgt"], **model)
    return write_checkpoint(path, net, inference_fields(protos["src"], protos["tgt"], "de", "en"))


def test_checkpoints_of_one_model_average_to_their_mean_and_translate(tmp_path, protos):
    paths = [_checkpoint(tmp_path / f"{i}.ckpt", protos, seed=i) for i in range(3)]
    assert main([*map(str, paths), "--output", str(tmp_path / "avg.ckpt")]) == 0
    states = [torch.load(p, weights_only=True)["state_dict"] for p in paths]
    averaged = torch.load(tmp_path / "avg.ckpt", weights_only=True)
    for name, tensor in averaged["state_dict"].items():
        torch.testing.assert_close(tensor, sum(s[name] for s in states) / 3)
    assert averaged["averaged_from"] == [str(p) for p in paths]
    assert load_checkpoint(tmp_path / "avg.ckpt").model.cfg == load_checkpoint(paths[0]).model.cfg


def test_another_model_or_vocabulary_is_refused_naming_the_file(tmp_path, protos, capsys):
    first = _checkpoint(tmp_path / "a.ckpt", protos, seed=0)
    wider = _checkpoint(tmp_path / "wider.ckpt", protos, seed=1, d_model=48)
    out = tmp_path / "avg.ckpt"
    assert main([str(first), str(wider), "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{wider}: model.d_model is 48" in err and "not the same model" in err and not out.exists()
    other = {"src": protos["tgt"], "tgt": protos["src"]}  # the same sizes, other words
    swapped = _checkpoint(tmp_path / "vocab.ckpt", other, seed=2)
    assert main([str(first), str(swapped), "--output", str(out)]) == 1
    assert f"{swapped}: its SentencePiece model (src_spm) differs" in capsys.readouterr().err
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    assert main([str(first), str(tmp_path / "notes.ckpt"), "--output", str(out)]) == 1
    assert f"{tmp_path / 'notes.ckpt'}: not a PyTorch checkpoint" in capsys.readouterr().err


def test_the_command_line(tmp_path, protos):
    paths = [_checkpoint(tmp_path / f"{i}.ckpt", protos, seed=i) for i in range(2)]
    proc = subprocess.run(
        [sys.executable, "-m", "training.average", *map(str, paths), "--output", str(tmp_path / "avg.ckpt")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "averaged 2 checkpoints into" in proc.stderr and (tmp_path / "avg.ckpt").is_file()
    with pytest.raises(SystemExit):
        main([str(paths[0]), "--output", str(tmp_path / "x.ckpt")])  # one checkpoint: nothing to average
