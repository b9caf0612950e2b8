"""Early stopping, which waits for a decay fitted to the time budget.

Lightning's ``EarlyStopping`` ends the run once the selection metric has not improved in
``early_stopping.patience`` validations. Under ``budget.fit: budget`` the learning rate decays to
its floor at the budget's end and the averaged weights are taken from the budget's last part
(:mod:`training.budget.fit`): a patience that runs out before then cuts both (the README's
30-minute run on a Zen 3 at b2ee6a5, compact without dropout, stopped at update 6,846 of the 8,510
fitted, with 2 of its 5 averaged weights taken). :class:`EarlyStop` asks ``hold`` before
stopping for patience: while it answers with a reason, the run goes on and the log says why; its
count of validations without improvement goes on, so the first validation after the decay stops a
run that still has not improved. A metric that is not finite stops at once, as before.
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from torch import Tensor

from training.selection import DEFAULT_SELECTION, Selection

# What holds early stopping at an update: a reason (for the log), or None to let it stop.
Hold = Callable[[int], "str | None"]


class EarlyStop(EarlyStopping):
    """Lightning's early stopping, whose patience waits while ``hold`` gives a reason (module docstring).

    Args:
        hold: asked with the update of a validation that exhausted the patience; None: never held.
        kwargs: ``EarlyStopping``'s.
    """

    def __init__(self, hold: Hold | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.hold = hold
        self._update = 0

    @property
    def state_key(self) -> str:
        # EarlyStopping's own key, so that checkpoints written before this class resume with theirs
        # (and training.start.carried finds the count it carries).
        return f"EarlyStopping{ ({'monitor': self.monitor, 'mode': self.mode})!r}"

    def _run_early_stopping_check(self, trainer: L.Trainer) -> None:
        self._update = int(trainer.global_step)
        super()._run_early_stopping_check(trainer)

    def _evaluate_stopping_criteria(self, current: Tensor) -> tuple[bool, str | None]:
        should_stop, reason = super()._evaluate_stopping_criteria(current)
        if not (should_stop and self.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED):
            return should_stop, reason
        why = self.hold(self._update) if self.hold is not None else None
        if why is None:
            return should_stop, reason
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        return False, (
            f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} records "
            f"(best {self.best_score:.3f}), but the run goes on: {why}."
        )


def early_stopping(
    patience: int, min_delta: float, selection: Selection = DEFAULT_SELECTION, hold: Hold | None = None
) -> EarlyStop:
    """Stops when the selection metric (validation BLEU by default) has not improved by more than
    ``min_delta`` in ``patience`` validations, unless ``hold`` gives a reason to go on."""
    if patience < 1:
        raise ValueError(f"early_stopping.patience must be null (off) or at least 1, not {patience}")
    return EarlyStop(
        hold=hold,
        monitor=selection.monitor,
        mode=selection.mode,
        patience=patience,
        min_delta=min_delta,
        check_on_train_epoch_end=False,  # judged at every validation, also mid-epoch ones
        verbose=True,
    )


__all__ = ["EarlyStop", "Hold", "early_stopping"]
