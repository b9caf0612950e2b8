"""The device a translator runs on, checked to exist here before any checkpoint is read."""

from __future__ import annotations

import torch


def resolve_device(name: str | torch.device) -> torch.device:
    """A torch device that exists here.

    Raises:
        ValueError: not a device name, or CUDA (or that GPU) is not available.
    """
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {name!r}: not a device ({err})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: there are only {torch.cuda.device_count()} CUDA devices")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {name!r}: MPS is not available on this machine")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r}: only cpu, cuda and mps are supported")
    return device
