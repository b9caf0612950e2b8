"""The weights a time budget's last part averages: which updates, and the files that hold them.

A run fitted to its budget (``budget.fit: budget``) averages ``average_last`` snapshots of its
weights from the last ``budget.average_fraction`` of its forecast updates (:func:`average_points`):
at epoch ends where that many fall there, else evenly spaced updates. Each is written, when the run
reaches it, as a weights-only file beside the run's checkpoints (:func:`write_point`), so that no
checkpoint carries a copy of the model for the average, and the run's end averages the files
(:func:`training.average.average_checkpoints`) as it averages epoch checkpoints.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from data.atomic import atomic_write

# Where a point's weights go, in the run's checkpoints/: update numbers padded as the update checkpoints'.
POINT_NAME = "average-point-update{step:08d}.ckpt"


def average_points(updates: int, updates_per_epoch: int, average_last: int, fraction: float) -> list[int]:
    """The updates whose weights are averaged: ``average_last`` of them in the last ``fraction``
    of ``updates``, the last being ``updates``; at epoch ends where that many fall in the
    window, else evenly spaced (where epochs are few). Empty for fewer than 2."""
    if average_last < 2 or updates < 2:
        return []
    window = max(1, math.floor(fraction * updates))
    first = updates - window
    epoch_ends = [e for e in range(updates_per_epoch, updates + 1, updates_per_epoch) if e > first]
    if len(epoch_ends) >= average_last:
        return epoch_ends[-average_last:]
    count = min(average_last, window + 1)
    points = sorted({updates - round(i * window / max(count - 1, 1)) for i in range(count)})
    return [p for p in points if p >= 1]


def point_path(ckpt_dir: Path, step: int) -> Path:
    """The file that holds the weights of update ``step``."""
    return ckpt_dir / POINT_NAME.format(step=step)


def write_point(model: nn.Module, ckpt_dir: Path, step: int) -> Path:
    """Writes ``model``'s weights (as the training module's ``state_dict`` names them, ``model.*``)
    at update ``step``, whole or not at all; returns the file."""
    state = {
        f"model.{name}": tensor.detach().to("cpu", copy=True) for name, tensor in model.state_dict().items()
    }
    path = point_path(ckpt_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        torch.save({"state_dict": state, "global_step": step}, f)
    return path


def legacy_sum(summed: dict[str, torch.Tensor], taken: list[int], ckpt_dir: Path) -> tuple[Path, float]:
    """Writes the mean of an old checkpoint's summed weights as one file, standing for ``taken``."""
    path = ckpt_dir / f"average-points-{taken[0]:08d}-{taken[-1]:08d}.ckpt"
    mean = {f"model.{k}": (v / len(taken)).float() if v.is_floating_point() else v for k, v in summed.items()}
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": mean, "global_step": taken[-1]}, path)
    return path, float(len(taken))
