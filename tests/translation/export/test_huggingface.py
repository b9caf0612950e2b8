"""The Hugging Face export: a Marian folder that transformers loads alone, greedy outputs ours."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.checkpoint_fields import inference_fields
from tests.transformer.helpers import tiny_model
from tests.translation.export.conftest import TEXTS, export_with_tags, output_limit
from transformer.embeddings import sinusoidal_table
from translation import Translator
from translation.checkpoint import load_checkpoint, write_checkpoint
from translation.export.__main__ import main
from translation.export.huggingface import marian_permutation, to_marian

transformers = pytest.importorskip(
    "transformers", reason='needs the export extra: python3 -m pip install -e ".[export]"'
)
# MarianTokenizer recommends sacremoses for a normalizer it does not apply when tokenizing.
pytestmark = [
    pytest.mark.transformers,
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]

EXPECTED_FILES = {
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "source.spm",
    "target.spm",
    "tokenizer_config.json",
    "vocab.json",
}


@pytest.fixture(scope="module")
def exports(toy_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"joint": dir, "separate": dir}``, written by the command line."""
    out = tmp_path_factory.mktemp("hf")
    for name, path in toy_checkpoints.items():
        assert main(["--checkpoint", str(path), "--format", "huggingface", "--output", str(out / name)]) == 0
    return {name: out / name for name in toy_checkpoints}


def hf_greedy(model_dir: Path, texts: list[str], a: float = 1.5, b: int = 10) -> tuple[list[str], list]:
    """Greedy translations and input ids, with nothing of ours: from_pretrained, generate, decode."""
    tokenizer = transformers.MarianTokenizer.from_pretrained(model_dir)
    model = transformers.MarianMTModel.from_pretrained(model_dir)
    outputs, inputs = [], []
    for text in texts:
        batch = tokenizer([text], return_tensors="pt")
        inputs.append(batch["input_ids"][0].tolist())
        if batch["input_ids"].size(1) == 1:  # </s> alone: as translate.py, an empty line stays empty
            outputs.append("")
            continue
        # max_length counts the decoder's start token: our limit + 1.
        limit = output_limit(batch["input_ids"].size(1) - 1, a, b)
        generated = model.generate(**batch, num_beams=1, do_sample=False, max_length=limit + 1)
        outputs.append(tokenizer.decode(generated[0], skip_special_tokens=True))
    return outputs, inputs


@pytest.mark.parametrize("name", ["joint", "separate"])
def test_greedy_outputs_and_inputs_equal_ours(name: str, toy_checkpoints: dict, exports: dict) -> None:
    assert {p.name for p in exports[name].iterdir()} == EXPECTED_FILES | (
        {"target_vocab.json"} if name == "separate" else set()
    )
    ours = Translator.from_checkpoint(toy_checkpoints[name])
    outputs, inputs = hf_greedy(exports[name], TEXTS)
    assert inputs == [ids + [ours.eos_id] for ids in ours.encode_sources(TEXTS)]
    assert outputs == ours.translate(TEXTS, greedy=True)
    short, _ = hf_greedy(exports[name], TEXTS, a=0.0, b=2)
    assert short == ours.translate(TEXTS, greedy=True, max_len_a=0.0, max_len_b=2)


def test_marian_table_is_ours_permuted() -> None:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = MarianSinusoidalPositionalEmbedding(50, 16).create_weight()
    torch.testing.assert_close(marian, sinusoidal_table(50, 16)[:, marian_permutation(16)])


@pytest.mark.parametrize(("share", "tie"), [(True, True), (True, False), (False, True), (False, False)])
def test_to_marian_computes_our_function(share: bool, tie: bool) -> None:
    torch.manual_seed(0)
    model = tiny_model(
        src_vocab_size=41, tgt_vocab_size=41 if share else 37, share_embeddings=share, tie_output=tie
    )
    hf = to_marian(model, bos_id=2, eos_id=3)
    src = torch.tensor([[5, 9, 12, 3], [7, 3, 0, 0]])  # (2, 4), right-padded
    tgt_in = torch.tensor([[2, 6, 8], [2, 11, 4]])
    with torch.no_grad():
        ours = model(src, tgt_in)
        theirs = hf(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=tgt_in).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def test_pre_ln_model_is_refused_in_one_line(
    toy_checkpoints: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    joint = load_checkpoint(toy_checkpoints["joint"])
    proto = joint.src_tokenizer.model_proto
    size = joint.src_tokenizer.vocab_size
    model = tiny_model(norm_first=True, src_vocab_size=size, tgt_vocab_size=size, share_embeddings=True)
    path = write_checkpoint(tmp_path / "pre_ln.ckpt", model, inference_fields(proto, None, "de", "en"))
    argv = ["--checkpoint", str(path), "--format", "huggingface", "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "post-LN" in err and "--format ctranslate2" in err
    assert not (tmp_path / "out").exists()


def test_a_multilingual_export_keeps_its_tags_and_translates_into_each_language(
    multilingual_checkpoint: Path, tmp_path: Path
) -> None:
    """Each tag before a source translates into its language as ours does, through generate()."""
    out = tmp_path / "en_defr"
    tags, texts, expected = export_with_tags(multilingual_checkpoint, "huggingface", out)
    for lang, tag in tags.items():
        assert hf_greedy(out, [f"{tag} {t}" for t in texts])[0] == expected[lang]


def test_generate_searches_with_the_checkpoints_beam(toy_checkpoints: dict, tmp_path: Path) -> None:
    """generate()'s default beam is the checkpoint's (its test stage's), not the project's 5."""
    contents = torch.load(toy_checkpoints["joint"], weights_only=True)
    contents["hyper_parameters"]["decoding"] = {"beam_size": 3, "alpha": 2.5}
    path = tmp_path / "searched.ckpt"
    torch.save(contents, path)
    out = tmp_path / "out"
    assert main(["--checkpoint", str(path), "--format", "huggingface", "--output", str(out)]) == 0
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert generation.num_beams == 3
    assert "beam 3, GNMT length penalty 2.5" in (out / "README.md").read_text()
