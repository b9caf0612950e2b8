"""Attention heatmaps drawn from weights: the files are written, readable PNGs, sized by the sentence."""

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
