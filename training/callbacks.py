"""The callbacks of a run, chosen from its config: one small function a concern.

:func:`run_callbacks` is the pipeline's callbacks step: the checkpoints and their schedule
(:mod:`training.checkpoints`), what every checkpoint carries (the inference fields, the run's
config), progress, preemption, the attention image, the EMA, the learning rate told of each
validation, early stopping (:mod:`training.stopping`), what a fine-tuned run carries on, the time
budget, and the DDP rank watch. :class:`RunCallbacks` keeps those the later steps ask again (the
checkpoint plan, the budget's fit, the preemption handler).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from omegaconf import DictConfig, OmegaConf

from common.checkpoint_fields import inference_fields
from training.attention_image import AttentionImage
from training.budget import BudgetSettings
from training.budget.fit import BudgetFit
from training.budget.forecast import TimeBudgetCheck, max_time_seconds
from training.budget.timer import BudgetTimer
from training.checkpoints import CheckpointPlan
from training.ema import ExponentialMovingAverage
from training.lr import RateOnValidation
from training.preemption import PreemptionCheckpoint
from training.progress import ProgressBar, RunProgress
from training.ranks import RankWatch
from training.selection import Selection
from training.start import StartPoint
from training.start.carried import CarriedOptimizer, carry_callbacks
from training.start.resume import RunConfig
from training.stopping import EarlyStop, Hold, early_stopping


class InferenceFields(Callback):
    """Stores what translate.py needs (SentencePiece models, languages, ids) in every checkpoint."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    @staticmethod
    def of(datamodule: Any, src_lang: str, tgt_lang: str) -> dict[str, Any]:
        """The fields of a run on ``datamodule`` (its tokenizers and target-language tags)."""
        joint = datamodule.src_tokenizer is datamodule.tgt_tokenizer
        return inference_fields(
            src_lang=src_lang,
            tgt_lang=tgt_lang,
            src_spm=datamodule.src_tokenizer.model_proto,
            tgt_spm=None if joint else datamodule.tgt_tokenizer.model_proto,
            target_tags=datamodule.target_tags,
        )

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["nmt"] = self.fields


@dataclass
class RunCallbacks:
    """A run's callbacks, and those that later steps ask again.

    Attributes:
        callbacks: every callback, in the order their hooks run.
        plan: the checkpoint callbacks and the validation schedule.
        preemption: the signal handler that saves and requeues (training runs only).
        fitter: the time budget's fit (``budget.fit=budget`` with ``trainer.max_time``), or None.
        timer: the time limit that replaces Lightning's (with the fit), or None.
    """

    callbacks: list[Callback]
    plan: CheckpointPlan
    preemption: PreemptionCheckpoint
    fitter: BudgetFit | None = None
    timer: BudgetTimer | None = None


def _progress(cfg: DictConfig, pad_id: int) -> list[Callback]:
    """Progress lines in the log, and the bar (every ``progress_bar_every`` batches)."""
    progress = RunProgress(pad_id=pad_id)
    if not cfg.trainer.get("enable_progress_bar", True):
        return [progress]
    every = cfg.get("progress_bar_every")
    if every is None:  # every batch on the CPU; on an accelerator, a wait for the GPU every 10
        every = 1 if str(cfg.trainer.get("accelerator", "cpu")) == "cpu" else 10
    return [progress, ProgressBar(progress, refresh_rate=int(every))]


def _stopper(cfg: DictConfig, selection: Selection, hold: Hold | None) -> EarlyStop | None:
    """Early stopping (``early_stopping.patience``), held by ``hold`` (the budget's fitted decay)."""
    stopping = cfg.early_stopping
    if stopping.patience is None:
        return None
    return early_stopping(int(stopping.patience), float(stopping.min_delta), selection, hold)


def _budget(
    cfg: DictConfig, budget: BudgetSettings, ckpt_dir: Path
) -> tuple[list[Callback], BudgetFit | None, BudgetTimer | None]:
    """A time-limited run's: the fit to its budget (with its timer), or the check that warns."""
    max_time = cfg.trainer.get("max_time")
    if not (cfg.train and max_time):
        return [], None, None
    if isinstance(max_time, DictConfig):  # a mapping of timedelta's arguments
        max_time = OmegaConf.to_container(max_time, resolve=True)
    budget_s = max_time_seconds(max_time)
    average, every_n = int(cfg.average_last), cfg.checkpoint.every_n_updates
    if budget.fit == "none":
        return [TimeBudgetCheck(budget_s, int(cfg.lr.warmup_steps), average, every_n)], None, None
    fitter = BudgetFit(budget_s, budget, average, ckpt_dir, every_n)
    timer = BudgetTimer(duration=max_time, interval="step")
    return [fitter, timer], fitter, timer


def run_callbacks(
    cfg: DictConfig,
    plan: CheckpointPlan,
    ckpt_dir: Path,
    start: StartPoint,
    selection: Selection,
    budget: BudgetSettings,
    extras: dict[str, Any],
) -> RunCallbacks:
    """The run's callbacks (module docstring).

    Args:
        cfg: the run's config.
        plan: the checkpoint callbacks (:func:`training.checkpoints.plan_checkpoints`).
        ckpt_dir: where checkpoints go.
        start: where the run starts (what a fine-tuned run carries on).
        selection: the metric that selects checkpoints and drives early stopping and plateaus.
        budget: the ``budget`` settings.
        extras: ``inference_fields`` (the checkpoint's "nmt" entry), ``run_config`` (the resolved
            config), ``pad_id`` and ``loggers`` (their count: the attention image needs a second).
    """
    callbacks: list[Callback] = [
        *plan.callbacks,
        LearningRateMonitor(logging_interval="step"),
        InferenceFields(extras["inference_fields"]),
        RunConfig(extras["run_config"]),
        *_progress(cfg, extras["pad_id"]),
    ]
    preemption = PreemptionCheckpoint(ckpt_dir)
    if cfg.train:
        callbacks.append(preemption)
    if len(extras["loggers"]) > 1:
        callbacks.append(AttentionImage(index=0))
    ema = cfg.get("ema") or {}
    if ema.get("decay") is not None:  # validation, checkpoints and the test stage take the EMA
        # After AttentionImage: callbacks' validation-end hooks run in this order, and the EMA's
        # puts the training weights back, so the image is drawn from the weights validated.
        callbacks.append(ExponentialMovingAverage(float(ema.decay)))
    callbacks.append(RateOnValidation(selection.monitor))  # a plateau lowers the rate
    timed, fitter, timer = _budget(cfg, budget, ckpt_dir)
    stopper = _stopper(cfg, selection, None if fitter is None else fitter.holds_stopping)
    if stopper is not None:
        callbacks.append(stopper)
    carried = start.carried
    if carried is not None:  # the checkpoint's state, where finetune.reset keeps it
        carry_callbacks(carried, plan.best, stopper)
        if carried.optimizer is not None:
            callbacks.append(CarriedOptimizer(carried.optimizer, carried.path))
    callbacks += timed
    if extras.get("rank_watch") is not None:
        callbacks.append(extras["rank_watch"])
    return RunCallbacks(callbacks, plan, preemption, fitter, timer)


__all__ = ["InferenceFields", "RankWatch", "RunCallbacks", "run_callbacks"]
