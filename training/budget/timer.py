"""The time limit of a budgeted run: Lightning's ``Timer`` less the validation it runs after stopping."""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import Timer

logger = logging.getLogger(__name__)


class BudgetTimer(Timer):
    """Lightning's ``Timer`` for ``trainer.max_time``, after which no validation runs: Lightning
    validates once more when the time limit stops a run mid-epoch, and nothing needs it (the best
    checkpoint and early stopping keep what the run validated; the averaged weights are taken apart)."""

    def _check_time_remaining(self, trainer: L.Trainer) -> None:
        assert self._duration is not None
        time_up = trainer.strategy.broadcast(self.time_elapsed() >= self._duration)
        trainer.should_stop = trainer.should_stop or time_up
        if time_up and trainer.limit_val_batches:
            trainer.limit_val_batches = 0
            logger.info(
                "time limit reached after %d s at update %d: the run stops, with no validation after it",
                int(self.time_elapsed()),
                trainer.global_step,
            )
