"""Inverse-square-root learning-rate schedule with linear warmup (paper, section 5.3)."""

from __future__ import annotations

import math


def inverse_sqrt_factor(step: int, warmup_steps: int) -> float:
    """Multiplier of the peak learning rate after ``step`` optimizer steps.

    Rises linearly to 1 at ``warmup_steps``, then decays as sqrt(warmup_steps / step); the same
    shape as the paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), scaled to peak 1.
    """
    step = max(step, 1)
    if warmup_steps <= 0:
        return 1.0
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))
