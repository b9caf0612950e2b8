"""How the Trainer writes and reads checkpoint files.

Lightning's own writer goes through fsspec; :class:`AtomicCheckpointIO` writes every ``best``,
``last`` and ``epoch*`` checkpoint with :func:`data.atomic.atomic_write` (whole files or none), as
the averaged checkpoint and the tokenizer cache are written. Reading, it hands Lightning the
checkpoint the run's start point already read (:mod:`training.start`) rather than reading the file
a second time; any other file goes through the project's one reader
(:func:`common.checkpoint_file.read_checkpoint`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from common.checkpoint_file import read_checkpoint
from data.atomic import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer and reader, atomic on writing, reading each file once.

    Args:
        read: a checkpoint already read (its file and what it holds), handed over when Lightning
            asks for that file; None: none.
    """

    def __init__(self, read: tuple[Path, dict[str, Any]] | None = None) -> None:
        self._read = read

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            torch.save(checkpoint, f)

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if self._read is not None and Path(path).resolve() == self._read[0].resolve():
            checkpoint, self._read = self._read[1], None  # once: Lightning restores from it, then lets go
            return checkpoint
        return read_checkpoint(path)
