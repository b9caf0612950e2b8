"""The trainer's numeric precision, chosen from what the device computes natively.

``trainer.precision: auto`` (the CPU recipe, ``trainer=gpu``, ``trainer=ddp``) becomes one of
Lightning's precisions here, before the Trainer is built:

- CUDA: ``bf16-mixed`` where PyTorch reports native bf16 (Ampere and newer), else ``16-mixed``
  (fp16 autocast with loss scaling: T4, V100, RTX 20xx);
- CPU: ``bf16-mixed`` where the CPU computes bf16 natively (:func:`fastpaths.hardware.native_bf16`:
  AVX512-BF16, AMX, Arm BF16), else ``32-true``: on AVX2-only CPUs, and on AVX512 Xeons without
  BF16, bf16 is emulated and slower than fp32 (BENCHMARKS.md, "Precision by CPU");
- anything else (MPS, ...): ``32-true``.

Any other value is the user's explicit choice and is kept; asking for bf16 where it is emulated
runs, with one warning that says it is slow and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from fastpaths.hardware import bf16_capability

logger = logging.getLogger(__name__)

AUTO = "auto"


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run trains in, and why.

    Attributes:
        requested: ``trainer.precision`` as configured (``auto`` or one of Lightning's).
        precision: what the Trainer gets.
        reason: the capability PyTorch reports for the device, in words.
        slow_warning: why the explicit choice will be slow on this device, or None.
    """

    requested: str
    precision: str
    reason: str
    slow_warning: str | None = None


def device_type(accelerator: str) -> str:
    """``cuda``, ``cpu`` or another device type for Lightning's ``accelerator`` setting."""
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return accelerator


def choose_precision(requested: str | int, accelerator: str) -> PrecisionChoice:
    """Resolves ``auto`` for the device of ``accelerator``; keeps any explicit precision.

    Args:
        requested: ``trainer.precision``: ``auto``, or a Lightning precision (``32-true``,
            ``bf16-mixed``, ``16-mixed``, ``bf16-true``, 32, ...).
        accelerator: ``trainer.accelerator`` (``cpu``, ``gpu``, ``cuda``, ``auto``, ...).
    """
    requested = str(requested)
    device = device_type(accelerator)
    native, report = bf16_capability(device)
    if requested == AUTO:
        if native:
            return PrecisionChoice(requested, "bf16-mixed", f"native bf16: {report}")
        fallback = "16-mixed" if device == "cuda" and torch.cuda.is_available() else "32-true"
        return PrecisionChoice(requested, fallback, f"no native bf16: {report}")
    warning = None
    if requested.startswith("bf16") and not native:
        warning = (
            f"trainer.precision={requested} on a device without native bf16 ({report}): bf16 is "
            f"emulated there and much slower than fp32; trainer.precision=auto chooses "
            f"{'16-mixed' if device == 'cuda' else '32-true'} on this device"
        )
    return PrecisionChoice(requested, requested, f"set explicitly; {report}", warning)


def resolve_precision(cfg: DictConfig) -> PrecisionChoice:
    """Sets ``cfg.trainer.precision`` to what the device computes well (``auto``) or keeps it; logs why."""
    choice = choose_precision(cfg.trainer.get("precision", "32-true"), cfg.trainer.get("accelerator", "cpu"))
    cfg.trainer.precision = choice.precision
    if rank_zero_only.rank == 0:
        said = (choice.precision, choice.requested, choice.reason)
        logger.info("precision: %s (trainer.precision=%s): %s", *said)
        if choice.slow_warning:
            logger.warning(choice.slow_warning)
    return choice
