"""Cache entries that are complete or absent, prepared by one process at a time.

Every file of an entry is written by :func:`data.atomic.atomic_write` (a temporary beside it,
renamed when whole), and an entry made of several files is complete only once its marker file,
written last, exists. So a process killed at any point (``kill -9``, a full disk) leaves no entry
that a later run takes for complete: at most temporaries, which :func:`remove_temporaries` clears
before the entry is built again. :func:`exclusive` serializes the processes that prepare the same
entry (the ranks of a DDP job started by ``torchrun`` or SLURM all call ``prepare_data``): the
first builds it, the others wait and then find it complete. The lock is ``filelock``'s, an OS
lock on Linux, macOS and Windows alike (``flock`` / ``LockFileEx``), released by the kernel
when its holder dies, so a killed preparer never blocks the next run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock


@contextmanager
def exclusive(entry: Path) -> Iterator[None]:
    """Hold an exclusive OS lock for ``entry`` (on ``.<name>.lock`` beside it) for the ``with`` block."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(entry.parent / f".{entry.name}.lock"):
        yield


def remove_temporaries(path: Path) -> None:
    """Remove the temporaries that killed writers of ``path`` left (``atomic_write``'s ``.<name>.*.tmp``).

    Call it holding :func:`exclusive` for the entry, so that no live writer's temporary goes.
    """
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
