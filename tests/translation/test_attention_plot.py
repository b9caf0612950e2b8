"""Attention heatmaps of a translator's chosen lines: every mechanism's weights, and translate.py's files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.common.test_attention_plot import png_size

# Every mechanism in some role of a tiny checkpoint: cross-attention from softmax, linear, Performer,
# Linformer; encoder self-attention (drawn too, as it is not softmax) from all but softmax.
CHECKPOINTS = {
    "linear": dict(encoder_self="linear", cross="linear"),
    "performer": dict(encoder_self="performer", cross="performer", features=8),
    "local": dict(encoder_self="local", window=2),
    "atrous": dict(encoder_self="atrous", window=2, dilation=2),
    "sparse": dict(encoder_self="sparse", window=2, stride=2),
    "lsh": dict(encoder_self="lsh", decoder_self="lsh", buckets=2, rounds=2, chunk_length=2),
    "linformer": dict(encoder_self="linformer", cross="linformer", projected_length=3, max_length=16),
    "nystrom": dict(encoder_self="nystrom", landmarks=2),
}


@pytest.fixture(scope="module")
def protos() -> dict[str, bytes]:
    from tests.toy_text import train_word_spm
    from tests.translation.test_checkpoint import SRC_TEXT, TGT_TEXT

    return {"src": train_word_spm(SRC_TEXT), "tgt": train_word_spm(TGT_TEXT)}


def _checkpoint(attention: dict, path: Path, protos: dict[str, bytes]) -> Path:
    from common.checkpoint_fields import inference_fields
    from tests.translation.test_checkpoint import model_for
    from translation.checkpoint import write_checkpoint

    model = model_for(protos["src"], protos["tgt"], attention=attention)
    return write_checkpoint(path, model, inference_fields(protos["src"], protos["tgt"], "de", "en"))


# Linear attention in the first tier; every other mechanism in the second (python3 -m pytest -m slow).
@pytest.mark.parametrize(
    "attention",
    [pytest.param(a, id=n, marks=() if n == "linear" else pytest.mark.slow) for n, a in CHECKPOINTS.items()],
)
def test_every_mechanism_draws_the_weights_it_implies(
    attention: dict, tmp_path: Path, protos: dict[str, bytes]
) -> None:
    from translation import SearchOptions, Translator
    from translation.attention_plot import write_attention

    translator = Translator.from_checkpoint(_checkpoint(attention, tmp_path / "m.ckpt", protos), "cpu")
    sources = translator.encode_sources(["ein hund läuft", "der hund"])
    results = translator.translate_ids(sources, SearchOptions(beam_size=2))
    written = write_attention(translator, sources, results, str(tmp_path / "attn"), True, 2)
    layers = translator.model.cfg.n_encoder_layers
    names = sorted(p.name for p in (tmp_path / "attn").iterdir())
    assert written == len(names) == 2 * 2 * (translator.model.cfg.n_decoder_layers + layers)
    assert "line1.encoder.layer1.png" in names and "line2.encoder.layer1.heads.png" in names
    for name in names:
        png_size(tmp_path / "attn" / name)
    encoder = translator.encoder_attention(sources[0])[0]
    n = len(sources[0]) + 1
    assert encoder.shape == (translator.model.cfg.n_heads, n, n) and torch.isfinite(encoder).all()
    if attention["encoder_self"] in ("local", "atrous", "sparse", "lsh"):  # a pattern of softmax rows
        torch.testing.assert_close(encoder.sum(-1), torch.ones(translator.model.cfg.n_heads, n))


@pytest.mark.slow  # a translate.py process
def test_translate_py_writes_the_attention_of_a_checkpoint_with_other_attention(
    tmp_path: Path, protos: dict[str, bytes]
) -> None:
    from tests.test_translate import run_cli

    path = _checkpoint(CHECKPOINTS["lsh"] | {"cross": "linear"}, tmp_path / "lsh.ckpt", protos)
    result = run_cli("--checkpoint", str(path), "--attention-dir", str(tmp_path / "attn"), "ein hund läuft")
    assert result.returncode == 0, result.stderr.decode()
    names = sorted(p.name for p in (tmp_path / "attn").iterdir())
    assert names == [f"line1.{part}layer{i}.png" for part in ("encoder.", "") for i in (1, 2)]
