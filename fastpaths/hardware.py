"""What the device computes natively, as PyTorch reports it.

Asked by the CPU's fast paths (``fastpaths/packed.py``: how bf16 weights are packed), by the trainer's
precision (``training/precision.py``: ``trainer.precision: auto``) and by ``translate.py`` (a
warning for ``--dtype bfloat16`` where it is emulated). Decided once per process from PyTorch's
capability report, never by trying an operation and catching its error.
"""

from __future__ import annotations

import functools
import platform

import torch

_X86 = ("x86_64", "amd64", "i386", "i686")


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively, from PyTorch's reports.

    oneDNN must support bf16 at all (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``: it does
    not on AVX2-only x86 such as AMD Zen 2/3 and Intel client CPUs since Alder Lake, and refuses to
    pack bf16 weights there), and on x86 the CPU must have bf16 arithmetic, AVX512-BF16 (AMD Zen 4,
    Intel Cooper Lake and later) or AMX: oneDNN also accepts plain AVX512 (Skylake and Cascade
    Lake Xeons) or AVX-NE-CONVERT, but emulates bf16's products there. On Arm, oneDNN's report is
    the BF16 extension itself. Where this is False, bf16 is emulated, slower than fp32
    (BENCHMARKS.md, "Precision by CPU").
    """
    report = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if not (torch.backends.mkldnn.is_available() and report is not None and report()):
        return False
    if platform.machine().lower() in _X86:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return True


def bf16_capability(device: str) -> tuple[bool, str]:
    """Whether ``device`` (a device type: ``cpu``, ``cuda``, ...) computes bf16 natively, and
    PyTorch's report of it in words (for logs and warnings)."""
    if device == "cuda":
        if not torch.cuda.is_available():
            return False, "CUDA requested but torch.cuda.is_available() is False"
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        major, minor = torch.cuda.get_device_capability()
        return native, (
            f"CUDA {torch.cuda.get_device_name()} (compute capability {major}.{minor}): "
            f"torch.cuda.is_bf16_supported(including_emulation=False) is {native}"
        )
    if device == "cpu":
        native = native_bf16()
        return native, (
            f"CPU capability {torch.backends.cpu.get_cpu_capability()} "
            f"(torch.backends.cpu.get_cpu_capability()), native bf16 is {native} (oneDNN's "
            f"torch.ops.mkldnn._is_mkldnn_bf16_supported(), and on x86 AVX512-BF16 or AMX: "
            f"torch.cpu._is_avx512_bf16_supported(), torch.cpu._is_amx_tile_supported())"
        )
    return False, f"device {device}: no bf16 capability report in PyTorch"
