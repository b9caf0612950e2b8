"""The CTranslate2 export: a model directory whose greedy outputs are ours, with real pieces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece as spm

from tests.translation.export.conftest import TEXTS, export_with_tags, output_limit
from translation import Translator
from translation.export.__main__ import main

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason='needs the export extra: python3 -m pip install -e ".[export]"'
)
pytestmark = pytest.mark.ctranslate2


@pytest.fixture(scope="module")
def exports(toy_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"joint": dir, "separate": dir, "joint int8": dir}``, written by the command line."""
    out = tmp_path_factory.mktemp("ct2")
    dirs = {}
    for name, quantization in (("joint", None), ("separate", None), ("joint int8", "int8")):
        path = toy_checkpoints[name.split()[0]]
        dirs[name] = out / name.replace(" ", "_")
        argv = ["--checkpoint", str(path), "--format", "ctranslate2", "--output", str(dirs[name])]
        assert main(argv + (["--quantization", quantization] if quantization else [])) == 0
    return dirs


def ct2_greedy(model_dir: Path, texts: list[str], a: float = 1.5, b: int = 10) -> list[str]:
    """Greedy translations as a user runs the export: SentencePiece pieces in, pieces out."""
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    source = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
    target = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
    outputs = []
    for text in texts:
        pieces = source.encode(text, out_type=str)
        if not pieces:  # as translate.py: an empty line stays empty, the model never sees it
            outputs.append("")
            continue
        limit = output_limit(len(pieces), a, b)
        # min_decoding_length=0: ours may end at once with EOS (CTranslate2's default is 1).
        result = translator.translate_batch(
            [pieces], beam_size=1, max_decoding_length=limit, min_decoding_length=0
        )
        outputs.append(target.decode(result[0].hypotheses[0]))
    return outputs


@pytest.mark.parametrize("name", ["joint", "separate"])
def test_greedy_outputs_equal_ours(name: str, toy_checkpoints: dict[str, Path], exports: dict) -> None:
    ours = Translator.from_checkpoint(toy_checkpoints[name])
    assert ct2_greedy(exports[name], TEXTS) == ours.translate(TEXTS, greedy=True)
    # A limit of 2 tokens: most outputs stop at the limit instead of at EOS.
    short = ours.translate(TEXTS, greedy=True, max_len_a=0.0, max_len_b=2)
    assert ct2_greedy(exports[name], TEXTS, a=0.0, b=2) == short
    assert sum(len(s.split()) == 2 for s in short) >= 3


def test_vocabulary_is_the_sentencepiece_pieces(toy_checkpoints: dict[str, Path], exports: dict) -> None:
    joint = exports["joint"]
    pieces = json.loads((joint / "shared_vocabulary.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(joint / "source.spm"))
    assert pieces == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    assert pieces[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    separate = exports["separate"]
    assert not (separate / "shared_vocabulary.json").exists()
    for side, spm_file in (("source", "source.spm"), ("target", "target.spm")):
        sp = spm.SentencePieceProcessor(model_file=str(separate / spm_file))
        vocabulary = json.loads((separate / f"{side}_vocabulary.json").read_text())
        assert vocabulary == [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    assert {"README.md", "config.json", "model.bin"} <= {p.name for p in joint.iterdir()}


def test_int8_export_is_smaller_and_translates_every_line(exports: dict) -> None:
    int8, fp32 = exports["joint int8"], exports["joint"]
    assert (int8 / "model.bin").stat().st_size < 0.6 * (fp32 / "model.bin").stat().st_size
    outputs = ct2_greedy(int8, TEXTS)
    assert len(outputs) == len(TEXTS) and outputs[TEXTS.index("")] == ""
    assert "int8" in (int8 / "README.md").read_text()


def test_a_multilingual_export_keeps_its_tags_and_translates_into_each_language(
    multilingual_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "en_defr"
    tags, texts, expected = export_with_tags(multilingual_checkpoint, "ctranslate2", out)
    for lang, tag in tags.items():
        assert ct2_greedy(out, [f"{tag} {t}" for t in texts]) == expected[lang]
