"""DDP processes that wait for each other at most ``trainer.ddp_timeout``, and say who is missing.

Starting is not hanging: the processes meet first at the rendezvous, where a rank that is still
importing torch, Lightning and Hydra on a slow or busy node may arrive many seconds after rank 0,
and then set up together (DDP's weight broadcast, Lightning's own broadcasts, the sanity-check
validation), where one rank can lag the other by as much on a loaded machine. Until training
starts every collective waits ``trainer.ddp_rendezvous_timeout`` (generous, as torchrun's
rendezvous is); only then does the process groups' timeout become ``trainer.ddp_timeout``, so a
short hang detection never makes a slow-starting node fail to connect.

Under DDP a rank that hangs (a stuck data loader, a deadlocked kernel) or dies leaves the others
waiting in the next collective, the gradient all-reduce, for the process group's timeout (30
minutes by default, then an error that names no rank), or forever. Two things make it short and
named:

- the process group's timeout is ``trainer.ddp_timeout`` (:func:`ddp_strategy`, Lightning's
  ``DDPStrategy(timeout=...)``): every collective gives up after it;
- before every backward pass (where the gradient all-reduce follows), :class:`RankWatch` meets
  the other ranks at ``torch.distributed.monitored_barrier`` on a gloo group of its own, which
  after ``ddp_timeout`` raises naming the ranks that did not arrive. It then raises
  :class:`RankTimeoutError` naming them and the update, and ends the processes Lightning started
  (the hung one would otherwise hold its device). A rank that raised instead has its traceback
  in the log, and the others stop when its connection closes.

The barrier costs one small gloo round trip per batch, on the CPU beside the GPUs' NCCL; what
that costs a step on a multi-GPU node is not measured yet (it needs two GPUs or more).
"""

from __future__ import annotations

import logging
import re
import signal
from datetime import timedelta
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor
from torch.distributed.distributed_c10d import _set_pg_timeout

logger = logging.getLogger(__name__)


class RankTimeoutError(RuntimeError):
    """Ranks did not reach the barrier before a backward pass within ``trainer.ddp_timeout``."""


class RendezvousDDPStrategy(DDPStrategy):
    """Lightning's DDP whose processes start within one timeout and then wait for each other within another.

    Args:
        timeout_s: every collective's timeout once training has started (``trainer.ddp_timeout``).
        rendezvous_timeout_s: every collective's timeout until then: joining the process group and
            setting up (``trainer.ddp_rendezvous_timeout``).
    """

    def __init__(self, timeout_s: float, rendezvous_timeout_s: float) -> None:
        super().__init__(timeout=timedelta(seconds=rendezvous_timeout_s))
        self.collective_timeout = timedelta(seconds=timeout_s)

    def on_train_start(self) -> None:
        super().on_train_start()
        # init_process_group takes one timeout for the start and for training; torch's
        # _set_pg_timeout (private, documented in its source; gloo and NCCL) changes it after.
        _set_pg_timeout(self.collective_timeout)


def _positive(key: str, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"trainer.{key} must be a positive number of seconds, not {seconds}")
    return float(seconds)


def ddp_strategy(strategy: Any, timeout_s: float | None, rendezvous_timeout_s: float | None = None) -> Any:
    """``strategy``, with ``"ddp"`` made a :class:`RendezvousDDPStrategy`.

    Args:
        strategy: ``trainer.strategy``; anything but ``"ddp"`` is returned as it is.
        timeout_s: ``trainer.ddp_timeout``, the collectives' timeout (None: Lightning's DDP as is).
        rendezvous_timeout_s: ``trainer.ddp_rendezvous_timeout`` (None: ``timeout_s``).

    Raises:
        ValueError: a timeout that is not positive, naming its key.
    """
    if timeout_s is None or strategy != "ddp":
        return strategy
    timeout_s = _positive("ddp_timeout", timeout_s)
    if rendezvous_timeout_s is None:
        rendezvous_timeout_s = timeout_s
    return RendezvousDDPStrategy(timeout_s, _positive("ddp_rendezvous_timeout", rendezvous_timeout_s))


def missing_ranks(message: str) -> list[int]:
    """The ranks a ``monitored_barrier`` error names (``Rank 1 ...``, ``Ranks 1, 3 ...``), else []."""
    found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", message)
    return [int(r) for r in found.group(1).replace(" ", "").split(",") if r] if found else []


class RankWatch(Callback):
    """Meets every rank before each backward pass; names the missing ones after ``timeout_s``.

    Args:
        timeout_s: how long a rank waits for the others (``trainer.ddp_timeout``).
        rendezvous_timeout_s: how long setting up its group may wait for the others, before
            training starts (``trainer.ddp_rendezvous_timeout``; None: ``timeout_s``).
    """

    def __init__(self, timeout_s: float, rendezvous_timeout_s: float | None = None) -> None:
        self.timeout = timedelta(seconds=_positive("ddp_timeout", timeout_s))
        start = timeout_s if rendezvous_timeout_s is None else rendezvous_timeout_s
        self.start_timeout = timedelta(seconds=_positive("ddp_rendezvous_timeout", start))
        self.group: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.group is None and dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            # monitored_barrier is gloo's alone; its own group also works beside NCCL on GPUs.
            self.group = dist.new_group(backend="gloo", timeout=self.start_timeout)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.group is not None:
            _set_pg_timeout(self.timeout, self.group)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Tensor) -> None:
        if self.group is None:
            return
        update = trainer.global_step + 1  # the update this backward pass belongs to, counted from 1
        try:
            dist.monitored_barrier(group=self.group, timeout=self.timeout, wait_all_ranks=True)
        except RuntimeError as err:
            raise self._failure(trainer, update, err) from err

    def _failure(self, trainer: L.Trainer, update: int, err: RuntimeError) -> RankTimeoutError:
        seconds = f"{self.timeout.total_seconds():g} s"
        ranks = missing_ranks(str(err))
        if ranks:
            who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} did not arrive"
        else:  # a non-zero rank learns only that rank 0, which checks the others, is gone
            who = "rank 0 (which waits for the others) did not answer"
        said = str(err).strip().splitlines()
        message = (
            f"update {update}, epoch {trainer.current_epoch}: rank {trainer.global_rank} waited for the"
            f" other processes before the backward pass and {who} within trainer.ddp_timeout={seconds}:"
            " a rank hangs or has failed (a failed rank's error is in the log above)."
            f" torch.distributed: {said[0] if said else type(err).__name__}"
        )
        logger.error("%s", message)
        kill = getattr(trainer.strategy.launcher, "kill", None)
        if kill is not None and trainer.global_rank == 0:  # ends the processes Lightning started
            kill(signal.SIGKILL)
        return RankTimeoutError(message)
