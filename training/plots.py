"""The learning-curve picture of a run, from Lightning's CSV metrics log."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _series(rows: list[dict[str, str]], x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        if row.get(y_key) not in (None, "") and row.get(x_key) not in (None, ""):
            xs.append(float(row[x_key]))
            ys.append(float(row[y_key]))
    return xs, ys


def validation_curves(rows: list[dict[str, str]]) -> list[tuple[str, str]]:
    """``(metric prefix, legend label)`` of each validation set the log holds: ``("val/", "")`` for
    the main validation split, ``("val/<name>/", " <name>")`` for each of ``data.valid_sets``."""
    columns = rows[0].keys() if rows else []
    names = sorted(m.group(1) for c in columns if (m := re.fullmatch(r"val/(.+)/loss", c)))
    return [(f"val/{name}/", f" {name}") for name in names] or [("val/", "")]


def plot_learning_curve(metrics_csv: str | Path, output: str | Path, title: str = "") -> Path:
    """Training loss per step, validation loss and BLEU per epoch (one curve per validation set),
    in one PNG.

    Args:
        metrics_csv: ``metrics.csv`` written by ``lightning.pytorch.loggers.CSVLogger``.
        output: the PNG to write.
        title: figure title, e.g. the run's name.
    """
    with open(metrics_csv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(*_series(rows, "step", "train/loss"), label="train (label-smoothed)", alpha=0.7)
    for prefix, label in validation_curves(rows):
        ax_loss.plot(*_series(rows, "step", prefix + "loss"), "o-", label=f"validation{label} (NLL)")
        epochs, bleu = _series(rows, "epoch", prefix + "bleu")
        ax_bleu.plot([e + 1 for e in epochs], bleu, "o-", label=f"validation{label} BLEU (greedy)")
    ax_loss.set_xlabel("optimizer step")
    ax_loss.set_ylabel("loss per target token")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    ax_bleu.set_xlabel("epoch")
    ax_bleu.set_ylabel("sacreBLEU")
    ax_bleu.legend()
    ax_bleu.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    output = Path(output)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output
