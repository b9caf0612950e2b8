"""Averaging the weights of several checkpoints (Vaswani et al. average the last 5 or 20)."""

from __future__ import annotations

from pathlib import Path

import torch

from data.atomic import atomic_write


def average_checkpoints(paths: list[str | Path], output: str | Path) -> Path:
    """Writes a checkpoint whose ``state_dict`` is the element-wise mean of those in ``paths``.

    Everything else (hyperparameters, tokenizer fields) is taken from the last checkpoint;
    optimizer and loop states are dropped, since no training state matches averaged weights (and
    so are the training weights an EMA run keeps beside its ``state_dict``, the EMA, which is
    what is averaged: :mod:`training.ema`).
    ``output`` is written whole or not at all (:func:`data.atomic.atomic_write`): a failed or
    interrupted average leaves an earlier ``output`` as it was.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    last: dict = {}
    for path in paths:
        last = torch.load(path, map_location="cpu", weights_only=True)
        for name, tensor in last["state_dict"].items():
            if name in total and total[name].shape != tensor.shape:
                raise ValueError(
                    f"{path}: {name} has shape {tuple(tensor.shape)}, not {tuple(total[name].shape)}"
                )
            value = tensor.double() if tensor.is_floating_point() else tensor
            total[name] = total[name] + value if name in total and tensor.is_floating_point() else value
    averaged = {
        name: (t / len(paths)).to(last["state_dict"][name].dtype) if t.is_floating_point() else t
        for name, t in total.items()
    }
    keep = {
        k: v
        for k, v in last.items()
        if k not in ("optimizer_states", "lr_schedulers", "loops", "callbacks", "ema")
    }
    keep["state_dict"] = averaged
    keep["averaged_from"] = [str(p) for p in paths]
    output = Path(output)
    with atomic_write(output) as f:
        torch.save(keep, f)
    return output


def write_average(
    weights: dict[str, torch.Tensor], template: str | Path, output: str | Path, updates: list[int]
) -> Path:
    """Writes ``output``: the checkpoint ``template`` (its hyperparameters and tokenizer fields) with
    the model's weights ``weights`` (``model.state_dict()`` keys, averaged elsewhere: the weights of
    ``updates``, ``training.budget_fit``) and no training state, as :func:`average_checkpoints` does."""
    last = torch.load(template, map_location="cpu", weights_only=True)
    state = last["state_dict"]
    missing = sorted(f"model.{name}" for name in weights if f"model.{name}" not in state)
    if missing:
        raise ValueError(f"{template}: no {missing[0]} for the averaged weights")
    keep = {
        k: v
        for k, v in last.items()
        if k not in ("optimizer_states", "lr_schedulers", "loops", "callbacks", "ema")
    }
    keep["state_dict"] = {
        name: weights[name[len("model.") :]].to(tensor.dtype) if name.startswith("model.") else tensor
        for name, tensor in state.items()
    }
    keep["averaged_from"] = [f"update {u}" for u in updates]
    output = Path(output)
    with atomic_write(output) as f:
        torch.save(keep, f)
    return output
