"""How the trainer drives the learning rate: once per update, once per validation.

:class:`RateScheduler` is the only writer of the optimizer's rate: a ``torch.optim.lr_scheduler``
that Lightning steps after every update (``interval: step``), each group's rate set to what
:class:`~training.lr.rate.LearningRate` says for the next update, and whose ``state_dict`` (the
update count and the learning rate's own state) is what checkpoints keep under ``lr_schedulers``.
:class:`RateOnValidation` tells the learning rate each validation's selection metric (a plateau
lowers it) and, where it changed, has the scheduler set the next update's rate at once.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from training.lr.rate import LearningRate

logger = logging.getLogger(__name__)

# The entries of a scheduler's state besides the learning rate's own (torch's LRScheduler fields).
_COUNTERS = ("last_epoch", "_step_count", "_last_lr", "base_lrs")


class RateScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Sets every group of ``optimizer`` to ``rate.value(update)`` for each coming update.

    torch counts the steps taken from 0 (``last_epoch``); update ``k`` (from 1) takes
    ``rate.value(k)``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, rate: LearningRate) -> None:
        self.rate = rate
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return self._rates()

    def _rates(self) -> list[float]:
        value = self.rate.value(self.last_epoch + 1)
        return [value for _ in self.optimizer.param_groups]

    def apply(self) -> None:
        """Sets the coming update's rate now (after a change between updates, or a resume)."""
        for group, value in zip(self.optimizer.param_groups, self._rates(), strict=True):
            group["initial_lr"] = self.rate.settings.peak
            group["lr"] = value
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        state = {key: self.__dict__[key] for key in _COUNTERS if key in self.__dict__}
        return {**state, "rate": self.rate.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The counters, and the learning rate's parts (a checkpoint from before they were kept
        here has them moved in by ``TranslationModule.on_load_checkpoint``)."""
        for key in _COUNTERS:
            if key in state_dict:
                self.__dict__[key] = state_dict[key]
        if "rate" in state_dict:
            self.rate.load_state_dict(state_dict["rate"])


class RateOnValidation(Callback):
    """Tells the module's learning rate each validation's ``monitor`` (the selection metric).

    Args:
        monitor: the logged metric, e.g. ``"val/bleu"``.
    """

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        rate: LearningRate = pl_module.learning_rate
        if value is None or not math.isfinite(float(value)) or not rate.validated(float(value)):
            return
        for config in trainer.lr_scheduler_configs:
            if isinstance(config.scheduler, RateScheduler):
                config.scheduler.apply()  # the next update, global_step + 1, takes the new rate
        plateau = rate.plateau
        assert plateau is not None
        logger.info(
            "plateau: %s has not improved for %d validations (best %.4g): the rate is now %.3g of the peak",
            self.monitor,
            plateau.patience,
            plateau.best,
            plateau.scale,
        )
