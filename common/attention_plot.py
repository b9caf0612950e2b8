"""Attention weights drawn as heatmaps: which source subword each output subword looked at.

Drawing only, from tensors and labels: ``translate.py --attention-dir`` writes these as PNGs
(``translation.attention_plot``) and training logs one a validation (``training.attention_image``).

Uses matplotlib's object-oriented API with the Agg canvas (no pyplot, no GUI, no global backend
switch), so it works on servers and leaves the caller's matplotlib settings alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

CELL_INCHES = 0.32  # size of one (output, source) cell
MAX_INCHES = 40.0  # cap on a figure's width and height, so that very long sentences stay plottable
DPI = 100


def _draw(ax: Axes, weights: Tensor, src_labels: list[str], out_labels: list[str], title: str) -> object:
    """One heatmap: rows are output subwords, columns source subwords."""
    image = ax.imshow(
        weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
    )
    ax.set_xticks(range(len(src_labels)), src_labels, rotation=90, fontsize=8)
    ax.set_yticks(range(len(out_labels)), out_labels, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    ax.set_title(title, fontsize=9)
    return image


def _check(weights: Tensor, src_labels: list[str], out_labels: list[str]) -> None:
    if tuple(weights.shape[-2:]) != (len(out_labels), len(src_labels)):
        raise ValueError(
            f"weights are {tuple(weights.shape[-2:])} (output x source) but there are "
            f"{len(out_labels)} output and {len(src_labels)} source labels"
        )


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def _inches(n: int, extra: float) -> float:
    return min(MAX_INCHES, max(3.0, n * CELL_INCHES) + extra)


def plot_attention(
    weights: Tensor, src_labels: list[str], out_labels: list[str], title: str, path: str | Path
) -> Path:
    """Write one heatmap as a PNG.

    Args:
        weights: [out_len, src_len] attention of each output subword over the source (rows sum to 1).
        src_labels: ``src_len`` source pieces (``</s>`` included).
        out_labels: ``out_len`` output pieces (``</s>`` included).
        title: shown above the plot.
        path: the PNG to write (its directory is created).

    Returns:
        ``path``.
    """
    return _save(attention_figure(weights, src_labels, out_labels, title), Path(path))


def attention_figure(weights: Tensor, src_labels: list[str], out_labels: list[str], title: str) -> Figure:
    """One heatmap with its colour bar, as a Figure (arguments as :func:`plot_attention`'s)."""
    _check(weights, src_labels, out_labels)
    fig = Figure(figsize=(_inches(len(src_labels), 2.5), _inches(len(out_labels), 2.0)), layout="constrained")
    ax = fig.add_subplot()
    fig.colorbar(_draw(ax, weights, src_labels, out_labels, title), ax=ax, shrink=0.8)
    return fig


def figure_pixels(fig: Figure) -> np.ndarray:
    """``fig`` rendered: [height, width, 3] uint8 RGB, as image loggers take it."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(DPI)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def plot_attention_heads(
    weights: Tensor, src_labels: list[str], out_labels: list[str], title: str, path: str | Path
) -> Path:
    """Write every head of one layer as a grid of heatmaps in one PNG.

    Args:
        weights: [heads, out_len, src_len].
        src_labels, out_labels, title, path: as in :func:`plot_attention`.

    Returns:
        ``path``.
    """
    _check(weights, src_labels, out_labels)
    heads = weights.size(0)
    cols = min(heads, 4)
    rows = math.ceil(heads / cols)
    width = min(MAX_INCHES, cols * _inches(len(src_labels), 1.5))
    height = min(MAX_INCHES, rows * _inches(len(out_labels), 1.5))
    fig = Figure(figsize=(width, height), layout="constrained")
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for h, ax in enumerate(axes.flat):
        if h < heads:
            image = _draw(ax, weights[h], src_labels, out_labels, f"head {h}")
        else:
            ax.set_axis_off()
    fig.colorbar(image, ax=axes, shrink=0.6)
    return _save(fig, Path(path))


def plot_cross_attention(
    weights: list[Tensor],
    src_labels: list[str],
    out_labels: list[str],
    out_dir: str | Path,
    stem: str,
    per_head: bool = False,
) -> list[Path]:
    """Write one sentence's cross-attention: per layer, heads averaged, and per head on request.

    Files are ``{stem}.layer{L}.png`` (heads averaged) and, with ``per_head``,
    ``{stem}.layer{L}.heads.png`` (a grid of the layer's heads), layers counted from 1.

    Args:
        weights: per decoder layer, [heads, out_len, src_len].
        src_labels: ``src_len`` source pieces.
        out_labels: ``out_len`` output pieces.
        out_dir: where the PNGs go (created).
        stem: file name prefix, e.g. ``"line0007"``; also the plots' title.
        per_head: also write the per-head grids.

    Returns:
        The paths written.
    """
    out_dir = Path(out_dir)
    paths = []
    for layer, w in enumerate(weights, start=1):
        title = f"{stem}, layer {layer} of {len(weights)}"
        paths.append(
            plot_attention(
                w.mean(dim=0),
                src_labels,
                out_labels,
                f"{title}, heads averaged",
                out_dir / f"{stem}.layer{layer}.png",
            )
        )
        if per_head:
            paths.append(
                plot_attention_heads(
                    w, src_labels, out_labels, title, out_dir / f"{stem}.layer{layer}.heads.png"
                )
            )
    return paths
