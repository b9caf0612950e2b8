"""Resuming a run (``ckpt_path``): which checkpoint, whether it loads, and what changed since.

- :func:`find_resumed`: ``ckpt_path`` (``last``, a file, or a requeued SLURM job's newest) read once
  by the project's reader (:mod:`common.checkpoint_file`); a truncated, empty or foreign file is
  refused naming it (:class:`CheckpointError`), and ``ckpt_path=last`` names, or with
  ``resume.take_newest_loadable`` takes, the newest checkpoint beside it that loads. Nothing starts
  from scratch silently.
- :func:`check_config`: the run's config against the one the checkpoint was trained with
  (:class:`RunConfig` stores it in every checkpoint): a key that could change the run's result is
  refused, naming it and both values, unless ``resume.allow_changes`` lists it.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from common.checkpoint_file import TRAINING, WEIGHTS, CheckpointError, read_checkpoint
from training.lr.shapes import NEEDS_TOTAL
from training.moved_keys import migrate_config
from training.start.vocabulary import VOCABULARY_KEYS

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
    # The vocabulary is the checkpoint's, compared by its bytes (training/start/vocabulary.py).
    *(f"data.{key}" for key in VOCABULARY_KEYS),
)


# Safe to change, except where the schedule decays to its floor at the update the Trainer
# estimates from them (lr.schedule cosine or linear, lr.total_steps null, no time budget fitting it).
RUN_LENGTH = ("trainer.max_steps", "trainer.max_epochs")


def run_dir_of(path: Path) -> Path | None:
    """The run directory a checkpoint belongs to: its ``checkpoints/``'s parent, or the run itself
    for SLURM's ``hpc_ckpt_<n>.ckpt``; None for a file elsewhere."""
    if path.parent.name == "checkpoints":
        return path.parent.parent
    if path.name.startswith("hpc_ckpt_"):
        return path.parent
    return None


Found = tuple[Path, dict[str, Any]]


def _newest_loadable(ckpt_dir: Path, damaged: Path) -> Found | None:
    """The loadable ``update*``/``epoch*``/``best*`` checkpoint of ``ckpt_dir`` with the most updates."""
    best: tuple[int, Path, dict] | None = None
    for path in sorted(ckpt_dir.glob("*.ckpt")):
        if path == damaged or path.name.startswith(("last", "averaged", "average-point")):
            continue  # last-v1.ckpt and the like are not ours; an average holds no training state
        try:
            checkpoint = read_checkpoint(path, TRAINING)
        except CheckpointError:
            continue
        step = int(checkpoint["global_step"])
        if best is None or step > best[0]:
            best = (step, path, checkpoint)
    return None if best is None else (best[1], best[2])


def _requeued(output_dir: Path) -> Found | None:
    """In a SLURM job, the newest loadable checkpoint its run directory holds, or None.

    A requeued job starts again into the same run directory: it resumes from the run's
    ``checkpoints/last.ckpt``, or from Lightning's ``hpc_ckpt_<n>.ckpt`` (an older Lightning
    handler's), whichever holds more updates.
    """
    if "SLURM_JOB_ID" not in os.environ:
        return None
    found = [p for p in output_dir.glob("hpc_ckpt_*.ckpt") if _HPC.fullmatch(p.name)]
    found += [p for p in [output_dir / "checkpoints" / "last.ckpt"] if p.is_file()]
    best: tuple[int, Path, dict] | None = None
    for path in found:
        try:
            checkpoint = read_checkpoint(path, TRAINING)
        except CheckpointError as err:
            logger.warning("requeued job: %s; not resuming from it", err)
            continue
        step = int(checkpoint["global_step"])
        if best is None or step > best[0]:
            best = (step, path, checkpoint)
    return None if best is None else (best[1], best[2])


_HPC = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


def find_resumed(
    ckpt_path: str | None,
    runs_dir: str | Path,
    name: str,
    output_dir: Path,
    take_newest_loadable: bool = False,
    training: bool = True,
) -> Found | None:
    """The checkpoint a run resumes from (or, not training, tests), read once and checked; None
    to start afresh.

    Args:
        ckpt_path: None (in a SLURM job, the newest checkpoint of ``output_dir``, which a requeued
            job finds there; else none), a checkpoint file, or ``"last"``: the newest
            ``<runs_dir>/<name>/*/checkpoints/last.ckpt``.
        runs_dir, name: where ``last`` looks.
        output_dir: this run's directory (its own ``last.ckpt`` is not a candidate).
        take_newest_loadable: where ``last.ckpt`` cannot be loaded, resume from the newest loadable
            checkpoint beside it instead of stopping (``resume.take_newest_loadable``).
        training: False where the checkpoint is only tested (``train=false``): weights suffice.

    Returns:
        The file and what it holds (memory-mapped), or None.

    Raises:
        FileNotFoundError: no such file, or nothing for ``last`` to resume from.
        CheckpointError: the checkpoint cannot be loaded, naming it (and, for ``last``, the newest
            one beside it that can, and how to take it).
    """
    if ckpt_path in (None, ""):
        return _requeued(output_dir)
    if ckpt_path != "last":
        path = Path(ckpt_path)
        if not path.is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
        return path, read_checkpoint(path, TRAINING if training else WEIGHTS)
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
        return path, read_checkpoint(path, TRAINING)
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
        return other, checkpoint


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
            warning says that nothing is checked); keys that have moved since are read under
            their new names (:mod:`training.moved_keys`).
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
    old, new = flatten(migrate_config(saved)), flatten(current)  # its keys under today's names
    default = flatten(defaults or {})
    for key in new.keys() - old.keys():
        if key in default and default[key] == new[key]:
            old[key] = new[key]  # added since the checkpoint, at the value that computes as before
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))
    safe = SAFE_TO_CHANGE
    lr, budget = current.get("lr") or {}, current.get("budget") or {}
    fitted = budget.get("fit") == "budget" and (current.get("trainer") or {}).get("max_time")
    if lr.get("schedule") in NEEDS_TOTAL and lr.get("total_steps") is None and not fitted:
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
