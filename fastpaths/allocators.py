"""A training process's allocator and kernel-cache settings, made before ``import torch``.

Four things made a training process grow to several GiB for a model of 7.6M parameters, and
each step slower than it need be (BENCHMARKS.md, "Training speed and memory"):

1. **Blocks mapped and unmapped every step.** PyTorch's CPU tensors come from the C library's
   ``malloc`` (``posix_memalign``). With glibc's defaults a block larger than a threshold (128 KiB
   at first, growing to 32 MiB as blocks are freed) is mapped from the kernel on its own and
   unmapped when freed, so each of a step's large tensors costs a page fault per 4 KiB page it
   touches, every step: ~120,000 faults a step for the Multi30k recipe's model.
2. **A creeping heap.** Below that threshold, glibc does not fit 64-byte-aligned requests of
   ever-changing sizes back into the holes earlier ones left, and its heap creeps upward.
3. **oneDNN's kernel caches.** Each bf16 matrix product of a new shape builds a kernel that
   oneDNN keeps (up to 1,024 of them, and ideep as many again): ~5 MiB of kernels for every new
   batch shape, and token-bucketed batches bring a new shape almost every step.
4. **MKL's buffer pool.** fp32 products go to MKL, whose memory manager keeps the buffers it
   packs matrices into for reuse: ~46 MiB held between the fp32 recipe's steps, allocated from
   glibc's heap like the tensors around them.

:func:`configure_allocators` settles all four, before ``import torch``: PyTorch's
``THP_MEM_ALLOC_ENABLE`` makes its CPU allocations page-aligned (transparent huge pages asked for
from 2 MiB), which glibc does fit back into freed blocks; ``mallopt`` has glibc serve every
block from its heap and keep what is freed there, so a step reuses the previous step's memory
without faulting it in again; and oneDNN's and ideep's caches are bounded at
``KERNEL_CACHE`` kernels each, as ``translate.py`` bounds them (``packed.bound_kernel_caches``):
a kernel for a new shape is made again (~150 us), which the caches could not avoid anyway,
since the shapes of one epoch outnumber them; and MKL's ``MKL_DISABLE_FAST_MM`` has MKL free
its buffers after each product (no slower: 0.99-1.00x the fp32 step). The process then holds
about its largest step's working set. The allocator settings are glibc's, PyTorch's and MKL's
documented ones, made by the program; on other C libraries (musl, macOS, Windows) glibc's are
left alone. A value already in the environment is kept.

This module imports no torch (nor does the package's ``__init__``): ``train.py`` and the
benchmarks that train call :func:`configure_allocators` first thing, because PyTorch reads
``THP_MEM_ALLOC_ENABLE`` at its first allocation, during ``import torch``. ``translate.py``
bounds only the kernel caches (``packed.bound_kernel_caches``), before its first packed product.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import sys

logger = logging.getLogger(__name__)

# Kernels each of oneDNN's and ideep's caches keep: a decoding step uses one per weight shape
# (five in a decoder) for its row count. With 16, translate.py ran as fast as with the default
# 1,024, and ~100 MiB smaller at the same batches (BENCHMARKS.md, "Translation speed within the
# memory target").
KERNEL_CACHE = 16
# The environment variables oneDNN and ideep read, once, at their first kernel.
KERNEL_CACHE_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Blocks up to this size come from the heap: above any one tensor of a training step.
MMAP_THRESHOLD = 1 << 30
# Free memory at the top of the heap kept rather than given back: a step's working set.
TRIM_THRESHOLD = 1 << 30
# Heaps: one for every thread that allocates (the main thread, autograd's, the loader's). More
# heaps only spread the same steps' blocks over more address ranges.
ARENAS = 1
_TORCH_SETTINGS = {
    "THP_MEM_ALLOC_ENABLE": "1",
    **{name: str(KERNEL_CACHE) for name in KERNEL_CACHE_SETTINGS},
    "MKL_DISABLE_FAST_MM": "1",
}


def glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None where the C library is another (or cannot be loaded)."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def configure_allocators() -> bool:
    """Makes the settings of the module docstring; returns whether glibc's were made.

    Call before ``import torch`` (``train.py`` does, first thing): PyTorch and oneDNN read their
    variables once, at their first allocation and kernel. Harmless to call again; after torch is
    imported, only glibc's settings still take effect.
    """
    if "torch" in sys.modules:  # too late, and packed.py would take the caches for bounded
        logger.debug("torch was imported first: its allocation, kernel-cache and MKL settings stay")
    else:
        for name, value in _TORCH_SETTINGS.items():
            os.environ.setdefault(name, value)
    libc = glibc()
    if libc is None:
        return False
    done = [
        libc.mallopt(_M_ARENA_MAX, ARENAS),
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ]
    if not all(done):
        logger.warning("glibc refused some allocator settings (mallopt returned %s)", done)
    return all(done)
