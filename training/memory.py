"""The training process's memory: the peak resident size, and giving free pages back.

The allocator settings that keep a training process from growing (glibc's, PyTorch's, oneDNN's,
MKL's) are made by ``fastpaths.allocators.configure_allocators`` before torch is imported
(``train.py`` does it first thing); :func:`release_free_memory` returns what they keep between
the stages of a run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Re-exported for the callers that configure through this module (bench/, training.pipeline).
from fastpaths.allocators import configure_allocators, glibc  # noqa: F401 (no torch import there)


def release_free_memory() -> bool:
    """Gives the free pages of glibc's heap back to the kernel (``malloc_trim(0)``); returns
    whether glibc did (False elsewhere, and where nothing was free).

    :func:`configure_allocators` has glibc keep what a step frees, so that the next step reuses
    it without faulting it in again; but blocks of shapes that came once (a long batch, the
    validation's search) stay resident as holes that later steps do not fit into, and the process
    creeps upward over a run. Called between the stages of a run (after each validation, before
    the test): the pages the next step touches again cost a fault each, once per stage, a fraction
    of a second against the ~100 s of an epoch.
    """
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))


def peak_resident_mib() -> float:
    """The process's peak resident memory so far (``getrusage``'s ``ru_maxrss``), in MiB; NaN on
    Windows, which has no ``resource`` module."""
    try:
        import resource
    except ImportError:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


def resident_mib() -> float:
    """The process's resident memory now, in MiB (``/proc/self/statm``); NaN where there is no
    ``/proc`` (macOS, Windows)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
