"""Cache entries that are complete or absent, prepared by one process at a time.

An entry is built under a temporary name beside its final one and renamed into place in one step
(:func:`publish`), so a process killed at any point (``kill -9``, a full disk) leaves either the
complete entry or none: a stray temporary, which no reader takes for an entry and the next
:func:`staging_path` of the same entry removes. :func:`exclusive` serializes the processes that
prepare the same cache (the ranks of a DDP job started by ``torchrun`` or SLURM all call
``prepare_data``): the first prepares, the others wait and then find the entries complete.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created if missing) for the ``with`` block.

    The lock is released by the kernel when the process dies, so a killed preparer never blocks
    the next run.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def staging_path(final: Path) -> Path:
    """A fresh temporary path beside ``final`` (same file system, so the rename is atomic).

    Temporaries left by killed runs of the same entry are removed first; call it while holding
    :func:`exclusive`, so that no live preparer's temporary is removed.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
    return final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def publish(staged: Path, final: Path) -> None:
    """Move a complete ``staged`` file or directory to ``final`` in one step.

    A directory that is already in place (built by another process meanwhile) is kept and
    ``staged`` is removed.
    """
    try:
        os.replace(staged, final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(staged)


def build_once(entry: Path, build: Callable[[Path], T]) -> T | None:
    """Build the directory ``entry`` unless it is complete already; one process at a time.

    Args:
        entry: the cache entry (a directory) to make.
        build: fills the (existing, empty) directory it is given; its result is returned.

    Returns:
        ``build``'s result where this call built the entry; ``None`` where it was complete
        already (possibly built by another process this call waited for).
    """
    if entry.is_dir():
        return None
    with exclusive(entry.parent / f".{entry.name}.lock"):
        if entry.is_dir():
            return None
        staged = staging_path(entry)
        staged.mkdir()
        try:
            result = build(staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        publish(staged, entry)
        return result
