"""Files written whole or not at all: every checkpoint, average and cache file goes through here.

:func:`atomic_write` hands out a temporary file beside the target; only when the writer has
finished without an exception is it flushed to disk and renamed onto the target in one step
(``os.replace``, atomic on POSIX and Windows within a filesystem), and the directory is
synced after the rename (:func:`fsync_directory`). So a reader, another rank
writing the same cache entry, or a run resumed after a crash sees either the old file or the whole
new one, never half a file; a failed write removes its temporary file and leaves an existing
target as it was.

    with atomic_write(path) as f:
        torch.save(checkpoint, f)
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new contents into; it becomes ``path`` on success.

    The temporary file is ``.<name>.<pid>.<random>.tmp`` in the target's directory (the same
    filesystem, so the rename is atomic; a unique name, so concurrent writers do not share it). It
    is created with the usual permissions (``0o666`` less the umask), like a file opened with
    ``open(path, "wb")``.

    Args:
        path: the file to write; its directory must exist.

    Yields:
        The temporary file, open for binary writing.

    Raises:
        Whatever the writer raises, after the temporary file is removed; ``OSError`` where the
        temporary file cannot be created or renamed (the target is then untouched).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Flushes ``directory``'s entries to disk, so that a rename into it survives a power loss.

    ``os.replace`` changes the directory, not the file: until the directory itself is synced, a
    crash can leave the old name (or none) on disk. A no-op where directories cannot be opened
    (Windows).
    """
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
