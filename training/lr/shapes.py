"""The shapes of the learning rate: multipliers of the peak rate by update, each with a linear warmup.

``lr.schedule`` names one (conf/train.yaml, ``lr``); :class:`training.lr.rate.LearningRate` reads it.

- ``inverse_sqrt`` (the paper's, section 5.3; the default): rises linearly to 1 at
  ``warmup_steps``, then decays as sqrt(warmup_steps / step); needs no run length.
- ``cosine`` (Loshchilov & Hutter's SGDR without restarts): after warmup, half a cosine from 1
  down to ``min_ratio`` at ``total_steps``.
- ``linear`` (BERT's, fairseq's ``polynomial_decay`` of power 1): after warmup, a straight line
  from 1 down to ``min_ratio`` at ``total_steps``.
- ``constant`` (fine-tuning's usual choice): after warmup, 1.
- ``plateau`` (fairseq's ``reduce_lr_on_plateau``, OpenNMT-py's and Marian's decay on stalled
  validation): ``constant``'s factor, which :class:`training.lr.plateau.Plateau` multiplies by
  ``lr.plateau_factor`` each time the selection metric stalls.

Update ``step`` counts from 1 (the first update takes ``factor(1)``); past ``total_steps`` the
decaying schedules stay at ``min_ratio``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# The schedules that decay to a floor at a known update: they need the run's length.
NEEDS_TOTAL = ("cosine", "linear")


def inverse_sqrt_factor(step: int, warmup_steps: int) -> float:
    """Multiplier of the peak learning rate after ``step`` optimizer steps.

    Rises linearly to 1 at ``warmup_steps``, then decays as sqrt(warmup_steps / step); the same
    shape as the paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), scaled to peak 1.
    """
    step = max(step, 1)
    if warmup_steps <= 0:
        return 1.0
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def _warmup(step: int, warmup_steps: int) -> float | None:
    """The warmup's multiplier, step / warmup_steps (0 at step 0), or None once warmup is over."""
    return step / warmup_steps if step < warmup_steps else None


def _progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """How far the decay after warmup has gone: 0 at ``warmup_steps``, 1 at ``total_steps`` and after."""
    return min(1.0, (step - warmup_steps) / max(total_steps - warmup_steps, 1))


def cosine_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Linear warmup to 1, then min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2."""
    rising = _warmup(step, warmup_steps)
    if rising is not None:
        return rising
    progress = _progress(step, warmup_steps, total_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def linear_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Linear warmup to 1, then 1 - (1 - min_ratio) * progress: a line down to ``min_ratio``."""
    rising = _warmup(step, warmup_steps)
    if rising is not None:
        return rising
    return 1.0 - (1.0 - min_ratio) * _progress(step, warmup_steps, total_steps)


def constant_factor(step: int, warmup_steps: int) -> float:
    """Linear warmup to 1, then 1."""
    rising = _warmup(step, warmup_steps)
    return 1.0 if rising is None else rising


# The schedules whose rate stays at the peak after warmup (plateau's is lowered from outside).
FLAT = ("constant", "plateau")
SCHEDULES = ("inverse_sqrt", *NEEDS_TOTAL, *FLAT)


def schedule_factor(
    name: str, warmup_steps: int, total_steps: int | None = None, min_ratio: float = 0.0
) -> Callable[[int], float]:
    """The multiplier of update ``step`` (from 1) under schedule ``name``, as a function of ``step``.

    Args:
        name: ``inverse_sqrt``, ``cosine``, ``linear``, ``constant`` or ``plateau``.
        warmup_steps: updates of the linear warmup.
        total_steps: the update at which ``cosine`` and ``linear`` reach ``min_ratio``; unused by
            ``inverse_sqrt``.
        min_ratio: the floor of ``cosine`` and ``linear``, a fraction of the peak.

    Raises:
        ValueError: an unknown name, or a decaying schedule without a ``total_steps`` past the
            warmup, naming the settings.
    """
    if name == "inverse_sqrt":
        return lambda step: inverse_sqrt_factor(step, warmup_steps)
    if name in FLAT:
        return lambda step: constant_factor(step, warmup_steps)
    if name not in NEEDS_TOTAL:
        raise ValueError(f"lr.schedule={name!r} is not one of {', '.join(SCHEDULES)}")
    if total_steps is None or total_steps <= warmup_steps:
        raise ValueError(
            f"lr.schedule={name} decays to its floor at lr.total_steps updates, which must "
            f"exceed lr.warmup_steps={warmup_steps}; got {total_steps}"
        )
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"lr.min_ratio must be within [0, 1], not {min_ratio}")
    factor = cosine_factor if name == "cosine" else linear_factor
    return lambda step: factor(step, warmup_steps, total_steps, min_ratio)
