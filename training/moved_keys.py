"""Config keys that moved, refused under their old names with a message naming the new one.

The learning rate's keys were spread over ``optimizer.*``, ``schedule.*`` and
``validation.max_share``; they are now the ``lr`` group (the rate: :mod:`training.lr`) and the
``budget`` group (a time-limited run fitted to its budget: :mod:`training.budget`). A command line,
an experiment file or ``resume.allow_changes`` that names an old key is refused before anything
runs (:func:`refuse_moved_overrides`, :func:`refuse_moved`); what a checkpoint written before the
move holds (its config, its hyperparameters) is read under the new names (:func:`migrate_config`,
:func:`split_legacy_optimizer`), so that old checkpoints resume and load as before.
"""

from __future__ import annotations

import copy
import re
from typing import Any

# Old dotted key -> new dotted key.
MOVED = {
    "optimizer.lr": "lr.peak",
    "optimizer.schedule": "lr.schedule",
    "optimizer.warmup_steps": "lr.warmup_steps",
    "optimizer.total_steps": "lr.total_steps",
    "optimizer.min_lr_ratio": "lr.min_ratio",
    "optimizer.plateau_factor": "lr.plateau_factor",
    "optimizer.plateau_patience": "lr.plateau_patience",
    "schedule.fit": "budget.fit",
    "schedule.warmup_fraction": "budget.warmup_fraction",
    "schedule.average_fraction": "budget.average_fraction",
    "schedule.refits": "budget.refits",
    "schedule.drift": "budget.drift",
    "validation.max_share": "budget.validation_share",
}
# Whole groups that moved (``resume.allow_changes=[schedule]``).
MOVED_GROUPS = {"schedule": "budget", "validation": "budget"}

# A command-line override's key: ``optimizer.lr=...``, ``+optimizer.lr=...``, ``~schedule.fit``.
_OVERRIDE_KEY = re.compile(r"^[+~]{0,2}([A-Za-z_][\w.]*)(@[\w.:]+)?(=|$)")


class MovedKeyError(ValueError):
    """A config key used under the name it had before it moved; the message names the new one."""


def _said(old: str, new: str, where: str) -> str:
    groups = "the learning rate is the lr group, a time budget's fit the budget group"
    return f"{where}: {old} is now {new} ({groups})"


def refuse_moved_overrides(overrides: list[str]) -> None:
    """Refuses command-line overrides (``key=value``) that name a moved key.

    Raises:
        MovedKeyError: the first such override, naming its new key.
    """
    for override in overrides:
        match = _OVERRIDE_KEY.match(override)
        if match is None:
            continue
        key = match.group(1)
        if key in MOVED:
            raise MovedKeyError(_said(key, MOVED[key], f"the override {override!r}"))


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, dict):
        return {prefix[:-1]: config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def refuse_moved(config: dict[str, Any]) -> None:
    """Refuses a composed config (plain containers) that holds a moved key, or whose
    ``resume.allow_changes`` names one.

    Raises:
        MovedKeyError: naming the key and its new name.
    """
    for key in _flat(config):
        if key in MOVED:
            raise MovedKeyError(_said(key, MOVED[key], "the config"))
    allowed = ((config.get("resume") or {}).get("allow_changes")) or []
    for key in map(str, allowed):
        new = MOVED.get(key) or MOVED_GROUPS.get(key)
        if new is not None:
            raise MovedKeyError(_said(key, new, "resume.allow_changes"))


def migrate_config(saved: dict[str, Any] | None) -> dict[str, Any] | None:
    """A config a checkpoint stored before the keys moved, with them under their new names (a copy;
    emptied old groups dropped). None stays None."""
    if saved is None:
        return None
    config = copy.deepcopy(saved)
    for old, new in MOVED.items():
        group, key = old.split(".")
        if isinstance(config.get(group), dict) and key in config[group]:
            new_group, new_key = new.split(".")
            config.setdefault(new_group, {})[new_key] = config[group].pop(key)
    for group in MOVED_GROUPS:
        if config.get(group) == {}:
            del config[group]
    return config


def split_legacy_optimizer(optimizer: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An ``optimizer`` hyperparameter of a checkpoint written before the ``lr`` group, split into
    the optimizer's own settings and the ``lr`` group's (under their new names)."""
    own, lr = {}, {}
    for key, value in optimizer.items():
        new = MOVED.get(f"optimizer.{key}")
        if new is None:
            own[key] = value
        else:
            lr[new.split(".")[1]] = value
    return own, lr
