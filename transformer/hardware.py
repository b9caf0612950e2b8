"""What the device computes natively, as PyTorch reports it.

Asked by the CPU seam (``cpu_kernels.py``: how bf16 weights are packed), by the trainer's
precision (``training/precision.py``: ``trainer.precision: auto``) and by ``translate.py`` (a
warning for ``--dtype bfloat16`` where it is emulated). Decided once per process from PyTorch's
capability report, never by trying an operation and catching its error.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively, as PyTorch's oneDNN reports it.

    True with AVX512 (BW, VL, DQ: AVX512-BF16 on AMD Zen 4 and Intel Cooper Lake and later, AMX),
    AVX-NE-CONVERT or Arm's BF16 extension; False on AVX2-only x86 (AMD Zen 2/3, Intel client
    CPUs since Alder Lake), where bf16 runs emulated, far slower than fp32 (BENCHMARKS.md,
    "Precision by CPU"), and oneDNN refuses to pack bf16 weights.
    """
    report = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and report is not None and report())


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
            f"(torch.backends.cpu.get_cpu_capability()), oneDNN native bf16 "
            f"(torch.ops.mkldnn._is_mkldnn_bf16_supported()) is {native}"
        )
    return False, f"device {device}: no bf16 capability report in PyTorch"
