"""The one reader of the project's checkpoint files, for training, translation and averaging.

Every program that opens a checkpoint (a resumed or fine-tuned run, the test stage's weights,
``translate.py``, the exporters, ``python3 -m training.average``) reads it here, once, and gets
either the dict (``torch.load(weights_only=True)``, memory-mapped on the CPU: tensors are read
when used, so a training checkpoint's optimizer state costs nothing until it is) or a
:class:`CheckpointError` whose one-line message starts with the file's path and says what is wrong.

What a caller needs of the file is said with ``needs``: :data:`WEIGHTS` (any checkpoint, an
averaged one included), :data:`INFERENCE` (weights and the ``"nmt"`` entry translating needs:
:mod:`common.checkpoint_fields`) or :data:`TRAINING` (weights and the loop state a run resumes).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import torch

# What a caller needs of a checkpoint: the entries that must be there.
WEIGHTS = ("state_dict",)
INFERENCE = ("state_dict", "nmt")
TRAINING = ("state_dict", "global_step", "loops")

# The entries that make a training state (a resumed run's), said together when one is missing.
_TRAINING_STATE = ("global_step", "loops")


class CheckpointError(ValueError):
    """A file that is not a usable checkpoint of this project; the message is one line naming it."""


def _check_file(path: Path) -> None:
    """Refuses a path that is no readable zip archive written by ``torch.save``."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror})") from None
    if magic != b"PK\x03\x04":  # torch.save writes a zip archive
        size = path.stat().st_size
        raise CheckpointError(
            f"{path}: not a PyTorch checkpoint ({size} bytes, not a file written by torch.save: empty, "
            "or another kind of file)"
        )
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path}: truncated or corrupted (the zip archive written by torch.save is incomplete)"
        )


def read_checkpoint(path: str | os.PathLike, needs: tuple[str, ...] = WEIGHTS) -> dict[str, Any]:
    """The checkpoint at ``path``, memory-mapped on the CPU, checked to hold ``needs``.

    Args:
        path: the file.
        needs: the entries the caller uses (:data:`WEIGHTS`, :data:`INFERENCE`, :data:`TRAINING`).

    Raises:
        CheckpointError: missing, unreadable, truncated or foreign file, or one without an entry
            of ``needs``; the message is one line starting with the path.
    """
    path = Path(path)
    _check_file(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, ... with long texts
        if "Weights only load failed" in str(err):
            raise CheckpointError(
                f"{path}: holds Python objects that weights_only=True refuses to load "
                "(not a checkpoint of this project)"
            ) from None
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CheckpointError(f"{path}: cannot be loaded by torch.load ({first_line})") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path}: holds a {type(checkpoint).__name__}, not a checkpoint dict")
    missing = [key for key in needs if key not in checkpoint]
    foreign = [key for key in missing if key not in _TRAINING_STATE]
    if foreign:
        raise CheckpointError(
            f"{path}: not a checkpoint of this project (no {' or '.join(repr(k) for k in foreign)} entry)"
        )
    if missing:
        raise CheckpointError(
            f"{path}: holds no training state to resume from (no global_step or loops: an averaged "
            "checkpoint holds weights only)"
        )
    return checkpoint
