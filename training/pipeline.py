"""What ``python train.py`` does, as a function of the composed config (tests call it too).

A run is a recipe of named steps, each a screen or less, each reading what the ones before made:

1. :func:`_settings`: the config checked before anything is written: keys that moved, the
   attention mechanisms, the validation sets and the metric that selects checkpoints, the
   precision, BLEU's tokenizer (and its extras), the ``lr`` and ``budget`` groups.
2. :func:`_start`: where the run starts (:mod:`training.start`): fresh, resumed, initialised from a
   checkpoint's weights, or tested; the one checkpoint file involved read once, its vocabulary pinned.
3. :func:`_data`: the corpora prepared, the vocabulary trained or the start point's taken.
4. :func:`_write_config`: ``config.yaml``, once, the vocabulary included.
5. :func:`_module`: the model, its learning rate (:mod:`training.lr`), the start point's weights.
6. :func:`_trainer`: the callbacks (:mod:`training.callbacks`), the loggers, the Trainer, the
   device's fast paths.
7. :func:`_fit`, :func:`_average`, :func:`_test`: training, the averaged weights, the test stage,
   ``results.json`` and the learning curve.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

import training.quiet  # noqa: F401 (third-party noise silenced before a Trainer exists)
from common.metrics import check_bleu_tokenizers
from data.settings import DataSettings
from fastpaths.optimize import optimize
from training.average import average_checkpoints
from training.budget import BudgetSettings
from training.callbacks import InferenceFields, RunCallbacks, run_callbacks
from training.checkpoint_io import AtomicCheckpointIO
from training.checkpoints import plan_checkpoints
from training.config import default_config, plain
from training.ending import FAILED, FINISHED, Ending, ending_after_fit, ending_of_exception
from training.loggers import make_loggers
from training.lr import RateSettings
from training.lr.shapes import FLAT
from training.memory import configure_allocators
from training.module import TranslationModule
from training.moved_keys import refuse_moved
from training.plots import plot_learning_curve
from training.precision import PrecisionChoice, resolve_precision
from training.preemption import Preempted
from training.ranks import RankWatch, ddp_strategy
from training.run_record import RunRecord
from training.selection import Selection, choose_selection
from training.start import INITIALISED, RESUMED, TESTED, StartPoint, start_point
from training.start.init import describe, fresh_state_said, load_weights
from training.start.vocabulary import run_vocabulary
from transformer.mechanisms import AttentionConfig

logger = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fits, optionally averages checkpoints, tests; returns the final metrics.

    Writes into ``cfg.paths.output_dir``: ``config.yaml``, ``checkpoints/``, ``logs/metrics.csv``,
    ``tensorboard/`` (with the default logger), ``tokenizer/``, ``test.<tgt>.hyp``, ``results.json``
    and ``learning_curve.png``. With ``train=false`` the test stage uses the weights of ``ckpt_path``.
    ``results.json`` is written however the run ends, saying how (:mod:`training.ending`): a
    failed or preempted run writes it, then raises on.
    """
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Before training allocates: every step reuses the last one's memory (training/memory.py).
    configure_allocators()
    record = RunRecord(output_dir)
    try:
        return _train(cfg, output_dir, record)
    except BaseException as err:
        ending = ending_of_exception(err, record.trainer)
        record.write(record.metrics(), ending)
        if ending.status == FAILED:
            logger.error("run failed at update %d: %s", ending.update, ending.detail)
        raise


def _train(cfg: DictConfig, output_dir: Path, record: RunRecord) -> dict[str, Any]:
    settings = _settings(cfg, record)
    start = _start(cfg, output_dir, settings, record)
    datamodule = _data(cfg, output_dir, start, record)
    run_config = _write_config(cfg, output_dir, settings.precision, start, datamodule)
    module = _module(cfg, output_dir, start, datamodule, settings)
    trainer, run = _trainer(cfg, output_dir, start, settings, module, datamodule, run_config, record)
    _fit(cfg, trainer, module, datamodule, start, run, settings)
    test_ckpt = _average(cfg, trainer, start, run, record)
    return _test(cfg, trainer, module, datamodule, start, test_ckpt, record)


# ---------------------------------------------------------------------------------- 1. settings


class ConfigError(ValueError):
    """A setting of the config that cannot be used; the message names the key."""


@dataclass(frozen=True)
class RunSettings:
    """What the config says, checked before anything is written or prepared.

    Attributes:
        selection: the metric that chooses the best checkpoint and drives early stopping and plateaus.
        precision: the precision chosen, and why.
        lr: the ``lr`` group; budget: the ``budget`` group.
    """

    selection: Selection
    precision: PrecisionChoice
    lr: RateSettings
    budget: BudgetSettings


def _settings(cfg: DictConfig, record: RunRecord) -> RunSettings:
    """The config checked (module docstring, step 1).

    Raises:
        ConfigError: a bad setting, naming its key (a moved key, naming its new name).
    """
    try:
        return _checked_settings(cfg, record)
    except (MissingMandatoryValue, InterpolationToMissingValueError):
        raise  # a value left to the command line (``???``): train.py names it and how to give it
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _checked_settings(cfg: DictConfig, record: RunRecord) -> RunSettings:
    refuse_moved(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[arg-type]
    # A role a mechanism cannot do is refused at once, naming it (transformer/mechanisms.py).
    attention = AttentionConfig.from_dict(plain(cfg.model.get("attention") or DictConfig({})))
    attention.check_dropout(cfg.model.get("attention_dropout", 0.0))
    data = cfg.data
    sets = DataSettings.from_config(plain(data)).corpora.valid_sets  # every data key checked
    names = [s.name for s in sets]
    metric, select_on = str(cfg.checkpoint.get("metric", "bleu")), cfg.checkpoint.get("select_on")
    selection = choose_selection(metric, select_on, names)
    # BLEU's tokenizer, for every language scored, before an update rather than at the first
    # validation: a missing extra (MeCab) or a mistyped name stops the run now, saying what to install.
    languages = sorted({str(data.tgt_lang), *(s.location.tgt_lang for s in sets)})
    check_bleu_tokenizers(languages, cfg.get("bleu_tokenize"), "bleu_tokenize")
    precision = resolve_precision(cfg)
    record.valid_set_names = names
    record.fields.update(selected_by=selection.monitor)
    record.fields.update(precision=precision.precision, precision_reason=precision.reason)
    lr = RateSettings.from_dict(plain(cfg.lr))
    budget = BudgetSettings.from_dict(plain(cfg.budget))
    if budget.fit == "budget" and cfg.trainer.get("max_time") and lr.schedule in FLAT:
        raise ValueError(
            f"lr.schedule={lr.schedule} keeps the rate (or lowers it on plateaus) and budget.fit=budget "
            "decays it to the budget's end: set budget.fit=none, or another schedule"
        )
    return RunSettings(selection, precision, lr, budget)


# ---------------------------------------------------------------------------------- 2. start


def _start(cfg: DictConfig, output_dir: Path, settings: RunSettings, record: RunRecord) -> StartPoint:
    """Where the run starts (:mod:`training.start`), and the data keys of its vocabulary set: the
    one place the ``data`` config changes."""
    start = start_point(plain(cfg), output_dir, settings.selection, default_config)
    for level, line in start.said:
        logger.log(level, "%s", line)
    if start.kind == INITIALISED:
        record.fields.update(init_from=str(start.path), init_from_updates=start.global_step)
        record.fields.update(finetune_reset=sorted(start.reset))
    for key, value in start.vocabulary.items():
        cfg.data[key] = value
    return start


# ---------------------------------------------------------------------------------- 3. data


def _data(cfg: DictConfig, output_dir: Path, start: StartPoint, record: RunRecord) -> Any:
    """The data module, prepared and set up for fitting (its corpora counted in results.json)."""
    L.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision", "highest"))
    datamodule = instantiate(cfg.data, run_dir=str(output_dir))
    datamodule.prepare_data()
    datamodule.setup("fit")
    if datamodule.listed:  # results.json: what an epoch held of each training corpus
        record.fields.update(corpora=datamodule.corpus_summary)
    if datamodule.filters.active:  # results.json: the pairs data.filters dropped, per training corpus
        record.fields.update(filtered=datamodule.filtered)
    return datamodule


def _write_config(
    cfg: DictConfig, output_dir: Path, precision: PrecisionChoice, start: StartPoint, datamodule: Any
) -> dict[str, Any]:
    """Writes ``config.yaml`` once, naming the vocabulary the run uses (its ``tokenizer/`` files);
    returns the config as every checkpoint stores it (``run_config``)."""
    if not start.vocabulary:  # trained (or found in the cache) for this run, copied into its directory
        joint = datamodule.src_tokenizer is datamodule.tgt_tokenizer
        for key, value in run_vocabulary(output_dir, joint).items():
            cfg.data[key] = value
    (output_dir / "config.yaml").write_text(
        f"# trainer.precision: {precision.requested} -> {precision.precision}: {precision.reason}\n"
        + OmegaConf.to_yaml(cfg, resolve=True)
    )
    return plain(cfg)


# ---------------------------------------------------------------------------------- 5. module


def _module(
    cfg: DictConfig, output_dir: Path, start: StartPoint, datamodule: Any, settings: RunSettings
) -> TranslationModule:
    """The module: the model (the start point's, or the config's with the data's vocabulary), its
    learning rate, and the start point's weights."""
    joint = datamodule.src_tokenizer is datamodule.tgt_tokenizer
    model_cfg = plain(cfg.model)
    model_cfg.update(src_vocab_size=datamodule.src_vocab_size, tgt_vocab_size=datamodule.tgt_vocab_size)
    model_cfg["share_embeddings"] = bool(model_cfg.get("share_embeddings", False) and joint)
    compile = cfg.get("compile", False)  # a bool, or a mapping of torch.compile arguments
    module = TranslationModule(
        model=start.model or model_cfg,  # the checkpoint's, as its weights were built
        optimizer=plain(cfg.optimizer),
        label_smoothing=cfg.label_smoothing,
        decoding=plain(cfg.decoding),
        src_lang=cfg.data.src_lang,
        tgt_lang=cfg.data.tgt_lang,
        compile=plain(compile) if isinstance(compile, DictConfig) else bool(compile),
        max_nonfinite_in_a_row=int(cfg.max_nonfinite_in_a_row),
        loss_normalization=str(cfg.get("loss_normalization", "batch")),
        learning_rate=start.learning_rate(settings.lr, settings.selection.mode),
        output_dir=str(output_dir),
        bleu_tokenize=cfg.get("bleu_tokenize"),  # None: the target language's (common/metrics.py)
    )
    logger.info("model: %s parameters", f"{module.model.num_parameters():,}")
    if start.weights is not None:
        load_weights(module, start.weights, start.path)
    if start.carried is not None and start.carried.epoch_offset is not None:
        datamodule.epoch_offset = start.carried.epoch_offset
    return module


# ---------------------------------------------------------------------------------- 6. trainer


def _checkpoint_dir(cfg: DictConfig, output_dir: Path, start: StartPoint) -> Path:
    """Where checkpoints go: the run's own ``checkpoints/``, or, resuming, the resumed run's, so that
    "best" and "last N" are judged over the whole run (Lightning forgets the best score when the
    directory changes)."""
    if start.kind == RESUMED and start.path is not None and start.path.parent.name == "checkpoints":
        logger.info("checkpoints continue in %s", start.path.parent)
        return start.path.parent
    return output_dir / "checkpoints"


def _trainer(
    cfg: DictConfig,
    output_dir: Path,
    start: StartPoint,
    settings: RunSettings,
    module: TranslationModule,
    datamodule: Any,
    run_config: dict[str, Any],
    record: RunRecord,
) -> tuple[L.Trainer, RunCallbacks]:
    """The callbacks, loggers and Trainer; the device's fast paths applied to the model."""
    ckpt_dir = _checkpoint_dir(cfg, output_dir, start)
    plan = plan_checkpoints(
        ckpt_dir,
        every_n_updates=cfg.checkpoint.every_n_updates,
        keep_last=int(cfg.checkpoint.keep_last),
        average_last=int(cfg.average_last),
        accumulate_grad_batches=int(cfg.trainer.get("accumulate_grad_batches", 1)),
        validates=cfg.trainer.get("limit_val_batches", 1.0) not in (0, 0.0),
        selection=settings.selection,
    )
    resumed = start.kind == RESUMED and cfg.train
    loggers = make_loggers(
        cfg.get("logger"), output_dir, start.run_dir if resumed else None, start.global_step
    )
    extras = {
        "inference_fields": InferenceFields.of(datamodule, cfg.data.src_lang, cfg.data.tgt_lang),
        "run_config": run_config,
        "pad_id": module.pad_id,
        "loggers": loggers,
    }
    run = run_callbacks(cfg, plan, ckpt_dir, start, settings.selection, settings.budget, extras)
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    if run.timer is not None:  # the fit's timer keeps the time instead of Lightning's
        trainer_cfg.pop("max_time")
    ddp_timeout = trainer_cfg.pop("ddp_timeout", None)  # ours, not Trainer arguments
    rendezvous_timeout = trainer_cfg.pop("ddp_rendezvous_timeout", None)
    strategy = ddp_strategy(trainer_cfg.get("strategy", "auto"), ddp_timeout, rendezvous_timeout)
    if ddp_timeout is not None and strategy != "auto":
        run.callbacks.append(RankWatch(float(ddp_timeout), rendezvous_timeout))
    read = (start.path, start.checkpoint) if start.kind in (RESUMED, TESTED) else None
    trainer: L.Trainer = instantiate(
        trainer_cfg,
        strategy=strategy,
        callbacks=run.callbacks,
        logger=loggers,
        default_root_dir=str(output_dir),
        use_distributed_sampler=False,  # the token-bucket sampler splits batches across ranks
        plugins=[AtomicCheckpointIO(read)],
        **plan.trainer_args,
    )
    record.trainer = trainer
    # The device's fast paths, applied to the plain model here, where the program starts, and
    # nowhere inside the model or the module (fastpaths/optimize.py has the table).
    fast_paths = optimize(module.model, trainer.strategy.root_device, "train")
    module.use(fast_paths)
    logger.info("%s", fast_paths.describe())
    return trainer, run


# ---------------------------------------------------------------------------------- 7. fit, average, test


def _fit(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: TranslationModule,
    datamodule: Any,
    start: StartPoint,
    run: RunCallbacks,
    settings: RunSettings,
) -> None:
    """Trains (``train=true``), from the start point; a signal ends it with a checkpoint saved."""
    if not cfg.train:
        return
    if start.kind == RESUMED:
        logger.info("resuming from %s", start.path)
    elif start.kind == INITIALISED and start.carried is not None:
        lr = settings.lr
        said = fresh_state_said(
            describe(start.path, start.checkpoint), lr.peak, lr.warmup_steps, run.plan.best.dirpath,
            start.reset, start.carried.describe(),
        )  # fmt: skip
        logger.info("%s", said)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=start.ckpt_path)
    except SIGTERMException as stop:  # SIGTERM or SIGUSR1: last.ckpt is saved (training/preemption.py)
        preempted = stop if isinstance(stop, Preempted) else run.preemption.preempted(trainer)
        logger.warning("%s", preempted)
        raise preempted from None


def _average(
    cfg: DictConfig, trainer: L.Trainer, start: StartPoint, run: RunCallbacks, record: RunRecord
) -> str | None:
    """Averages the run's last epoch or update checkpoints, or its budget's last part, into
    ``checkpoints/averaged.ckpt``; returns the checkpoint the test stage uses (``test_ckpt``)."""
    fitter, plan = run.fitter, run.plan
    if fitter is not None and fitter.said:  # results.json: what the budget fit set, and why
        record.fields.update(schedule_fit={**fitter.said, "averaged_updates": list(fitter.taken)})
    if not cfg.train or cfg.trainer.get("fast_dev_run"):  # the checkpoint given (or resumed), if any
        return None if start.path is None or start.kind == INITIALISED else str(start.path)
    ckpt_dir = Path(plan.best.dirpath)
    tail = None if fitter is None else fitter.average()
    paths = plan.to_average()
    if tail is not None and trainer.is_global_zero:  # the weights of the budget's last part
        template = plan.last.last_model_path or ckpt_dir / "last.ckpt"
        averaged = average_checkpoints(tail[0], ckpt_dir / "averaged.ckpt", template, tail[1])
        logger.info("averaged the weights of updates %s into %s", fitter.taken, averaged)
    elif paths and trainer.is_global_zero:
        averaged = average_checkpoints(paths, ckpt_dir / "averaged.ckpt")
        logger.info("averaged %d checkpoints into %s", len(paths), averaged)
    chosen = {"best": plan.best.best_model_path, "last": plan.last.last_model_path}
    chosen["averaged"] = str(ckpt_dir / "averaged.ckpt")
    return chosen[cfg.test_ckpt] or None


def _test(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: TranslationModule,
    datamodule: Any,
    start: StartPoint,
    test_ckpt: str | None,
    record: RunRecord,
) -> dict[str, Any]:
    """The test stage, ``results.json`` (with how the run ended) and the learning curve."""
    if cfg.train:
        ending = ending_after_fit(trainer)
    else:
        ending = Ending(FINISHED, trainer.global_step, f"tested {start.path} (train=false)")
    logger.info("run %s at update %d: %s", ending.status, ending.update, ending.detail)
    results = record.metrics()
    if cfg.test:
        trainer.test(module, datamodule=datamodule, ckpt_path=test_ckpt, weights_only=True)
        results.update(record.metrics())
    results = record.write(results, ending)
    metrics_csv = record.output_dir / "logs" / "metrics.csv"
    if cfg.plot and trainer.is_global_zero and metrics_csv.is_file():
        plot_learning_curve(metrics_csv, record.output_dir / "learning_curve.png", title=cfg.name)
    return results


__all__ = ["RunRecord", "default_config", "train"]
