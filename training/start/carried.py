"""What a fine-tuned run takes fresh, and what it carries on from its checkpoint (``finetune.reset``).

``init_from`` always takes the checkpoint's weights, model config and SentencePiece model(s)
(:mod:`training.start.init`). ``finetune.reset`` lists what else starts afresh, as fairseq's
``--reset-optimizer`` / ``--reset-lr-scheduler`` / ``--reset-dataloader`` / ``--reset-meters`` do;
each part left out of the list is carried on from the checkpoint:

- ``optimizer``: Adam's moments (and its step counts, which its bias correction reads). This run's
  ``optimizer.*`` settings (betas, eps, weight decay) and ``lr.peak`` apply either way.
- ``schedule``: the learning rate continues the checkpoint's own schedule where its update left it:
  its shape, warmup and end, the segments a time budget fitted, the plateau's scale
  (:meth:`training.lr.LearningRate.carry`). A schedule that had reached its floor by the
  checkpoint's update would train this run at the floor throughout: it is refused, saying so. The
  run's own update counter (checkpoint names, ``trainer.max_steps``) still counts from 0.
- ``data_order``: the batch order continues from the checkpoint's epoch (epoch ``e`` of this run
  draws the order of the checkpoint's epoch count plus ``e``) instead of replaying epoch 0's.
- ``early_stopping``: the score it compares with (the checkpoint's best); its count of validations
  without improvement starts from 0, so that a fine-tune is never stopped by its source's count.
- ``best_score``: the best checkpoint's score: this run keeps a ``best-*`` checkpoint only where it
  beats the checkpoint's best, and until then the test stage's "best" is the ``init_from`` file.

The default lists all five, a new run from the weights. A part that cannot be carried (an averaged
checkpoint holds weights only; early stopping off in this run; another selection metric) is a
:class:`~training.start.init.FineTuneError` naming the part, the file and what to change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

from training.lr import LearningRate, RateSettings
from training.moved_keys import split_legacy_optimizer
from training.start.init import FineTuneError

logger = logging.getLogger(__name__)

# Everything a fine-tuned run may take fresh, in the order the log names them.
RESETTABLE = ("optimizer", "schedule", "data_order", "early_stopping", "best_score")


def parse_reset(value: Any) -> frozenset[str]:
    """``finetune.reset`` as a set of parts.

    Args:
        value: the config's list (or tuple) of part names.

    Raises:
        FineTuneError: not a list, or a name that is not one of :data:`RESETTABLE`.
    """
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise FineTuneError(f"finetune.reset={value!r} must be a list of parts, from {list(RESETTABLE)}")
    unknown = [str(v) for v in value if str(v) not in RESETTABLE]
    if unknown:
        raise FineTuneError(f"finetune.reset: {', '.join(unknown)} is not one of {', '.join(RESETTABLE)}")
    return frozenset(str(v) for v in value)


@dataclass(frozen=True)
class Carried:
    """What a fine-tuned run carries on from its checkpoint; None where the part starts afresh.

    Attributes:
        path: the checkpoint file.
        optimizer: its optimizer state (``optimizer_states[0]``).
        rate: its learning rate's state and its update count, from which the rate continues.
        epoch_offset: its epoch count, from which the data order continues.
        early_stopping_best: the score early stopping compares with (the checkpoint's best).
        best_score: the best checkpoint's score by this run's selection metric.
    """

    path: Path
    optimizer: dict[str, Any] | None = None
    rate: tuple[dict[str, Any], int] | None = None
    epoch_offset: int | None = None
    early_stopping_best: float | None = None
    best_score: float | None = None

    def describe(self) -> str:
        """The log's clause: what is carried on, with its value."""
        said = []
        if self.optimizer is not None:
            said.append("Adam's moments")
        if self.rate is not None:
            said.append(f"the learning-rate schedule from update {self.rate[1]}")
        if self.epoch_offset is not None:
            said.append(f"the data order from epoch {self.epoch_offset}")
        if self.early_stopping_best is not None:
            said.append(f"early stopping's best ({self.early_stopping_best:.4g}; its count from 0)")
        if self.best_score is not None:
            said.append(f"the best score ({self.best_score:.4g})")
        return ", ".join(said)


def rate_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The learning rate's state a checkpoint holds (its scheduler's), or, for one written before it
    was kept there, the same made from its hyperparameters and the module's and plateau's entries;
    None where it cannot say (a decaying schedule whose end it did not record)."""
    schedulers = checkpoint.get("lr_schedulers") or []
    if schedulers and schedulers[0].get("rate") is not None and schedulers[0]["rate"].get("shape"):
        return schedulers[0]["rate"]
    optimizer = (checkpoint.get("hyper_parameters") or {}).get("optimizer") or {}
    hparams_lr = (checkpoint.get("hyper_parameters") or {}).get("lr") or split_legacy_optimizer(optimizer)[1]
    settings = RateSettings.from_dict(hparams_lr)
    if settings.schedule in ("cosine", "linear") and settings.total_steps is None:
        return None
    plateau = next(
        (s for k, s in (checkpoint.get("callbacks") or {}).items() if k.startswith("PlateauDecay")), None
    )
    shape = {
        "name": settings.schedule,
        "warmup_steps": settings.warmup_steps,
        "total_steps": settings.total_steps,
        "min_ratio": settings.min_ratio,
    }
    return {
        "shape": shape,
        "offset": int(checkpoint.get("schedule_offset", 0)),
        "fitted": checkpoint.get("fitted_schedule"),
        "plateau": plateau,
    }


def carried_state(
    checkpoint: dict[str, Any],
    path: Path,
    reset: frozenset[str],
    monitor: str,
    mode: str,
    early_stopping_on: bool,
    budget_fit: bool,
    lr: RateSettings,
) -> Carried:
    """Takes what ``reset`` leaves out from ``checkpoint`` (read already).

    Args:
        checkpoint: the ``init_from`` checkpoint; path: its file.
        reset: the parts that start afresh (:func:`parse_reset`).
        monitor, mode: this run's selection metric (``val/bleu``, ``val/<set>/bleu``, ...) and its
            direction.
        early_stopping_on: whether this run stops early (``early_stopping.patience`` set).
        budget_fit: whether this run fits its schedule to a time budget (``budget.fit=budget``
            with ``trainer.max_time``), which starts a schedule of its own.
        lr: this run's learning-rate settings (a carried schedule is checked against its peak).

    Raises:
        FineTuneError: a part cannot be carried, naming it, the file and what to change.
    """
    kept = [part for part in RESETTABLE if part not in reset]
    if not kept:
        return Carried(path)

    def refuse(part: str, why: str) -> FineTuneError:
        return FineTuneError(
            f"finetune.reset leaves out {part}, but {why}: add {part} to finetune.reset "
            "(it then starts afresh)"
        )

    if "schedule" in kept and budget_fit:
        raise refuse(
            "schedule",
            "budget.fit=budget fits a schedule of its own to this run's time "
            "(or set budget.fit=none to continue the checkpoint's)",
        )
    if "early_stopping" in kept and not early_stopping_on:
        raise refuse("early_stopping", "this run does not stop early (early_stopping.patience is null)")
    # An average (training/average.py) keeps the update and epoch counts, not the training state.
    averaged = (
        " (an average of checkpoints holds their weights only)" if "averaged_from" in checkpoint else ""
    )
    for part, key in (("schedule", "global_step"), ("data_order", "epoch")):
        if part in kept and key not in checkpoint:
            raise refuse(part, f"{path} holds no {key}")
    optimizer = None
    if "optimizer" in kept:
        states = checkpoint.get("optimizer_states") or []
        if len(states) != 1:
            raise refuse("optimizer", f"{path} holds {len(states)} optimizer states, not one{averaged}")
        optimizer = states[0]
    rate = None
    if "schedule" in kept:
        rate = (_rate(checkpoint, path, lr, mode, refuse, averaged), int(checkpoint["global_step"]))
    callbacks = checkpoint.get("callbacks") or {}
    early = None
    if "early_stopping" in kept:
        state = next(
            (s for k, s in callbacks.items() if k.startswith("EarlyStopping") and _monitors(k, monitor)), None
        )
        if state is None:
            raise refuse("early_stopping", f"{path} holds no early-stopping state on {monitor}{averaged}")
        early = None if state.get("best_score") is None else float(torch.as_tensor(state["best_score"]))
    best = None
    if "best_score" in kept:
        best = _best_score(callbacks, monitor)
        if best is None:
            raise refuse("best_score", f"{path} holds no best checkpoint's score on {monitor}{averaged}")
    epoch_offset = int(checkpoint.get("epoch", 0)) + 1 if "data_order" in kept else None
    return Carried(path, optimizer, rate, epoch_offset, early, best)


def _rate(
    checkpoint: dict[str, Any], path: Path, lr: RateSettings, mode: str, refuse: Any, averaged: str
) -> dict:
    """The checkpoint's learning-rate state, checked to continue (:meth:`LearningRate.carry`)."""
    state = rate_state(checkpoint)
    if state is None:
        raise refuse(
            "schedule",
            f"{path} does not record where its decaying schedule ends (written before it did){averaged}",
        )
    try:
        LearningRate(lr, mode).carry(state, int(checkpoint["global_step"]))
    except ValueError as err:
        raise refuse("schedule", f"{path}: {err}") from None
    return state


def _best_score(callbacks: dict[str, Any], monitor: str) -> float | None:
    scores = [
        s.get("best_model_score")
        for s in callbacks.values()
        if isinstance(s, dict) and s.get("monitor") == monitor and "best_k_models" in s
    ]
    scores = [float(s) for s in scores if s is not None]
    return scores[0] if scores else None


def _monitors(state_key: str, monitor: str) -> bool:
    """Whether a callback's state key (``EarlyStopping{'monitor': 'val/bleu', 'mode': 'max'}``)
    names ``monitor``."""
    return f"'monitor': {monitor!r}" in state_key


def carry_callbacks(carried: Carried, best: ModelCheckpoint, stopping: EarlyStopping | None) -> None:
    """Gives the best-checkpoint and early-stopping callbacks the checkpoint's scores, before fit.

    The best score enters the best callback's ranking under a name that is no file (so that a better
    checkpoint of this run, replacing it, deletes nothing); its ``best_model_path`` is the
    ``init_from`` file until one is better. Early stopping takes the best it compares with; its count
    stays this run's own, from 0.
    """
    if carried.best_score is not None:
        score = torch.tensor(carried.best_score)
        placeholder = str(best.dirpath) + "/(init_from best score)"
        best.best_k_models = {placeholder: score}
        best.kth_best_model_path = placeholder
        best.kth_value = score
        best.best_model_score = score
        best.best_model_path = str(carried.path)
    if carried.early_stopping_best is not None and stopping is not None:
        stopping.best_score = torch.tensor(carried.early_stopping_best, dtype=torch.float32)
        stopping.wait_count = 0


class CarriedOptimizer(Callback):
    """Loads the checkpoint's Adam moments when training starts, keeping this run's settings.

    Args:
        state: the checkpoint's optimizer state (``optimizer_states[0]``).
        path: its file, for errors.

    Raises (at the start of training):
        FineTuneError: the saved moments do not fit the optimizer's parameters (another model, or
            another grouping of them: ``optimizer.name`` changed).
    """

    def __init__(self, state: dict[str, Any], path: Path) -> None:
        self.state = state
        self.path = path

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizer = trainer.optimizers[0]
        current = optimizer.state_dict()
        saved_sizes = [len(g["params"]) for g in self.state.get("param_groups", [])]
        sizes = [len(g["params"]) for g in current["param_groups"]]
        params = [p for g in optimizer.param_groups for p in g["params"]]
        shapes_fit = all(
            0 <= int(i) < len(params)
            and all(
                v.shape == params[int(i)].shape
                for k, v in s.items()
                if k != "step" and isinstance(v, torch.Tensor)
            )
            for i, s in self.state.get("state", {}).items()
        )
        if saved_sizes != sizes or not shapes_fit:
            raise FineTuneError(
                f"finetune.reset leaves out optimizer, but the optimizer state of {self.path} does not "
                f"fit this run's (parameter groups {saved_sizes} there, {sizes} here: optimizer.name "
                "changed?): add optimizer to finetune.reset"
            )
        # The moments are the checkpoint's; the groups (rate, betas, eps, weight decay) this run's.
        optimizer.load_state_dict({"state": self.state["state"], "param_groups": current["param_groups"]})
        self.state = {}  # copied into the optimizer: the checkpoint's memory-mapped file may go
