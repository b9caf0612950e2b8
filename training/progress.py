"""Where a run is: updates/s, target tokens/s and the time left, in the progress bar and the logs.

Lightning's bar counts batches of the current epoch; a long run wants optimizer updates and the
time left to ``trainer.max_steps`` or to the epoch limit, whichever comes first (Lightning's
``trainer.estimated_stepping_batches``), or to ``trainer.max_time`` if that comes sooner. The
rates are measured over the last ``window`` updates of wall-clock time, validation and
checkpoints included, so the time left is what the run will really take. ``train/updates_s`` and
``train/time_left_s`` go to the loggers (TensorBoard, CSV) and to the bar; every
``trainer.log_every_n_steps`` updates, rank zero logs a line such as
``update 1200/100000 (1.2%): 3.10 updates/s, 77,500 target tokens/s, 8:51:12 left``.
Tokens are those of this process (under DDP, multiply by the number of processes).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Timer, TQDMProgressBar

logger = logging.getLogger(__name__)


def host_value(value: float) -> torch.Tensor:
    """``value`` as a 0-dim fp32 tensor in host memory, for ``self.log``: Lightning makes a Python
    number a tensor on the module's device, a blocking copy that on a GPU waits for the step's work."""
    return torch.tensor(float(value), dtype=torch.float32)


def format_duration(seconds: float) -> str:
    """``"H:MM:SS"``, ``"<d>d H:MM:SS"`` beyond a day, ``"?"`` when unknown (no limit, no rate yet)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = round(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock


class RunProgress(Callback):
    """Measures updates/s and target tokens/s over the last ``window`` updates, and the time left.

    Args:
        window: updates the rates are measured over.
        pad_id: the padding id, not counted as a target token.
    """

    def __init__(self, window: int = 50, pad_id: int = 0) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self.pad_id = pad_id
        self._marks: deque[tuple[float, int, int]] = deque(maxlen=window + 1)  # (time, update, tokens)
        self._tokens = 0  # target tokens since training started (this process)
        self.updates_s = math.nan
        self.tokens_s = math.nan
        self.time_left_s = math.inf
        self.total: float = math.inf  # updates the run will make in all, once training started

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._marks.clear()
        self._marks.append((time.perf_counter(), trainer.global_step, 0))
        self._tokens = 0
        self.total = float(trainer.estimated_stepping_batches)  # inf without a step or epoch limit

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(batch, dict) and "tgt_positions" in batch:  # made on the host: no wait for the device
            self._tokens += len(batch["tgt_positions"])
        elif isinstance(batch, dict) and "tgt_out" in batch:
            self._tokens += int((batch["tgt_out"] != self.pad_id).sum())
        update = trainer.global_step
        if not self._marks or update == self._marks[-1][1]:
            return  # accumulating: no update yet
        self._marks.append((time.perf_counter(), update, self._tokens))
        (t0, u0, k0), (t1, u1, k1) = self._marks[0], self._marks[-1]
        elapsed = max(t1 - t0, 1e-9)
        self.updates_s = (u1 - u0) / elapsed
        self.tokens_s = (k1 - k0) / elapsed
        total = self.total
        self.time_left_s = max(total - update, 0) / self.updates_s if self.updates_s > 0 else math.inf
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)  # trainer.max_time
        if timer is not None and timer.time_remaining() is not None:
            self.time_left_s = min(self.time_left_s, max(float(timer.time_remaining()), 0.0))
        pl_module.log(
            "train/updates_s", host_value(self.updates_s), prog_bar=True, on_step=True, on_epoch=False
        )
        if math.isfinite(self.time_left_s):
            pl_module.log("train/time_left_s", host_value(self.time_left_s), on_step=True, on_epoch=False)
        every = max(int(trainer.log_every_n_steps), 1)
        if update % every == 0 and trainer.is_global_zero:
            logger.info("%s", self.describe(update, total))

    def describe(self, update: int, total: float) -> str:
        """``update U/T (P%): R updates/s, K target tokens/s, H:MM:SS left``."""
        of = f"/{int(total)} ({100 * update / total:.1f}%)" if math.isfinite(total) and total > 0 else ""
        return (
            f"update {update}{of}: {self.updates_s:.2f} updates/s, {self.tokens_s:,.0f} target tokens/s, "
            f"{format_duration(self.time_left_s)} left"
        )


class ProgressBar(TQDMProgressBar):
    """Lightning's bar with the update count and the time left of :class:`RunProgress` beside it."""

    def __init__(self, progress: RunProgress, refresh_rate: int = 1) -> None:
        # Each refresh reads the logged loss from the device: on a GPU, a wait for the step to finish.
        super().__init__(refresh_rate=refresh_rate)
        self.progress = progress

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        total = self.progress.total
        metrics["update"] = f"{trainer.global_step}" + (f"/{int(total)}" if math.isfinite(total) else "")
        metrics["left"] = format_duration(self.progress.time_left_s)
        return metrics
