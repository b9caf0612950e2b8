"""``optimizer.schedule: plateau``: the rate lowered each time validation stops improving.

After its warmup the rate stays at the peak, as ``constant``'s, until the selection metric
(validation BLEU by default, ``checkpoint.select_on`` / ``checkpoint.metric``) has not improved in
``optimizer.plateau_patience`` validations in a row; then it is multiplied by
``optimizer.plateau_factor``, never below ``optimizer.min_lr_ratio`` of the peak, and the count
starts again. This is fairseq's ``reduce_lr_on_plateau``, OpenNMT-py's and Marian's decay on
stalled validation, and what domain adaptation often uses: no run length to guess.

The multiplier is the module's ``lr_scale`` (``TranslationModule.lr_factor`` applies it); the
callback's state (the best value, the validations without improvement, the multiplier) is in
every checkpoint, so a resumed run goes on with the same rate.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

logger = logging.getLogger(__name__)


class PlateauDecay(Callback):
    """Multiplies the module's ``lr_scale`` by ``factor`` after ``patience`` validations in a row
    without improvement of ``monitor``.

    Args:
        monitor: the logged metric, e.g. ``"val/bleu"``.
        mode: ``"max"`` (BLEU, chrF) or ``"min"`` (loss).
        factor: the multiplier at each plateau, in (0, 1).
        patience: validations without improvement that make a plateau, at least 1.
        min_ratio: the lowest the scale goes, a fraction of the peak rate.

    Raises:
        ValueError: a factor or patience out of range, naming the ``optimizer`` key.
    """

    def __init__(self, monitor: str, mode: str, factor: float, patience: int, min_ratio: float = 0.0) -> None:
        if not 0.0 < factor < 1.0:
            raise ValueError(f"optimizer.plateau_factor must be within (0, 1), not {factor}")
        if patience < 1:
            raise ValueError(f"optimizer.plateau_patience must be at least 1, not {patience}")
        self.monitor, self.mode = monitor, mode
        self.factor, self.patience, self.min_ratio = factor, patience, min_ratio
        self.best: float | None = None
        self.stalled = 0  # validations in a row without improvement
        self.scale = 1.0

    @property
    def state_key(self) -> str:
        return f"PlateauDecay[{self.monitor}]"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "stalled": self.stalled, "scale": self.scale}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict["best"]
        self.stalled, self.scale = int(state_dict["stalled"]), float(state_dict["scale"])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.lr_scale = self.scale  # a resumed run's; the module's on_train_start sets the rate

    def observe(self, value: float) -> bool:
        """Counts one validation's ``value``; returns whether the rate was lowered."""
        improved = self.best is None or (value > self.best if self.mode == "max" else value < self.best)
        if improved:
            self.best, self.stalled = value, 0
            return False
        self.stalled += 1
        if self.stalled < self.patience or self.scale <= self.min_ratio:
            return False
        self.scale, self.stalled = max(self.scale * self.factor, self.min_ratio), 0
        return True

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None or not math.isfinite(float(value)):
            return
        if not self.observe(float(value)):
            return
        pl_module.lr_scale = self.scale
        step = trainer.global_step  # the next update is global_step + 1: it takes the new rate
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * pl_module.lr_factor(step + 1)
        logger.info(
            "plateau: %s has not improved for %d validations (best %.4g): the rate is now %.3g of the peak",
            self.monitor,
            self.patience,
            self.best,
            self.scale,
        )
