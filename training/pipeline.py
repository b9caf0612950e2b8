"""What ``python train.py`` does, as a function of the composed config (tests call it too)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, EarlyStopping, LearningRateMonitor
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from common.checkpoint_fields import inference_fields
from data.atomic import atomic_write
from data.corpora import parse_valid_sets
from data.corpus import PROJECT_ROOT
from fastpaths.optimize import optimize
from training.attention_image import AttentionImage
from training.averaging import average_checkpoints, write_average
from training.budget import TimeBudgetCheck, max_time_seconds
from training.budget_fit import BudgetFit, BudgetTimer, FitSettings
from training.checkpoints import plan_checkpoints
from training.ema import ExponentialMovingAverage
from training.ending import FAILED, FINISHED, Ending, ending_after_fit, ending_of_exception
from training.finetune import (
    REGULARISATION_KEYS,
    InitPoint,
    check_model,
    fresh_state_said,
    init_point,
    load_weights,
    resumed_tokenizer_keys,
)
from training.finetune_reset import (
    RESETTABLE,
    CarriedOptimizer,
    carried_state,
    carry_callbacks,
    parse_reset,
)
from training.memory import configure_allocators, peak_resident_mib
from training.module import TranslationModule
from training.plateau import PlateauDecay
from training.plots import plot_learning_curve
from training.precision import PrecisionChoice, choose_precision
from training.preemption import Preempted, PreemptionCheckpoint
from training.progress import ProgressBar, RunProgress
from training.ranks import RankWatch, ddp_strategy
from training.resume import (
    ContinuedCSVLogger,
    ResumePoint,
    RunConfig,
    check_config,
    metrics_before,
    read_checkpoint,
    resume_point,
)
from training.schedule import FLAT
from training.selection import DEFAULT_SELECTION, Selection, choose_selection, metric_prefix
from training.vocabulary import resumed_vocabulary
from transformer.mechanisms import AttentionConfig

logger = logging.getLogger(__name__)

# torch's pytree deprecated its LeafSpec class for treespec_leaf() (a FutureWarning at each
# construction, worded "`isinstance(treespec, LeafSpec)` is deprecated"; torch 2.13 warns). Lightning
# (2.6.6, its newest release, and its main branch) still constructs one in
# lightning/pytorch/utilities/_pytree.py:_tree_flatten, which CombinedLoader calls for every
# dataloader the Trainer runs, so every run printed it (Lightning issue #21326). The call is
# Lightning's, not ours, and harmless until torch removes the class: that one warning from that
# one module is ignored, here rather than in pytest's settings, so that train.py's users do not see it.
warnings.filterwarnings(
    "ignore",
    message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    category=FutureWarning,
    module=r"lightning\.pytorch\.utilities\._pytree",
)


class _NoLitLoggerTip(logging.Filter):
    """Drops the advertisement for Lightning's hosted logger that every Trainer prints at start
    (lightning/pytorch/trainer/connectors/logger_connector: "Tip: ... try installing litlogger")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


# The logger Lightning's rank_zero_info writes to (lightning_utilities' rank_zero.log).
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoLitLoggerTip())


def register_resolvers() -> None:
    """``${project_root:}`` and ``${unique_id:}`` (one value per process) for the configs."""
    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))
    if not OmegaConf.has_resolver("unique_id"):
        token = f"{os.getpid()}{secrets.token_hex(2)}"
        OmegaConf.register_new_resolver("unique_id", lambda: token)


register_resolvers()


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer with the project's atomic writer: whole files or none.

    Lightning's own writer goes through fsspec; this one writes every ``best``, ``last`` and
    ``epoch*`` checkpoint with :func:`data.atomic.atomic_write`, as the averaged checkpoint and
    the tokenizer cache are written.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options, got {storage_options!r}")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            torch.save(checkpoint, f)


class InferenceFields(Callback):
    """Stores what translate.py needs (SentencePiece models, languages, ids) in every checkpoint."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["nmt"] = self.fields


def _inference_fields(datamodule: Any, src_lang: str, tgt_lang: str) -> dict[str, Any]:
    joint = datamodule.src_tokenizer is datamodule.tgt_tokenizer
    return inference_fields(
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        src_spm=datamodule.src_tokenizer.model_proto,
        tgt_spm=None if joint else datamodule.tgt_tokenizer.model_proto,
        target_tags=datamodule.target_tags,
    )


def default_config() -> dict:
    """``conf/train.yaml`` composed without overrides: every setting's default (interpolations
    such as the output directory left unresolved: they need a running job)."""
    if GlobalHydra.instance().is_initialized():  # inside train.py's @hydra.main
        return OmegaConf.to_container(compose(config_name="train"))  # type: ignore[return-value]
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="train"))  # type: ignore[return-value]


def _to_plain_dict(cfg: DictConfig) -> dict:
    """``cfg`` as plain dicts and lists with interpolations resolved, as the module's hyperparameters."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def resolve_precision(cfg: DictConfig) -> PrecisionChoice:
    """Sets ``cfg.trainer.precision`` to what the device computes well (``auto``) or keeps it; logs why."""
    choice = choose_precision(cfg.trainer.get("precision", "32-true"), cfg.trainer.get("accelerator", "cpu"))
    cfg.trainer.precision = choice.precision
    if rank_zero_only.rank == 0:
        said = (choice.precision, choice.requested, choice.reason)
        logger.info("precision: %s (trainer.precision=%s): %s", *said)
        if choice.slow_warning:
            logger.warning(choice.slow_warning)
    return choice


# The package each optional logger needs, for a missing one's error message.
LOGGER_PACKAGES = {"WandbLogger": ("wandb", "wandb"), "MLFlowLogger": ("mlflow", "mlflow")}


def make_loggers(cfg: DictConfig, output_dir: Path, resume: ResumePoint | None = None) -> list[Logger]:
    """logs/metrics.csv always, and the ``logger`` group's logger (TensorBoard by default; none for csv).

    Resuming, ``metrics.csv`` starts with the resumed run's rows from before the checkpoint, and
    TensorBoard writes on into the resumed run's ``tensorboard/`` (what the old run logged after the
    checkpoint is purged from view), so that each shows one run, not two pieces.

    Raises:
        ModuleNotFoundError: ``logger=wandb`` or ``logger=mlflow`` without its optional extra.
    """
    previous = metrics_before(resume.run_dir, resume.global_step) if resume is not None else []
    loggers: list[Logger] = [
        ContinuedCSVLogger(save_dir=str(output_dir), name="logs", version="", previous=previous)
    ]
    chosen = cfg.get("logger")
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
    if cls == "TensorBoardLogger" and resume is not None and resume.run_dir is not None:
        return [*loggers, instantiate(chosen, save_dir=str(resume.run_dir), purge_step=resume.global_step)]
    return [*loggers, instantiate(chosen)]


def fit_settings(cfg: DictConfig) -> FitSettings:
    """The ``schedule`` and ``validation`` settings of a run fitted to its budget (``schedule.fit``)."""
    schedule, validation = cfg.get("schedule") or {}, cfg.get("validation") or {}
    defaults = FitSettings()
    return FitSettings(
        warmup_fraction=float(schedule.get("warmup_fraction", defaults.warmup_fraction)),
        average_fraction=float(schedule.get("average_fraction", defaults.average_fraction)),
        refits=int(schedule.get("refits", defaults.refits)),
        drift=float(schedule.get("drift", defaults.drift)),
        max_share=float(validation.get("max_share", defaults.max_share)),
    )


def early_stopping(
    patience: int, min_delta: float, selection: Selection = DEFAULT_SELECTION
) -> EarlyStopping:
    """Stops when the selection metric (validation BLEU by default) has not improved by more than
    ``min_delta`` in ``patience`` validations."""
    if patience < 1:
        raise ValueError(f"early_stopping.patience must be null (off) or at least 1, not {patience}")
    return EarlyStopping(
        monitor=selection.monitor,
        mode=selection.mode,
        patience=patience,
        min_delta=min_delta,
        check_on_train_epoch_end=False,  # judged at every validation, also mid-epoch ones
        verbose=True,
    )


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


def _init_point(cfg: DictConfig, output_dir: Path) -> InitPoint | None:
    """``init_from``'s checkpoint, checked against the run's config, its SentencePiece model(s) put in
    the run and in ``cfg.data``; None without ``init_from`` (training/finetune.py)."""
    if not cfg.get("init_from"):
        return None
    init = init_point(str(cfg.init_from), cfg.get("ckpt_path"))
    check_model(init, _to_plain_dict(cfg.model))
    for key, value in init.tokenizer_keys(_to_plain_dict(cfg.data), output_dir).items():
        cfg.data[key] = value
    src_lang, tgt_lang = cfg.data.src_lang, cfg.data.tgt_lang
    if init.src_lang and (init.src_lang, init.tgt_lang) != (src_lang, tgt_lang):
        logger.warning(
            "init_from: %s was trained on %s->%s, this run trains %s->%s",
            init.path,
            init.src_lang,
            init.tgt_lang,
            src_lang,
            tgt_lang,
        )
    return init


def _selection(cfg: DictConfig) -> tuple[Selection, list[str]]:
    """The metric that chooses the best checkpoint and drives early stopping, and the names of
    ``data.valid_sets``, checked from the config alone (training/selection.py).

    Raises:
        ValueError: a bad ``data.valid_sets`` entry, ``checkpoint.metric`` or
            ``checkpoint.select_on``, naming the key.
    """
    data = cfg.data
    sets = parse_valid_sets(
        _to_plain_dict(data.valid_sets) if data.get("valid_sets") else None,
        data.src_lang,
        data.tgt_lang,
        data.get("data_dir"),
        data.get("hub_id"),
        data.get("hub_config"),
        data.get("valid_split", "val"),
    )
    names = [s.name for s in sets]
    checkpoint = cfg.checkpoint
    return choose_selection(str(checkpoint.get("metric", "bleu")), checkpoint.get("select_on"), names), names


def _train(cfg: DictConfig, output_dir: Path, record: RunRecord) -> dict[str, Any]:
    # The attention mechanisms are checked before anything is written or the data prepared: a role
    # a mechanism cannot do is refused at once, naming it (transformer/mechanisms.py).
    attention = AttentionConfig.from_dict(_to_plain_dict(cfg.model.get("attention") or DictConfig({})))
    attention.check_dropout(cfg.model.get("attention_dropout", 0.0))
    # So are the validation sets and the metric that selects among checkpoints.
    selection, record.valid_set_names = _selection(cfg)
    record.fields.update(selected_by=selection.monitor)
    precision = resolve_precision(cfg)
    record.fields.update(precision=precision.precision, precision_reason=precision.reason)
    # Fine-tuning: the checkpoint is read, and the config checked against its model, before anything
    # is written; its SentencePiece model(s) become the data's, in the config that config.yaml records.
    init = _init_point(cfg, output_dir)
    carried, reset = None, frozenset(RESETTABLE)
    if init is not None:
        record.fields.update(init_from=str(init.path), init_from_updates=init.global_step)
        # What is carried on from it besides the weights (finetune.reset), read and checked now.
        reset = parse_reset(OmegaConf.to_container(cfg.finetune.reset, resolve=True))
        budget_fit = bool(cfg.trainer.get("max_time")) and cfg.schedule.fit == "budget"
        early = cfg.early_stopping.patience is not None
        carried = carried_state(init.path, reset, selection.monitor, early, budget_fit)
        record.fields.update(finetune_reset=sorted(reset))
    (output_dir / "config.yaml").write_text(
        f"# trainer.precision: {precision.requested} -> {precision.precision}: {precision.reason}\n"
        + OmegaConf.to_yaml(cfg, resolve=True)
    )
    # The checkpoint is read and the config compared with its own before the data is prepared (which
    # can take long): a damaged checkpoint or a changed setting stops the run at once (resume.py).
    resume = resume_point(
        cfg.ckpt_path if cfg.train or cfg.ckpt_path else None,
        cfg.paths.runs_dir,
        cfg.name,
        output_dir,
        take_newest_loadable=bool(cfg.resume.take_newest_loadable),
        training=bool(cfg.train),
    )
    if cfg.train and resume is not None:
        # A fine-tuned run resumes with the vocabulary it was given, not one trained on the corpus.
        for key, value in resumed_tokenizer_keys(resume.config, _to_plain_dict(cfg.data)).items():
            cfg.data[key] = value
            logger.info("resume: data.%s=%s, as in the checkpoint's config", key, value)
    run_config = _to_plain_dict(cfg)
    if cfg.train and resume is not None:
        allowed = [str(k) for k in cfg.resume.allow_changes]
        for change in check_config(resume.config, run_config, allowed, default_config()):
            logger.warning("resume: %s", change)
    if cfg.train and resume is not None:
        # The checkpoint's vocabulary, whatever the corpus now is (training/vocabulary.py).
        saved = read_checkpoint(resume.path, training=False)
        keys, said = resumed_vocabulary(
            saved, resume.path, resume.run_dir, _to_plain_dict(cfg.data), output_dir
        )
        for key, value in keys.items():
            cfg.data[key] = value
        if said:
            logger.info("resume: %s", said)
    L.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.get("float32_matmul_precision", "highest"))

    datamodule = instantiate(cfg.data, run_dir=str(output_dir))
    datamodule.prepare_data()
    datamodule.setup("fit")
    if datamodule.listed:  # results.json: what an epoch held of each training corpus
        record.fields.update(corpora=datamodule.corpus_summary)
    if datamodule.filters.active:  # results.json: the pairs data.filters dropped, per training corpus
        record.fields.update(filtered=datamodule.filtered)
    joint = datamodule.src_tokenizer is datamodule.tgt_tokenizer
    model_cfg = _to_plain_dict(cfg.model)
    model_cfg.update(src_vocab_size=datamodule.src_vocab_size, tgt_vocab_size=datamodule.tgt_vocab_size)
    model_cfg["share_embeddings"] = bool(model_cfg.get("share_embeddings", False) and joint)
    if init is not None:
        # The checkpoint's model, as its weights were built (check_model), with this run's
        # regularisation (dropout), which fine-tuning may change.
        regularisation = {k: model_cfg[k] for k in REGULARISATION_KEYS if k in model_cfg}
        model_cfg = {**init.model, **regularisation}
    compile = cfg.get("compile", False)  # a bool, or a mapping of torch.compile arguments
    module = TranslationModule(
        model=model_cfg,
        optimizer=_to_plain_dict(cfg.optimizer),
        label_smoothing=cfg.label_smoothing,
        decoding=_to_plain_dict(cfg.decoding),
        src_lang=cfg.data.src_lang,
        tgt_lang=cfg.data.tgt_lang,
        compile=_to_plain_dict(compile) if isinstance(compile, DictConfig) else bool(compile),
        max_nonfinite_in_a_row=int(cfg.max_nonfinite_in_a_row),
        loss_normalization=str(cfg.get("loss_normalization", "batch")),
    )
    module.output_dir = str(output_dir)
    module.bleu_tokenize = cfg.get("bleu_tokenize")  # None: the target language's (common/metrics.py)
    logger.info("model: %s parameters", f"{module.model.num_parameters():,}")
    if init is not None and resume is not None:  # a requeued SLURM job: its own checkpoint wins
        logger.info("init_from: not loaded; the requeued run resumes from %s", resume.path)
    elif init is not None:
        load_weights(module, init)
        if carried.schedule_offset is not None:
            module.schedule_offset = carried.schedule_offset
        if carried.epoch_offset is not None:
            datamodule.epoch_offset = carried.epoch_offset

    ckpt_path = None if resume is None else str(resume.path)
    ckpt_dir = output_dir / "checkpoints"
    if cfg.train and ckpt_path and Path(ckpt_path).parent.name == "checkpoints":
        # Resuming: keep the checkpoints together, so that "best" and "last N" are judged over
        # the whole run (Lightning forgets the best score when the directory changes).
        ckpt_dir = Path(ckpt_path).parent
        logger.info("checkpoints continue in %s", ckpt_dir)
    plan = plan_checkpoints(
        ckpt_dir,
        every_n_updates=cfg.checkpoint.every_n_updates,
        keep_last=int(cfg.checkpoint.keep_last),
        average_last=int(cfg.average_last),
        accumulate_grad_batches=int(cfg.trainer.get("accumulate_grad_batches", 1)),
        validates=cfg.trainer.get("limit_val_batches", 1.0) not in (0, 0.0),
        selection=selection,
    )
    callbacks: list[Callback] = [
        *plan.callbacks,
        LearningRateMonitor(logging_interval="step"),
        InferenceFields(_inference_fields(datamodule, cfg.data.src_lang, cfg.data.tgt_lang)),
        RunConfig(run_config),
    ]
    progress = RunProgress(pad_id=module.pad_id)
    callbacks.append(progress)
    if cfg.trainer.get("enable_progress_bar", True):
        every = cfg.get("progress_bar_every")
        if every is None:  # every batch on the CPU; on an accelerator, a wait for the GPU every 10
            every = 1 if str(cfg.trainer.get("accelerator", "cpu")) == "cpu" else 10
        callbacks.append(ProgressBar(progress, refresh_rate=int(every)))
    preemption = PreemptionCheckpoint(ckpt_dir)
    if cfg.train:
        callbacks.append(preemption)
    loggers = make_loggers(cfg, output_dir, resume if cfg.train else None)
    if len(loggers) > 1:
        callbacks.append(AttentionImage(index=0))
    ema = cfg.get("ema") or {}
    if ema.get("decay") is not None:  # validation, checkpoints and the test stage take the EMA
        # After AttentionImage: callbacks' validation-end hooks run in this order, and the EMA's
        # puts the training weights back, so the image is drawn from the weights validated.
        callbacks.append(ExponentialMovingAverage(float(ema.decay)))
    if cfg.optimizer.schedule == "plateau":  # the rate lowered where the selection metric stalls
        opt = cfg.optimizer
        callbacks.append(
            PlateauDecay(
                selection.monitor,
                selection.mode,
                float(opt.plateau_factor),
                int(opt.plateau_patience),
                float(opt.min_lr_ratio),
            )
        )
    stopping = cfg.early_stopping
    stopper = None
    if stopping.patience is not None:
        stopper = early_stopping(int(stopping.patience), float(stopping.min_delta), selection)
        callbacks.append(stopper)
    if carried is not None and resume is None:  # the checkpoint's state, where finetune.reset keeps it
        carry_callbacks(carried, plan.best, stopper)
        if carried.optimizer is not None:
            callbacks.append(CarriedOptimizer(carried.optimizer, carried.path))
    fitter = None
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    if cfg.train and cfg.trainer.get("max_time"):
        max_time = trainer_cfg["max_time"]
        budget_s = max_time_seconds(max_time)
        warmup, average = int(cfg.optimizer.warmup_steps), int(cfg.average_last)
        every_n = cfg.checkpoint.every_n_updates
        fit = cfg.get("schedule", {}).get("fit", "none")
        if fit == "budget":  # the schedule, the averaged weights and validation fitted to the budget
            opt = cfg.optimizer
            if opt.schedule in FLAT:
                raise ValueError(
                    f"optimizer.schedule={opt.schedule} keeps the rate (or lowers it on plateaus) and "
                    "schedule.fit=budget decays it to the budget's end: "
                    "set schedule.fit=none, or another schedule"
                )
            fitter = BudgetFit(
                budget_s,
                fit_settings(cfg),
                opt.schedule,
                int(opt.warmup_steps),
                float(opt.min_lr_ratio),
                average,
                every_n,
            )
            callbacks += [fitter, BudgetTimer(duration=trainer_cfg.pop("max_time"), interval="step")]
        elif fit == "none":
            callbacks.append(TimeBudgetCheck(budget_s, warmup, average, every_n))
        else:
            raise ValueError(f"schedule.fit={fit!r} is not one of budget, none")
    ddp_timeout = trainer_cfg.pop("ddp_timeout", None)  # ours, not Trainer arguments
    rendezvous_timeout = trainer_cfg.pop("ddp_rendezvous_timeout", None)
    strategy = ddp_strategy(trainer_cfg.get("strategy", "auto"), ddp_timeout, rendezvous_timeout)
    if ddp_timeout is not None and strategy != "auto":
        callbacks.append(RankWatch(float(ddp_timeout), rendezvous_timeout))
    trainer: L.Trainer = instantiate(
        trainer_cfg,
        strategy=strategy,
        callbacks=callbacks,
        logger=loggers,
        default_root_dir=str(output_dir),
        use_distributed_sampler=False,  # the token-bucket sampler splits batches across ranks
        plugins=[AtomicCheckpointIO()],
        **plan.trainer_args,
    )
    record.trainer = trainer
    # The device's fast paths, applied to the plain model here, where the program starts, and
    # nowhere inside the model or the module (fastpaths/optimize.py has the table).
    fast_paths = optimize(module.model, trainer.strategy.root_device, "train")
    module.use(fast_paths)
    logger.info("%s", fast_paths.describe())

    test_ckpt = ckpt_path  # without training, test the given checkpoint
    if cfg.train:
        if ckpt_path:
            logger.info("resuming from %s", ckpt_path)
        elif init is not None:
            opt = cfg.optimizer
            said = fresh_state_said(
                init, float(opt.lr), int(opt.warmup_steps), ckpt_dir, reset, carried.describe()
            )
            logger.info("%s", said)
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        except SIGTERMException as stop:  # SIGTERM or SIGUSR1: last.ckpt is saved (training/preemption.py)
            preempted = stop if isinstance(stop, Preempted) else preemption.preempted(trainer)
            logger.warning("%s", preempted)
            raise preempted from None
    if fitter is not None and fitter.said:  # results.json: what the budget fit set, and why
        record.fields.update(schedule_fit={**fitter.said, "averaged_updates": list(fitter.taken)})
    if cfg.train and not cfg.trainer.get("fast_dev_run"):
        tail = None if fitter is None else fitter.average()
        paths = plan.to_average()
        if tail is not None and trainer.is_global_zero:  # the weights of the budget's last part
            template = plan.last.last_model_path or ckpt_dir / "last.ckpt"
            averaged = write_average(tail, template, ckpt_dir / "averaged.ckpt", fitter.taken)
            logger.info("averaged the weights of updates %s into %s", fitter.taken, averaged)
        elif paths and trainer.is_global_zero:
            averaged = average_checkpoints(paths, ckpt_dir / "averaged.ckpt")
            logger.info("averaged %d checkpoints into %s", len(paths), averaged)
        test_ckpt = {
            "best": plan.best.best_model_path,
            "last": plan.last.last_model_path,
            "averaged": str(ckpt_dir / "averaged.ckpt"),
        }[cfg.test_ckpt] or None

    if cfg.train:
        ending = ending_after_fit(trainer)
    else:
        ending = Ending(FINISHED, trainer.global_step, f"tested {ckpt_path} (train=false)")
    logger.info("run %s at update %d: %s", ending.status, ending.update, ending.detail)
    results = record.metrics()
    if cfg.test:
        trainer.test(module, datamodule=datamodule, ckpt_path=test_ckpt, weights_only=True)
        results.update(record.metrics())
    results = record.write(results, ending)
    metrics_csv = output_dir / "logs" / "metrics.csv"
    if cfg.plot and trainer.is_global_zero and metrics_csv.is_file():
        plot_learning_curve(metrics_csv, output_dir / "learning_curve.png", title=cfg.name)
    return results
