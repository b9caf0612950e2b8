"""trainer.precision=auto follows what the device computes natively; an explicit choice is kept,
with a warning where bf16 would be emulated. CUDA devices are played by monkeypatch here (the
GPU tests run the real ones). ``cpu_dependent``: ``.ci/run`` runs them again on an emulated
AVX2-only CPU, where the unpatched test below takes fp32."""

from __future__ import annotations

import pytest
import torch

from fastpaths import hardware
from training.precision import choose_precision

pytestmark = pytest.mark.cpu_dependent


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Sets what the CPU reports: call it with True (AVX512-BF16, AMX) or False (AVX2 only)."""
    return lambda native: monkeypatch.setattr(hardware, "native_bf16", lambda: native)


@pytest.fixture
def cuda_gpu(monkeypatch):
    """A CUDA GPU that computes bf16 natively (True: A100, H100) or not (False: T4, V100)."""

    def make(native: bool) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0) if native else (7, 5))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "A100" if native else "Tesla T4")

    return make


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16-mixed"), (False, "32-true")])
def test_auto_on_the_cpu_takes_bf16_only_where_it_is_native(cpu_bf16, native, expected):
    cpu_bf16(native)
    choice = choose_precision("auto", "cpu")
    assert choice.precision == expected and choice.slow_warning is None
    assert torch.backends.cpu.get_cpu_capability() in choice.reason
    assert f"native bf16 is {native}" in choice.reason and "_is_avx512_bf16_supported()" in choice.reason


def test_auto_on_this_cpu_follows_its_own_report():
    """No monkeypatch: bf16-mixed where this CPU computes bf16 natively, else 32-true, and the
    reason names the capability PyTorch reports (AVX2 on .ci/run's emulated CPU)."""
    choice = choose_precision("auto", "cpu")
    native = hardware.native_bf16()
    assert choice.precision == ("bf16-mixed" if native else "32-true")
    capability = torch.backends.cpu.get_cpu_capability()
    assert f"CPU capability {capability} " in choice.reason and f"native bf16 is {native}" in choice.reason


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16-mixed"), (False, "16-mixed")])
@pytest.mark.parametrize("accelerator", ["gpu", "cuda", "auto"])
def test_auto_on_cuda_takes_bf16_or_fp16(cuda_gpu, native, expected, accelerator):
    cuda_gpu(native)
    choice = choose_precision("auto", accelerator)
    assert choice.precision == expected
    assert ("Tesla T4 (compute capability 7.5)" in choice.reason) is not native


def test_an_explicit_precision_wins_and_emulated_bf16_is_said_to_be_slow(cpu_bf16, cuda_gpu):
    cpu_bf16(False)
    slow = choose_precision("bf16-mixed", "cpu")
    assert slow.precision == "bf16-mixed"
    assert "emulated" in slow.slow_warning and "32-true" in slow.slow_warning
    assert choose_precision("32-true", "cpu").slow_warning is None
    assert choose_precision(32, "cpu").precision == "32"
    cpu_bf16(True)
    assert choose_precision("bf16-mixed", "cpu").slow_warning is None
    cuda_gpu(False)
    assert "16-mixed" in choose_precision("bf16-mixed", "gpu").slow_warning


def test_auto_elsewhere_is_fp32(cpu_bf16):
    choice = choose_precision("auto", "mps")
    assert choice.precision == "32-true" and "no bf16 capability report" in choice.reason


@pytest.mark.parametrize(
    ("onednn", "avx512_bf16", "amx", "native"),
    [
        (False, False, False, False),  # AVX2 only (Zen 3): oneDNN refuses bf16
        (True, False, False, False),  # AVX512 without BF16 (Skylake, Cascade Lake): oneDNN emulates
        (True, True, False, True),  # AVX512-BF16 (Zen 4, Cooper Lake)
        (True, False, True, True),  # AMX (Sapphire Rapids)
    ],
)
def test_native_bf16_on_x86_needs_bf16_arithmetic_not_only_onednn_support(
    monkeypatch, onednn, avx512_bf16, amx, native
):
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert hardware.native_bf16.__wrapped__() is native
