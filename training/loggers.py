"""The run's loggers: ``logs/metrics.csv`` always, and the ``logger`` group's (TensorBoard by default).

A resumed run's history continues: ``metrics.csv`` starts with the resumed run's rows from before
the checkpoint (:func:`metrics_before`, :class:`ContinuedCSVLogger`), and TensorBoard writes on
into the resumed run's ``tensorboard/`` (what the old run logged after the checkpoint is purged from
view), so that each shows one run, not two pieces.
"""

from __future__ import annotations

import csv
import importlib.util
import warnings
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from omegaconf import DictConfig

# The package each optional logger needs, for a missing one's error message.
LOGGER_PACKAGES = {"WandbLogger": ("wandb", "wandb"), "MLFlowLogger": ("mlflow", "mlflow")}


def make_loggers(
    chosen: DictConfig | None, output_dir: Path, resumed_dir: Path | None = None, resumed_step: int = 0
) -> list[Logger]:
    """logs/metrics.csv always, and ``chosen`` (the ``logger`` group's config; none for csv).

    Args:
        chosen: the ``logger`` config group (its ``_target_``), or None/empty for the CSV alone.
        output_dir: this run's directory.
        resumed_dir: the run a resumed run continues (its metrics and TensorBoard go on), or None.
        resumed_step: the update its checkpoint holds.

    Raises:
        ModuleNotFoundError: ``logger=wandb`` or ``logger=mlflow`` without its optional extra.
    """
    previous = metrics_before(resumed_dir, resumed_step) if resumed_dir is not None else []
    loggers: list[Logger] = [
        ContinuedCSVLogger(save_dir=str(output_dir), name="logs", version="", previous=previous)
    ]
    if not chosen:  # logger=csv (an empty group option) or ~logger
        return loggers
    cls = str(chosen._target_).rsplit(".", 1)[-1]
    if cls in LOGGER_PACKAGES:
        package, extra = LOGGER_PACKAGES[cls]
        if importlib.util.find_spec(package) is None:
            raise ModuleNotFoundError(
                f"logger={extra} needs the {package} package, an optional extra: "
                f'python3 -m pip install -e ".[{extra}]" (or choose logger=tensorboard or logger=csv)'
            )
    if cls == "TensorBoardLogger" and resumed_dir is not None:
        return [*loggers, instantiate(chosen, save_dir=str(resumed_dir), purge_step=resumed_step)]
    return [*loggers, instantiate(chosen)]


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
