"""Resuming a run: which checkpoint, whether it loads, what changed since, and the history kept.

- :func:`resume_point`: ``ckpt_path`` (``last``, a file, or a requeued SLURM job's newest) read once;
  a truncated, empty or foreign file is refused naming it (:class:`CheckpointError`), and
  ``ckpt_path=last`` names, or with ``resume.take_newest_loadable`` takes, the newest checkpoint
  beside it that loads. Nothing starts from scratch silently.
- :func:`check_config`: the run's config against the one the checkpoint was trained with
  (:class:`RunConfig` stores it in every checkpoint): a key that could change the run's result is
  refused, naming it and both values, unless ``resume.allow_changes`` lists it.
- :func:`metrics_before`: the rows of the resumed run's ``logs/metrics.csv`` logged before the
  checkpoint, for the new ``metrics.csv`` (:class:`ContinuedCSVLogger`) to start with.
"""

from __future__ import annotations

import csv
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

from training.schedule import NEEDS_TOTAL

logger = logging.getLogger(__name__)

# Keys that may differ from the checkpoint's config without changing what the run computes: limits,
# where things go, logging and progress, validation frequency, the test stage, data loading speed,
# and the number of devices (the RNG restore warns that the run is no longer bit-exact then).
# A key stands for everything under it.
SAFE_TO_CHANGE = (
    "name",
    "ckpt_path",
    # A resumed run's weights are ckpt_path's; init_from only chose those its run started from (and
    # the SentencePiece model it gave, data.spm_model, is checked as a key of its own).
    "init_from",
    "finetune",
    "resume",
    "train",
    "test",
    "test_ckpt",
    "plot",
    "average_last",
    "paths",
    "logger",
    "max_nonfinite_in_a_row",
    "checkpoint.every_n_updates",
    "checkpoint.keep_last",
    "decoding.beam_size",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.max_time",
    "trainer.check_val_every_n_epoch",
    "trainer.num_sanity_val_steps",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.limit_test_batches",
    "trainer.ddp_timeout",
    "trainer.ddp_rendezvous_timeout",
    "trainer.devices",
    "trainer.num_nodes",
    "data.num_workers",
    "data.pin_memory",
    "data.cache_dir",
    "data.run_dir",
    "data.spm_threads",
    "data.eval_max_tokens",
)


# Safe to change, except where the schedule decays to its floor at the update the Trainer
# estimates from them (optimizer.schedule cosine or linear, optimizer.total_steps null).
RUN_LENGTH = ("trainer.max_steps", "trainer.max_epochs")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from (damaged, not a checkpoint, or from another config)."""


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint to resume from, read once.

    Attributes:
        path: the checkpoint file.
        global_step: the optimizer updates it holds.
        config: the config its run was trained with (None: a checkpoint from before it was stored).
        run_dir: the run directory it belongs to (its ``checkpoints/``'s parent, or the run itself
            for SLURM's ``hpc_ckpt_<n>.ckpt``), None for a file elsewhere.
    """

    path: Path
    global_step: int
    config: dict | None
    run_dir: Path | None


def read_checkpoint(path: Path, training: bool = True) -> dict[str, Any]:
    """The checkpoint at ``path``, memory-mapped (its tensors are read only when used).

    Args:
        path: the file.
        training: require a training state (loops, update count) besides the weights; an
            averaged checkpoint has none, and is only tested.

    Raises:
        CheckpointError: ``path`` is truncated, empty, not a checkpoint, or lacks a training state.
    """
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ... by cause
        size = path.stat().st_size if path.exists() else 0
        said = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CheckpointError(
            f"{path} cannot be loaded ({size} bytes; {type(err).__name__}: {said}): it is truncated, "
            "empty or not a checkpoint"
        ) from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no state_dict)")
    if training and not {"global_step", "loops"} <= set(checkpoint):
        raise CheckpointError(f"{path} holds no training state to resume from (no global_step or loops)")
    return checkpoint


def _point(path: Path, checkpoint: dict[str, Any]) -> ResumePoint:
    if path.parent.name == "checkpoints":
        run_dir: Path | None = path.parent.parent
    elif path.name.startswith("hpc_ckpt_"):
        run_dir = path.parent
    else:
        run_dir = None
    return ResumePoint(path, int(checkpoint.get("global_step", 0)), checkpoint.get("run_config"), run_dir)


def _newest_loadable(ckpt_dir: Path, damaged: Path) -> tuple[Path, dict] | None:
    """The loadable ``update*``/``epoch*``/``best*`` checkpoint of ``ckpt_dir`` with the most updates."""
    best: tuple[int, Path, dict] | None = None
    for path in sorted(ckpt_dir.glob("*.ckpt")):
        if path == damaged or path.name.startswith(("last", "averaged")):
            continue  # last-v1.ckpt and the like are not ours; an average holds no training state
        try:
            checkpoint = read_checkpoint(path)
        except CheckpointError:
            continue
        step = int(checkpoint["global_step"])
        if best is None or step > best[0]:
            best = (step, path, checkpoint)
    return None if best is None else (best[1], best[2])


def _requeued_checkpoint(output_dir: Path) -> Path | None:
    """In a SLURM job, the newest loadable checkpoint its run directory holds, or None.

    A requeued job starts again into the same run directory: it resumes from the run's
    ``checkpoints/last.ckpt``, or from Lightning's ``hpc_ckpt_<n>.ckpt`` (an older Lightning
    handler's), whichever holds more updates.
    """
    if "SLURM_JOB_ID" not in os.environ:
        return None
    found = [p for p in output_dir.glob("hpc_ckpt_*.ckpt") if _HPC.fullmatch(p.name)]
    found += [p for p in [output_dir / "checkpoints" / "last.ckpt"] if p.is_file()]
    best: tuple[int, Path] | None = None
    for path in found:
        try:
            step = int(read_checkpoint(path)["global_step"])
        except CheckpointError as err:
            logger.warning("requeued job: %s; not resuming from it", err)
            continue
        if best is None or step > best[0]:
            best = (step, path)
    return None if best is None else best[1]


_HPC = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


def resume_point(
    ckpt_path: str | None,
    runs_dir: str | Path,
    name: str,
    output_dir: Path,
    take_newest_loadable: bool = False,
    training: bool = True,
) -> ResumePoint | None:
    """The checkpoint a run resumes from, read and checked; None to start afresh.

    Args:
        ckpt_path: None (in a SLURM job, the newest checkpoint of ``output_dir``, which a requeued
            job finds there; else none),
            a checkpoint file, or ``"last"``: the newest ``<runs_dir>/<name>/*/checkpoints/last.ckpt``.
        runs_dir, name: where ``last`` looks.
        output_dir: this run's directory (its own ``last.ckpt`` is not a candidate).
        take_newest_loadable: where ``last.ckpt`` cannot be loaded, resume from the newest loadable
            checkpoint beside it instead of stopping (``resume.take_newest_loadable``).
        training: False where the checkpoint is only tested (``train=false``): weights suffice.

    Raises:
        FileNotFoundError: no such file, or nothing for ``last`` to resume from.
        CheckpointError: the checkpoint cannot be loaded, naming it (and, for ``last``, the newest
            one beside it that can, and how to take it).
    """
    if ckpt_path in (None, ""):
        requeued = _requeued_checkpoint(output_dir)
        return None if requeued is None else _point(requeued, read_checkpoint(requeued))
    if ckpt_path != "last":
        path = Path(ckpt_path)
        if not path.is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
        return _point(path, read_checkpoint(path, training))
    candidates = [
        p
        for p in (Path(runs_dir) / name).glob("*/checkpoints/last.ckpt")
        if p.resolve().parent.parent != output_dir.resolve()
    ]
    if not candidates:
        raise FileNotFoundError(
            f"ckpt_path=last: no {Path(runs_dir) / name}/*/checkpoints/last.ckpt to resume from"
        )
    path = max(candidates, key=lambda p: p.stat().st_mtime)
    try:
        return _point(path, read_checkpoint(path))
    except CheckpointError as err:
        fallback = _newest_loadable(path.parent, path)
        if fallback is None:
            raise CheckpointError(f"ckpt_path=last: {err}; no other checkpoint beside it loads") from err
        other, checkpoint = fallback
        if not take_newest_loadable:
            raise CheckpointError(
                f"ckpt_path=last: {err}. The newest checkpoint beside it that loads is {other} (update "
                f"{checkpoint['global_step']}): resume from it with ckpt_path={other}, or let ckpt_path=last "
                "take it with resume.take_newest_loadable=true"
            ) from err
        logger.warning("%s; resuming from %s (update %d) instead", err, other, checkpoint["global_step"])
        return _point(other, checkpoint)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``config``'s leaves by dotted key, e.g. ``{"optimizer.lr": 5e-4}``."""
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(
            flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
        )
    return out


def _covered(key: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in patterns)


_MISSING = "<absent>"


def check_config(
    saved: dict | None, current: dict, allow_changes: list[str], defaults: dict | None = None
) -> list[str]:
    """The changes allowed by ``resume.allow_changes``, as lines to log; raises for any other.

    A key the checkpoint's config lacks (a setting added to the project after it was written) is
    no change where its value now is its default in ``defaults``: every setting is added with a
    default that computes what the project computed before it.

    Args:
        saved: the checkpoint's config (None: a checkpoint from before configs were stored; a
            warning says that nothing is checked).
        current: this run's config, resolved.
        allow_changes: dotted keys (a group stands for every key under it) that may differ.
        defaults: the project's default config (``conf/train.yaml`` composed without overrides);
            None: a key the checkpoint lacks is a change.

    Raises:
        CheckpointError: keys that differ and are neither in :data:`SAFE_TO_CHANGE` nor allowed,
            each with both values; :data:`RUN_LENGTH` counts as a change where a decaying
            schedule's end is taken from it.
    """
    if saved is None:
        logger.warning(
            "the checkpoint stores no config (written before configs were): changes are not checked"
        )
        return []
    old, new = flatten(saved), flatten(current)
    default = flatten(defaults or {})
    for key in new.keys() - old.keys():
        if key in default and default[key] == new[key]:
            old[key] = new[key]  # added since the checkpoint, at the value that computes as before
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))
    safe = SAFE_TO_CHANGE
    optimizer = current.get("optimizer") or {}
    if optimizer.get("schedule") in NEEDS_TOTAL and optimizer.get("total_steps") is None:
        safe = tuple(k for k in safe if k not in RUN_LENGTH)  # they set where the decay ends
    changed = [k for k in changed if not _covered(k, safe)]
    said = {
        k: f"{k}: {old.get(k, _MISSING)!r} in the checkpoint, {new.get(k, _MISSING)!r} now" for k in changed
    }
    refused = [k for k in changed if not _covered(k, allow_changes)]
    if refused:
        lines = "\n  ".join(said[k] for k in refused)
        keys = ",".join(refused)
        raise CheckpointError(
            "resuming with a config that differs from the checkpoint's in what the run computes:\n"
            f"  {lines}\n"
            f"Resume with the checkpoint's values, or allow the change: resume.allow_changes=[{keys}]"
        )
    return [f"{said[k]} (allowed by resume.allow_changes)" for k in changed]


class RunConfig(Callback):
    """Stores the run's resolved config (plain containers) in every checkpoint, for :func:`check_config`."""

    def __init__(self, config: dict) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["run_config"] = self.config


def metrics_before(run_dir: Path | None, step: int) -> list[dict[str, str]]:
    """The rows of ``<run_dir>/logs/metrics.csv`` logged before update ``step``'s checkpoint.

    Lightning logs the metrics of update ``s`` (training and its validation) at ``step = s - 1``;
    rows from ``step`` on were logged after the checkpoint, and the resumed run logs them again.
    """
    path = None if run_dir is None else run_dir / "logs" / "metrics.csv"
    if path is None or not path.is_file():
        return []
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("step") and int(float(row["step"])) < step]


class ContinuedCSVLogger(CSVLogger):
    """Lightning's CSV logger, its ``metrics.csv`` starting with the rows of the run it resumes.

    Lightning's writer deletes an existing ``metrics.csv`` when it starts; this one writes
    ``previous`` (from :func:`metrics_before`) first, so the file, and the learning curve drawn
    from it, holds the whole run.
    """

    def __init__(self, *args: Any, previous: list[dict[str, str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._previous = previous or []

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is not None:
            return self._experiment
        with warnings.catch_warnings():
            # Lightning's writer warns "Previous log files in this directory will be deleted" when
            # the directory has files: false here, where the previous rows are written back below.
            warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
            writer = super().experiment
        if self._previous:
            keys = sorted(set().union(*self._previous))
            with open(writer.metrics_file_path, "w", newline="") as f:
                out = csv.DictWriter(f, fieldnames=keys)
                out.writeheader()
                out.writerows(self._previous)
            writer.metrics_keys = keys
        return writer
