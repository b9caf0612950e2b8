"""How fast a candidate model trains on this machine: a few updates, timed.

:func:`time_updates` builds the candidate's module, applies the device's fast paths as the run
does (``fastpaths.optimize``), and runs real updates (forward, backward, the run's Adam) on real
batches, in the run's precision; the first ``warmup`` are not timed. The fit runs its batches twice
and times the second pass: a fresh module's first updates grow the heap and choose kernels for each
new shape, which a run pays once, and one warm-up update read a Zen 5's bf16 speed 1.56-1.72x too
slow (``bench/recipe_speed.py``). It answers seconds per update at the batches' size, so the fit
times each candidate on batches of the size it would train at (:mod:`training.recipe.fit`): tokens
per second move by 12-20% between 1,024 and 4,096 tokens (the same benchmark, Zen 5, 2026-12-07).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fastpaths.optimize import optimize
from training.module import FUSED_ADAM_DEVICES, TranslationModule
from training.optimizer import build_optimizer


@dataclass(frozen=True)
class Timing:
    """A candidate's measured speed.

    Attributes:
        seconds_per_update: the median of the timed updates.
        tokens_per_second: target tokens a second at that speed.
        updates: how many were timed.
    """

    seconds_per_update: float
    tokens_per_second: float
    updates: int


def _autocast(precision: str, device: torch.device) -> Any:
    if precision.startswith("bf16"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision.startswith("16"):
        return torch.autocast(device.type, dtype=torch.float16)
    return nullcontext()


def time_updates(
    model: dict[str, Any],
    batches: list[dict[str, Tensor]],
    precision: str = "32-true",
    device: str | torch.device = "cpu",
    label_smoothing: float = 0.1,
    warmup: int = 1,
) -> Timing:
    """Times updates of a fresh ``model`` (``TransformerConfig`` fields) on ``batches``.

    Args:
        model: the candidate's model settings, vocabulary sizes included.
        batches: the batches to train on, one update each, ``collate_columns``' form (a list
            twice over, ``warmup`` its length, times its second pass).
        precision: the run's (``32-true``, ``bf16-mixed``, ...).
        device: where the run trains.
        label_smoothing: the run's.
        warmup: the leading updates not timed (at least one: allocations, kernel choice).

    Returns:
        The :class:`Timing` of the updates after the first ``warmup``.
    """
    if not 1 <= warmup < len(batches):
        raise ValueError(
            f"time_updates: {len(batches)} batches leave none to time after warmup={warmup} (at least one "
            "warm-up update, and one more timed)"
        )
    device = torch.device(device)
    module = TranslationModule(model, lr={"peak": 1e-4, "warmup_steps": 0}).to(device)
    module.use(optimize(module.model, device, "train"))
    module.train()
    fused = device.type in FUSED_ADAM_DEVICES  # as the run's optimizer (configure_optimizers)
    adam = build_optimizer(module.model, "adam", 1e-4, (0.9, 0.98), 1e-9, 0.0, fused=fused)
    seconds, tokens = [], []
    for i, batch in enumerate(batches):
        batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        start = time.perf_counter()
        with _autocast(precision, device):
            loss_sum, n_tokens = module.loss(batch, label_smoothing)
        (loss_sum.sum() / n_tokens.sum().clamp(min=1)).backward()
        adam.step()
        adam.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            seconds.append(time.perf_counter() - start)
            tokens.append(int(n_tokens.sum()))
    seconds.sort()
    median = seconds[len(seconds) // 2]
    return Timing(median, sum(tokens) / sum(seconds), len(seconds))
