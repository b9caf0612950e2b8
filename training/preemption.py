"""SIGTERM or SIGUSR1 (a cluster's or a spot instance's warning): save ``last.ckpt``, then stop.

Lightning does most of it. Its signal connector turns SIGTERM into ``trainer.received_sigterm``,
and its loops then raise :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException` (a
``SystemExit``) at the end of the current batch, under DDP on every rank. Under SLURM (its
``SLURMEnvironment`` with ``auto_requeue``, detected by itself) SIGUSR1 makes Lightning save
``hpc_ckpt_<n>.ckpt`` into the run directory and requeue the job with ``scontrol requeue``; the
requeued job, started into the same run directory, resumes from that checkpoint on its own.

What Lightning lacks, :class:`PreemptionCheckpoint` adds: a checkpoint where ``ckpt_path=last``
finds it (Lightning writes none on SIGTERM), and SIGUSR1 outside SLURM, which would otherwise end
the process at once (its default action) with nothing saved. The checkpoint is written at the end
of the update the signal arrived in (where the update checkpoints are written, so the resumed run
continues exactly there), or, if the signal arrives during validation, when Lightning stops.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

logger = logging.getLogger(__name__)


class Preempted(SIGTERMException):
    """Training stopped on a signal after saving ``last.ckpt``; the exit status is 128 + the signal.

    A ``SystemExit``, as Lightning's own :class:`SIGTERMException`: Hydra lets it pass, and the
    process ends with the shell's status for "ended by that signal" rather than 0 or a traceback.
    """

    def __init__(self, signum: int, update: int, checkpoint: str | None) -> None:
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name
        self.update = update
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        saved = f"saved {self.checkpoint}" if self.checkpoint else "no checkpoint saved"
        return (
            f"preempted by {self.signal_name} at update {self.update}: {saved}; "
            "resume with ckpt_path=last (or the same run directory under SLURM)"
        )


class PreemptionCheckpoint(Callback):
    """Saves ``<ckpt_dir>/last.ckpt`` when SIGTERM or SIGUSR1 arrives, and stops the run.

    Args:
        ckpt_dir: the run's checkpoint directory, where ``ckpt_path=last`` looks.
    """

    def __init__(self, ckpt_dir: Path) -> None:
        self.path = Path(ckpt_dir) / "last.ckpt"
        self.signum: int | None = None  # the signal that arrived (SIGUSR1 by our handler)
        self.saved_at: int | None = None  # the update last.ckpt was saved at, once saved

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning registers its handlers just before this hook. SIGUSR1 is ours only where
        # nothing handles it: under SLURM with auto-requeue, Lightning's handler saves and requeues.
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR1, self._on_sigusr1)

    def _on_sigusr1(self, signum: int, frame: FrameType | None) -> None:
        logger.warning("received SIGUSR1: saving last.ckpt and stopping after this update")
        self.signum = signum

    def _pending(self, trainer: L.Trainer) -> int | None:
        if self.signum is not None:
            return self.signum
        return signal.SIGTERM if trainer.received_sigterm else None

    def _save(self, trainer: L.Trainer) -> None:
        if self.saved_at == trainer.global_step:
            return
        trainer.save_checkpoint(self.path)
        self.saved_at = trainer.global_step
        if trainer.is_global_zero:
            logger.warning("preempted: saved %s at update %d", self.path, trainer.global_step)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        signum = self._pending(trainer)
        if signum is None:
            return
        self._save(trainer)
        raise Preempted(signum, trainer.global_step, str(self.path))

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # SIGTERM during validation, or between this callback's hook and Lightning's check.
        signum = self._pending(trainer)
        if isinstance(exception, SIGTERMException) and signum is not None:
            self._save(trainer)

    def preempted(self, trainer: L.Trainer) -> Preempted:
        """The :class:`Preempted` to end the process with, after Lightning stopped on a signal."""
        signum = self._pending(trainer) or signal.SIGTERM
        saved = str(self.path) if self.saved_at is not None else None
        return Preempted(signum, trainer.global_step, saved)
