"""The allocator settings training makes, and the peak resident memory results.json records."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest


def test_peak_resident_memory_grows_with_what_the_process_touches():
    # In a fresh process, whose peak so far is about what it holds: in this one, the peak of
    # earlier tests could hide the block (and a peak never falls, so ">= before" proves nothing).
    # Started by a shell that forks it: Linux keeps ru_maxrss across exec, so a process this
    # one started directly would begin with this one's peak.
    code = """
from training import memory
before = memory.peak_resident_mib()
block = bytearray(64 * 1024 * 1024)  # 64 MiB, written: resident
block[::4096] = b"x" * len(block[::4096])
print(before, memory.peak_resident_mib() - before)
"""
    done = subprocess.run(
        ["sh", "-c", '"$0" -c "$1"; exit $?', sys.executable, code],
        capture_output=True, text=True, check=True, timeout=99,
    )  # fmt: skip
    before, grew = (float(x) for x in done.stdout.split())
    assert 0 < before < 64, done.stdout  # an interpreter and this module, in MiB
    assert 56 < grew < 72, done.stdout  # the block's 64 MiB, give or take what else moved


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_resident_memory_rises_with_a_block_and_stays_under_the_peak():
    # In a fresh process: in this one, memory that earlier tests freed may be reused for the block.
    code = """
from training import memory
before = memory.resident_mib()
block = bytearray(64 * 1024 * 1024)  # 64 MiB, written: resident
block[::4096] = b"x" * len(block[::4096])
held = memory.resident_mib()
print(held - before, memory.peak_resident_mib() + 1 - held)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=99
    )
    grew, margin = (float(x) for x in done.stdout.split())
    assert grew > 56  # the block's pages, give or take what else moved
    assert margin >= 0  # resident now <= the peak so far (statm and ru_maxrss round differently)


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="the settings are glibc's"
)
def test_glibc_keeps_freed_tensors_for_reuse():
    """After configure_allocators, freeing and allocating a step's large tensors again costs no new
    pages (no page faults); with glibc's defaults each new 64 MiB tensor is mapped afresh."""
    script = """
import resource, sys
from training import memory
if sys.argv[1] == "keep":
    assert memory.configure_allocators()  # before torch is imported, as train.py does
import torch
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):  # the first round maps the memory
    x = torch.ones(16 * 1024 * 1024); del x
start = faults()
for _ in range(5):
    x = torch.ones(16 * 1024 * 1024); del x  # 64 MiB, touched whole
print(faults() - start)
"""
    runs = {}
    for mode in ("keep", "default"):
        env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
        out = subprocess.run(
            [sys.executable, "-c", script, mode], capture_output=True, text=True, check=True, env=env
        )
        runs[mode] = int(out.stdout.split()[-1])
    pages = 5 * 64 * 1024 * 1024 // 4096
    assert runs["default"] > pages // 2, runs  # each tensor faulted in again
    assert runs["keep"] < pages // 20, runs  # reused


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's"
)
def test_releasing_free_memory_gives_the_kept_pages_back():
    """configure_allocators keeps freed tensors resident; release_free_memory returns them, and a
    tensor made afterwards is faulted in again (the one-off cost the module docstring states)."""
    script = """
from training import memory
assert memory.configure_allocators()
import torch
x = torch.ones(32 * 1024 * 1024)  # 128 MiB, touched whole
del x
kept = memory.resident_mib()
released = memory.release_free_memory()
print(int(released), kept - memory.resident_mib())
"""
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env, timeout=99
    )
    released, dropped = out.stdout.split()
    assert released == "1"
    assert float(dropped) > 100, out.stdout  # the freed 128 MiB left the resident set


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="mallinfo2 is glibc's"
)
def test_fp32_products_leave_no_buffers_held_after_configure_allocators():
    """MKL's memory manager keeps the buffers it packs fp32 products into (held between training
    steps); configure_allocators turns it off, so the heap holds nothing once the product is gone."""
    import torch

    if not torch.backends.mkl.is_available():
        pytest.skip("this PyTorch build has no MKL")
    script = """
import ctypes, sys
from training import memory
if sys.argv[1] == "configured":
    assert memory.configure_allocators()  # before torch is imported, as train.py does
import torch
torch.set_num_threads(1)
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
def held():
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd  # in use on the heap, and mapped on its own
torch.randn(8, 64) @ torch.randn(64, 64)  # MKL started
before = held()
for rows in (96, 160, 224):  # a few batch shapes
    x, w = torch.randn(rows, 256), torch.randn(512, 256)
    y = x @ w.T
    del x, w, y
print((held() - before) / 2**20)
"""
    held = {}
    for mode in ("configured", "default"):
        env = {k: v for k, v in os.environ.items() if k != "MKL_DISABLE_FAST_MM"}
        out = subprocess.run(
            [sys.executable, "-c", script, mode],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            timeout=300,
        )
        held[mode] = float(out.stdout.split()[-1])
    # MKL's pool kept its buffers: ~14 MiB with AVX512 kernels, ~1.3 MiB with AVX2's (emulated Zen 3).
    assert held["default"] > 1, held
    assert held["configured"] < 0.25, held  # freed with the product (~0.001 MiB measured)
