"""SIGTERM or SIGUSR1 (a cluster's or a spot instance's warning): save ``last.ckpt``, then stop.

A signal reaches one process, or several at slightly different moments, while under DDP every rank
must stop at the same update and take part in the checkpoint's save. So the handlers here only
note the signal, and :class:`PreemptionCheckpoint` decides at fixed points that every rank passes
together: after each training batch and after each validation, the ranks all-reduce what they
received (one small gloo round trip, on a group of their own), and if any rank was signalled
every rank stops there.

- No validation follows the update: every rank saves ``last.ckpt`` there and raises
  :class:`Preempted`.
- A validation follows it (an update checkpoint's, an epoch end's): the validation runs first and
  the checkpoint callbacks save after it as always, so the resumed run neither repeats nor loses
  it; then Lightning stops on ``trainer.received_sigterm``, set on every rank at once.

Lightning's own handlers are replaced while training: its SIGTERM handler broadcasts from inside
the handler, and under SLURM its SIGUSR1 handler saves ``hpc_ckpt_<n>.ckpt`` from inside the
handler, collectives that only the signalled rank enters, wherever it is: a deadlock, or a
checkpoint of ranks at different updates. Under SLURM with auto-requeue (Lightning's
``SLURMEnvironment``, detected by itself), SIGUSR1 (its requeue signal) stops as above and rank 0
then requeues the job (``scontrol requeue``); the requeued job, started into the same run
directory, resumes from that run's newest checkpoint (:func:`training.resume.resume_point`).
Signals before training starts or after it ended keep their default action.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
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
    """Saves ``<ckpt_dir>/last.ckpt`` when SIGTERM or SIGUSR1 reaches any rank, and stops every rank.

    Args:
        ckpt_dir: the run's checkpoint directory, where ``ckpt_path=last`` looks.
    """

    def __init__(self, ckpt_dir: Path) -> None:
        self.path = Path(ckpt_dir) / "last.ckpt"
        self.received: int | None = None  # the signal this process received, if any
        self.signum: int | None = None  # the signal every rank agreed to stop on
        self.saved_at: int | None = None  # the update last.ckpt was saved at, once saved
        self.after_validation = False  # stopping once the validation of this update is done
        self.group: Any = None  # the ranks' gloo group, under DDP
        self.requeue_signal: int | None = None  # SLURM with auto-requeue: the signal that requeues

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.group is None and dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            self.group = dist.new_group(backend="gloo")  # CPU tensors: no device sync per batch

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning registers its handlers just before this hook; they are restored after training.
        env = getattr(trainer.strategy, "cluster_environment", None)
        if isinstance(env, SLURMEnvironment) and env.auto_requeue:
            self.requeue_signal = int(env.requeue_signal or signal.SIGUSR1)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(self.requeue_signal or signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # No logging, no collectives: a handler runs between any two bytecodes of the main thread.
        self.received = max(self.received or 0, signum)

    def _agreed(self) -> int | None:
        """The signal any rank received (the same answer on every rank), or None."""
        received = self.received or 0
        if self.group is not None:
            flag = torch.tensor([received], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            received = int(flag.item())
        return received or None

    def _save(self, trainer: L.Trainer) -> None:
        if self.saved_at == trainer.global_step:
            return
        trainer.save_checkpoint(self.path)  # every rank: each adds its RNG states, rank 0 writes
        self.saved_at = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.signum is not None:
            return
        self.signum = self._agreed()
        if self.signum is None:
            return
        name = signal.Signals(self.signum).name
        if _validation_follows(trainer):
            self.after_validation = True
            if trainer.is_global_zero:
                logger.warning(
                    "%s received: stopping after the validation of update %d", name, trainer.global_step
                )
            return
        self._save(trainer)
        if trainer.is_global_zero:
            logger.warning("%s received: saved %s at update %d", name, self.path, trainer.global_step)
        self.requeue(trainer)
        raise Preempted(self.signum, trainer.global_step, str(self.path))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        if self.signum is None:
            self.signum = self._agreed()  # a signal during validation stops here, not an update later
            if self.signum is None:
                return
            self.after_validation = True
        # The checkpoint callbacks run after this one and save the validated update (last.ckpt
        # included); Lightning then raises SIGTERMException on every rank, at the end of the batch
        # or, at an epoch end, after the epoch's checkpoints.
        trainer._signal_connector.received_sigterm = True

    def requeue(self, trainer: L.Trainer) -> None:
        """Under SLURM with auto-requeue, after its requeue signal: rank 0 requeues the job."""
        if self.requeue_signal is None or self.signum != self.requeue_signal or not trainer.is_global_zero:
            return
        command = requeue_command(os.environ)
        logger.warning("requeueing the SLURM job: %s", " ".join(command))
        result = subprocess.call(command)
        if result != 0:
            logger.error("%s failed with status %d: the job is not requeued", " ".join(command), result)

    def preempted(self, trainer: L.Trainer) -> Preempted:
        """The :class:`Preempted` to end the process with, after Lightning stopped on a signal.

        Requeues a SLURM job first where its requeue signal stopped the run.
        """
        self.requeue(trainer)
        signum = self.signum or self.received or signal.SIGTERM
        saved = None
        if self.saved_at is not None:
            saved = str(self.path)
        elif self.after_validation and any(
            getattr(cb, "_last_global_step_saved", None) == trainer.global_step
            and cb.last_model_path
            and Path(cb.last_model_path).resolve() == self.path.resolve()
            for cb in trainer.checkpoint_callbacks
        ):
            saved = str(self.path)
        return Preempted(signum, trainer.global_step, saved)


def _validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates after the batch that just ended (its own test, as it will ask it)."""
    loop = trainer.fit_loop.epoch_loop
    return bool(trainer.enable_validation) and loop._should_check_val_fx(trainer.fit_loop._data_fetcher)


def requeue_command(environ: Any) -> list[str]:
    """``scontrol requeue <job>``, the job named as Lightning names it (array jobs included)."""
    if environ.get("SLURM_ARRAY_JOB_ID") is not None:
        job = f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    else:
        job = environ["SLURM_JOB_ID"]
    return ["scontrol", "requeue", job]
