"""What ``results.json`` holds, filled in as the run goes, and written however it ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from data.atomic import atomic_write
from training.ending import Ending
from training.memory import peak_resident_mib
from training.selection import metric_prefix


class RunRecord:
    """What ``results.json`` holds, filled in as the run goes, and written however it ends.

    Attributes:
        output_dir: the run directory.
        trainer: the run's Trainer once made (its metrics and update go into the file).
        fields: the precision chosen and why, once chosen.
        valid_set_names: the names of ``data.valid_sets``; each one's last validation is grouped
            under ``valid_sets`` in the file.
    """

    # What each validation set's entry under ``valid_sets`` holds.
    VALID_SET_METRICS = ("bleu", "chrf", "loss", "ppl")

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.trainer: L.Trainer | None = None
        self.fields: dict[str, Any] = {}
        self.valid_set_names: list[str] = []

    def metrics(self) -> dict[str, Any]:
        """The trainer's latest metrics (validation, test) as floats; none before training."""
        if self.trainer is None:
            return {}
        return {k: float(v) for k, v in self.trainer.callback_metrics.items()}

    def write(self, results: dict[str, Any], ending: Ending) -> dict[str, Any]:
        """Writes ``results.json`` (rank zero only) with the ending; returns what was written."""
        results = {**results, **self.fields, **ending.as_results(), "peak_resident_mib": peak_resident_mib()}
        if self.valid_set_names:  # each set's last validation, by name (also flat, as val/<name>/bleu)
            results["valid_sets"] = {
                name: {m: results.get(metric_prefix(name) + m) for m in self.VALID_SET_METRICS}
                for name in self.valid_set_names
            }
        if rank_zero_only.rank == 0:
            text = json.dumps(results, indent=2, sort_keys=True) + "\n"
            with atomic_write(self.output_dir / "results.json") as f:  # a reader never sees half of it
                f.write(text.encode())
        return results
