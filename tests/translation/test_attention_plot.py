"""Attention heatmaps: the files are written, readable PNGs, sized by the sentence."""

from __future__ import annotations

import struct
from pathlib import Path

import matplotlib
import pytest
import torch

from common.attention_plot import plot_attention, plot_cross_attention

SRC = ["▁ein", "▁hund", "▁läuft", "</s>"]
OUT = ["▁a", "▁dog", "▁runs", "</s>"]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def fake_weights(layers: int, heads: int, out_len: int, src_len: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(heads, out_len, src_len, generator=g).softmax(dim=-1) for _ in range(layers)]


def test_one_png_per_layer_and_per_head_grids(tmp_path: Path) -> None:
    backend = matplotlib.get_backend()
    weights = fake_weights(layers=2, heads=4, out_len=len(OUT), src_len=len(SRC))
    paths = plot_cross_attention(weights, SRC, OUT, tmp_path / "attn", "line07", per_head=True)
    assert [p.name for p in paths] == [
        "line07.layer1.png",
        "line07.layer1.heads.png",
        "line07.layer2.png",
        "line07.layer2.heads.png",
    ]
    averaged, grid = png_size(paths[0]), png_size(paths[1])
    assert grid[0] > 2 * averaged[0]  # four panels side by side
    assert matplotlib.get_backend() == backend  # no global backend switch


def test_heads_averaged_only_by_default(tmp_path: Path) -> None:
    paths = plot_cross_attention(fake_weights(1, 2, len(OUT), len(SRC)), SRC, OUT, tmp_path, "s")
    assert [p.name for p in paths] == ["s.layer1.png"]


def test_long_sentences_make_bigger_but_bounded_figures(tmp_path: Path) -> None:
    (short,) = fake_weights(1, 1, 4, 4)
    (long,) = fake_weights(1, 1, 30, 150)
    small = png_size(plot_attention(short[0], SRC, OUT, "short", tmp_path / "short.png"))
    big = png_size(
        plot_attention(
            long[0],
            [f"s{i}" for i in range(150)],
            [f"o{i}" for i in range(30)],
            "long",
            tmp_path / "long.png",
        )
    )
    assert big[0] > small[0] and big[1] > small[1]
    assert max(big) <= 40 * 100  # MAX_INCHES at 100 dpi


def test_labels_must_match_the_weights(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="4 output and 3 source labels"):
        plot_attention(torch.rand(4, 4), SRC[:3], OUT, "bad", tmp_path / "bad.png")


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


@pytest.mark.parametrize("attention", list(CHECKPOINTS.values()), ids=list(CHECKPOINTS))
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


def test_translate_py_writes_the_attention_of_a_checkpoint_with_other_attention(
    tmp_path: Path, protos: dict[str, bytes]
) -> None:
    from tests.test_translate import run_cli

    path = _checkpoint(CHECKPOINTS["lsh"] | {"cross": "linear"}, tmp_path / "lsh.ckpt", protos)
    result = run_cli("--checkpoint", str(path), "--attention-dir", str(tmp_path / "attn"), "ein hund läuft")
    assert result.returncode == 0, result.stderr.decode()
    names = sorted(p.name for p in (tmp_path / "attn").iterdir())
    assert names == [f"line1.{part}layer{i}.png" for part in ("encoder.", "") for i in (1, 2)]
