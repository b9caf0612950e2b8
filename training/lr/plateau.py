"""``lr.schedule: plateau``: the rate lowered each time validation stops improving.

After its warmup the rate stays at the peak, as ``constant``'s, until the selection metric
(validation BLEU by default, ``checkpoint.select_on`` / ``checkpoint.metric``) has not improved in
``lr.plateau_patience`` validations in a row; then it is multiplied by ``lr.plateau_factor``, never
below ``lr.min_ratio`` of the peak, and the count starts again. This is fairseq's
``reduce_lr_on_plateau``, OpenNMT-py's and Marian's decay on stalled validation, and what domain
adaptation often uses: no run length to guess.

:class:`Plateau` is one part of :class:`training.lr.rate.LearningRate`: its scale multiplies the
rate, and its state (the best value, the validations without improvement, the scale) is in the
learning rate's ``state_dict``, so a resumed run goes on with the same rate.
"""

from __future__ import annotations

from typing import Any


class Plateau:
    """Multiplies its ``scale`` by ``factor`` after ``patience`` validations in a row without
    improvement.

    Args:
        mode: ``"max"`` (BLEU, chrF) or ``"min"`` (loss): the selection metric's direction.
        factor: the multiplier at each plateau, in (0, 1).
        patience: validations without improvement that make a plateau, at least 1.
        min_ratio: the lowest the scale goes, a fraction of the peak rate.

    Raises:
        ValueError: a factor or patience out of range, naming the ``lr`` key.
    """

    def __init__(self, mode: str, factor: float, patience: int, min_ratio: float = 0.0) -> None:
        if not 0.0 < factor < 1.0:
            raise ValueError(f"lr.plateau_factor must be within (0, 1), not {factor}")
        if patience < 1:
            raise ValueError(f"lr.plateau_patience must be at least 1, not {patience}")
        if mode not in ("max", "min"):
            raise ValueError(f"a plateau's mode is max or min, not {mode!r}")
        self.mode, self.factor, self.patience, self.min_ratio = mode, factor, patience, min_ratio
        self.best: float | None = None
        self.stalled = 0  # validations in a row without improvement
        self.scale = 1.0

    def observe(self, value: float) -> bool:
        """Counts one validation's ``value``; returns whether the scale was lowered."""
        improved = self.best is None or (value > self.best if self.mode == "max" else value < self.best)
        if improved:
            self.best, self.stalled = value, 0
            return False
        self.stalled += 1
        if self.stalled < self.patience or self.scale <= self.min_ratio:
            return False
        self.scale, self.stalled = max(self.scale * self.factor, self.min_ratio), 0
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "stalled": self.stalled, "scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = None if state.get("best") is None else float(state["best"])
        self.stalled, self.scale = int(state["stalled"]), float(state["scale"])
