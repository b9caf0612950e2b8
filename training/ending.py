"""How a run ended, for ``results.json``: finished, stopped early, preempted or failed, and when.

``results.json`` gets three keys from :meth:`Ending.as_results`:

- ``ending``: ``"finished"`` (the step or epoch limit reached), ``"stopped early"`` (early
  stopping on the selection metric, or ``trainer.max_time``), ``"preempted"`` (SIGTERM or SIGUSR1,
  :mod:`training.preemption`) or ``"failed"`` (an exception);
- ``ending_update``: the optimizer updates made when the run ended (``trainer.global_step``);
- ``ending_detail``: why, in one line: the limit, the early-stopping message, the signal and the
  checkpoint saved, or the exception's type and the first line of its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping, Timer
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.utilities.exceptions import SIGTERMException

FINISHED = "finished"
STOPPED_EARLY = "stopped early"
PREEMPTED = "preempted"
FAILED = "failed"


@dataclass(frozen=True)
class Ending:
    """How and when a run ended.

    Attributes:
        status: one of :data:`FINISHED`, :data:`STOPPED_EARLY`, :data:`PREEMPTED`, :data:`FAILED`.
        update: the optimizer updates made when it ended (0 before training began).
        detail: why, in one line.
    """

    status: str
    update: int
    detail: str

    def as_results(self) -> dict[str, Any]:
        return {"ending": self.status, "ending_update": self.update, "ending_detail": self.detail}


def one_line(err: BaseException) -> str:
    """``"<Type>: <first line of the message>"``; Ctrl-C (which Lightning turns into exit 1) named."""
    context = err.__context__
    if isinstance(err, SystemExit) and isinstance(context, KeyboardInterrupt):
        err = context  # Lightning's graceful shutdown on Ctrl-C ends with sys.exit(1)
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _update(trainer: L.Trainer | None) -> int:
    return int(trainer.global_step) if trainer is not None else 0


def ending_after_fit(trainer: L.Trainer) -> Ending:
    """Finished, or stopped early by early stopping or ``max_time``, once ``trainer.fit`` returned."""
    update = _update(trainer)
    for callback in trainer.callbacks:
        stopped = getattr(callback, "stopping_reason", EarlyStoppingReason.NOT_STOPPED)
        if isinstance(callback, EarlyStopping) and stopped != EarlyStoppingReason.NOT_STOPPED:
            message = callback.stopping_reason_message or callback.stopping_reason.value
            return Ending(STOPPED_EARLY, update, f"early stopping: {' '.join(message.split())}")
    for callback in trainer.callbacks:
        if isinstance(callback, Timer) and (callback.time_remaining() or 0.0) <= 0.0:
            elapsed = f"{callback.time_elapsed():.0f} s"
            return Ending(STOPPED_EARLY, update, f"trainer.max_time reached after {elapsed} of training")
    if trainer.should_stop:
        return Ending(STOPPED_EARLY, update, "a callback stopped the run (trainer.should_stop)")
    limits = [f"trainer.max_steps={trainer.max_steps}"] if trainer.max_steps > 0 else []
    limits += [f"trainer.max_epochs={trainer.max_epochs}"] if (trainer.max_epochs or -1) > 0 else []
    return Ending(FINISHED, update, f"reached {' or '.join(limits) or 'the end of training'}")


def ending_of_exception(err: BaseException, trainer: L.Trainer | None) -> Ending:
    """Preempted (a SIGTERM or SIGUSR1 stop) or failed, for an exception that ended the run."""
    if isinstance(err, SIGTERMException):
        return Ending(PREEMPTED, _update(trainer), str(err) or "SIGTERM")
    return Ending(FAILED, _update(trainer), one_line(err))
