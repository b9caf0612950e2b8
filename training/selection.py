"""Which validation score chooses the best checkpoint and drives early stopping.

A run validates on the main corpus's validation split, logging ``val/bleu``, ``val/chrf``,
``val/loss`` and ``val/ppl``, or on every set of ``data.valid_sets``, logging ``val/<name>/bleu``
and the rest for each. One of those metrics is the run's selection: ``checkpoint.metric`` (bleu,
chrf or loss) of the set ``checkpoint.select_on`` (default: the first), maximised for the scores
and minimised for the loss. The best checkpoint (:mod:`training.checkpoints`) and early stopping
(:func:`training.stopping.early_stopping`) both follow it, so that the checkpoint the test stage
takes is the one early stopping waited for. The default, BLEU of the main validation split, is the
``val/bleu`` that checkpoints written before these settings existed monitor, so their callbacks'
states (keyed by the monitored name) load on resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Each selectable metric and the direction in which it improves (Lightning's mode).
METRICS = {"bleu": "max", "chrf": "max", "loss": "min"}
# How each is written into the best checkpoint's file name: scores to 0.01, the loss to 0.0001.
_FORMATS = {"bleu": ".2f", "chrf": ".2f", "loss": ".4f"}


def metric_prefix(set_name: str | None) -> str:
    """What a validation set's metric names start with: ``"val/"`` for the main validation split
    (None), ``"val/<name>/"`` for a set of ``data.valid_sets``."""
    return "val/" if set_name is None else f"val/{set_name}/"


@dataclass(frozen=True)
class Selection:
    """The validation metric a run is judged by.

    Attributes:
        metric: one of :data:`METRICS`.
        set_name: the validation set it is measured on; None: the main validation split.
    """

    metric: str = "bleu"
    set_name: str | None = None

    @property
    def monitor(self) -> str:
        """The logged name Lightning's callbacks monitor, e.g. ``"val/bleu"``, ``"val/old/loss"``."""
        return metric_prefix(self.set_name) + self.metric

    @property
    def mode(self) -> str:
        """``"max"`` or ``"min"``: which way is better."""
        return METRICS[self.metric]

    def filename(self, counter: str) -> str:
        """The best checkpoint's file name pattern, e.g. ``best-epoch{epoch:03d}-bleu{val/bleu:.2f}``.

        Args:
            counter: where it is in the run, a Lightning pattern: ``"epoch{epoch:03d}"`` or
                ``"step{step:08d}"``.
        """
        label = self.metric if self.set_name is None else f"{self.set_name}-{self.metric}"
        return f"best-{counter}-{label}{{{self.monitor}:{_FORMATS[self.metric]}}}"


# BLEU of the main validation split: what a run selects by unless told otherwise.
DEFAULT_SELECTION = Selection()


def choose_selection(metric: str, select_on: str | None, set_names: Sequence[str]) -> Selection:
    """The selection the settings ask for, checked.

    Args:
        metric: ``checkpoint.metric``.
        select_on: ``checkpoint.select_on``: a validation set's name, or None for the first.
        set_names: the names of ``data.valid_sets``, in order; empty: the main validation split.

    Raises:
        ValueError: an unknown metric, or a ``select_on`` that names no validation set; the
            message names the key.
    """
    if metric not in METRICS:
        raise ValueError(f"checkpoint.metric={metric!r} is not one of {', '.join(METRICS)}")
    if select_on is None:
        return Selection(metric, set_names[0] if set_names else None)
    if not set_names:
        raise ValueError(
            f"checkpoint.select_on={select_on!r} names a validation set, but data.valid_sets is empty: "
            "the run validates on data.valid_split alone; drop checkpoint.select_on or list the sets"
        )
    if select_on not in set_names:
        raise ValueError(
            f"checkpoint.select_on={select_on!r} is not a validation set; data.valid_sets names "
            f"{', '.join(set_names)}"
        )
    return Selection(metric, select_on)
