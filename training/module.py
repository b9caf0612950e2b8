"""The Lightning module: loss, optimisation, and (mixed in) validation BLEU and test-time search.

Built from plain hyperparameters (dicts of numbers and strings), so that a checkpoint loads
with ``torch.load(weights_only=True)`` and without Hydra.

``compile`` runs the training forward and loss (:func:`token_losses`) through ``torch.compile``;
only that: validation and test (loss and search) run the model as it is, and the compiled
function is not a submodule, so the checkpoint of a compiled run is the same as an eager run's
(keys ``model.*``, no ``_orig_mod.``) and loads without ``torch.compile``.

The module is device-blind: the program that trains applies the device's fast paths
(``fastpaths.optimize``) and hands their loss and search kernels over (:meth:`TranslationModule.use`).
Its learning rate is one object (:class:`training.lr.LearningRate`), which the optimizer's
scheduler alone applies; validation and the test stage are :mod:`training.evaluation`'s.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from typing import Any

import torch
from torch import Tensor

from data.tokenizer import SPECIAL_IDS
from decoding import SearchKernels
from training.evaluation import EvalDecoding, EvaluationSteps, gather_objects
from training.loss import LossFunction, compile_options, cross_entropy, token_losses
from training.lr import LearningRate, RateScheduler, RateSettings
from training.moved_keys import split_legacy_optimizer
from training.nonfinite import NonFiniteGuard, UpdatePlace, nonfinite_flags, total_grad_norm
from training.optimizer import OPTIMIZERS, build_optimizer, group_weight_decay
from training.progress import host_value
from training.rng import rng_states, set_rng_states
from transformer import Transformer, TransformerConfig

logger = logging.getLogger(__name__)

# Devices where ``optimizer.fused: null`` chooses PyTorch's fused Adam (one kernel for all
# parameters); it has a CPU kernel since PyTorch 2.4, within pyproject's range.
FUSED_ADAM_DEVICES = ("cuda", "cpu")

# How an update's gradient is normalised (TranslationModule's ``loss_normalization``): "batch",
# the mean of each batch's per-token mean loss; "update", the update's summed loss over its tokens.
LOSS_NORMALIZATIONS = ("batch", "update")

# The optimizer's own settings (the ``optimizer`` config group); its rate is the ``lr`` group's.
DEFAULT_OPTIMIZER = {
    "name": "adam",
    "betas": (0.9, 0.98),
    "eps": 1e-9,
    "weight_decay": 0.0,
    "fused": None,
}

__all__ = [
    "EvalDecoding",
    "TranslationModule",
    "compile_options",
    "gather_objects",
    "rng_states",
    "set_rng_states",
    "token_losses",
]


def _checked_plain_dict(name: str, value: Any) -> dict:
    """A copy of the hyperparameter ``value``, a plain dict ({} for None); TypeError for anything else.

    Hyperparameters are saved into every checkpoint, and ``torch.load(weights_only=True)`` refuses
    OmegaConf objects: a DictConfig is refused here, for the caller to convert (as
    ``training.pipeline`` does), rather than converted silently.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a plain dict (OmegaConf.to_container), not {type(value).__name__}")
    return dict(value)


class TranslationModule(EvaluationSteps):
    """Trains a ``Transformer`` with label-smoothed cross-entropy and scores it with sacreBLEU.

    Args:
        model: ``TransformerConfig`` fields (vocabulary sizes included).
        optimizer: ``name`` (``adam`` or ``adamw``: :mod:`training.optimizer`), its settings
            ``betas``, ``eps``, ``weight_decay``, ``fused`` (None: fused on CUDA and the CPU unless
            fp16 scales the gradients). (A checkpoint's from before the ``lr`` group, which held
            the rate's keys too, is read as both.)
        lr: the learning rate's settings (:class:`training.lr.RateSettings`: ``peak``,
            ``schedule``, ``warmup_steps``, ``total_steps``, ``min_ratio``, ``plateau_factor``,
            ``plateau_patience``); missing ones take their defaults.
        label_smoothing: epsilon of label smoothing (0.1 in the paper).
        loss_normalization: what an update's gradient is divided by (:data:`LOSS_NORMALIZATIONS`):
            ``"batch"`` (default), each batch's loss is its mean over its target tokens, and
            accumulated batches (and DDP's ranks) are averaged; ``"update"`` (fairseq's), the sum
            over every target token of the update, all batches and ranks, divided by their number.
        decoding: :class:`EvalDecoding` fields: ``beam_size``, ``alpha`` (length penalty) and
            ``max_len_a``/``max_len_b`` for the test stage, ``valid_beam_size`` for validation;
            missing ones take their defaults.
        special_ids: ``pad_id``, ``unk_id``, ``bos_id``, ``eos_id`` of the vocabularies.
        src_lang, tgt_lang: languages, stored so that a checkpoint says what it translates.

    The rest are not hyperparameters (how this process runs, not what the checkpoint holds):

    Args:
        compile: ``torch.compile`` the training forward and loss: False (default), True, or a
            dict of ``torch.compile`` arguments (see :func:`compile_options`).
        max_nonfinite_in_a_row: stop (:class:`~training.nonfinite.NonFiniteError`) after this many
            updates in a row with a non-finite loss or gradient; each is skipped.
        learning_rate: the run's :class:`~training.lr.LearningRate` (its plateau's direction, a
            schedule carried on from a checkpoint), made from ``lr`` when None.
        output_dir: where the test stage writes its translations; None: nowhere.
        bleu_tokenize: sacreBLEU's tokenizer for BLEU; None: the target language's.
    """

    def __init__(
        self,
        model: dict,
        optimizer: dict | None = None,
        label_smoothing: float = 0.1,
        decoding: dict | None = None,
        special_ids: dict | None = None,
        src_lang: str = "de",
        tgt_lang: str = "en",
        compile: bool | dict = False,
        max_nonfinite_in_a_row: int = 10,
        loss_normalization: str = "batch",
        lr: dict | None = None,
        learning_rate: LearningRate | None = None,
        output_dir: str | None = None,
        bleu_tokenize: str | None = None,
    ) -> None:
        super().__init__()
        model = _checked_plain_dict("model", model)
        optimizer, legacy_lr = split_legacy_optimizer(_checked_plain_dict("optimizer", optimizer))
        optimizer = {**DEFAULT_OPTIMIZER, **optimizer}
        optimizer["betas"] = tuple(optimizer["betas"])
        if optimizer["name"] not in OPTIMIZERS:  # refused when the config is read, not at fit
            raise ValueError(f"optimizer.name={optimizer['name']!r} is not one of {', '.join(OPTIMIZERS)}")
        settings = RateSettings.from_dict({**legacy_lr, **_checked_plain_dict("lr", lr)})
        if learning_rate is not None and lr is not None and learning_rate.settings != settings:
            raise ValueError(f"lr={lr} and the learning rate given ({learning_rate.settings}) differ")
        self.learning_rate = learning_rate or LearningRate(settings)
        self.decoding = EvalDecoding.from_dict(_checked_plain_dict("decoding", decoding))
        special_ids = {**SPECIAL_IDS, **_checked_plain_dict("special_ids", special_ids)}
        if loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(
                f"loss_normalization={loss_normalization!r} is not one of {', '.join(LOSS_NORMALIZATIONS)}"
            )
        self.save_hyperparameters(
            {
                "model": model,
                "optimizer": optimizer,
                "lr": self.learning_rate.settings.to_dict(),
                "label_smoothing": label_smoothing,
                "loss_normalization": loss_normalization,
                "decoding": asdict(self.decoding),
                "special_ids": special_ids,
                "src_lang": src_lang,
                "tgt_lang": tgt_lang,
            }
        )
        # The plain model; a program applies its device's fast paths to it (fastpaths.optimize, use()).
        self.model = Transformer(TransformerConfig.from_dict({**model, "pad_id": special_ids["pad_id"]}))
        self.pad_id, self.bos_id, self.eos_id = (special_ids[k] for k in ("pad_id", "bos_id", "eos_id"))
        self.loss_function: LossFunction = cross_entropy  # eager; the plain loss unless use() says
        self.compiled_loss_function: LossFunction = cross_entropy  # the same inside torch.compile
        self.search_kernels = SearchKernels()  # the plain search unless use() says
        self.decoding_budget: int | None = None  # tokens a decoding batch holds; None: the device's
        self.output_dir = output_dir
        self.bleu_tokenize = bleu_tokenize
        self.test_scores = None  # the test stage's CorpusScores, once tested
        # Per split evaluated (each validation set's, or "test"), this rank's batches: the host's
        # (example id, source ids) rows, and each sentence's summed NLL and target tokens on the device.
        self._eval_records: dict[str, list[tuple[list[tuple[int, list[int]]], Tensor, Tensor]]] = {}
        self._last_batch_end: float | None = None
        self.compile_options = compile_options(compile)
        self._compiled_losses = None  # torch.compile(token_losses), made on first training use
        self.nonfinite = NonFiniteGuard(max_nonfinite_in_a_row)
        self._batch_ids: Tensor | None = None  # the last training batch's example ids, for messages
        self._update_tokens = 0  # target tokens of this rank's batches since the last update

    def use(self, paths: Any) -> None:
        """Takes the loss and search kernels that ``fastpaths.optimize`` chose for the device
        (a ``FastPaths``; its ``None`` fields keep the plain ones). The model's module swaps were
        made by that call."""
        self.loss_function = paths.loss or cross_entropy
        self.compiled_loss_function = paths.compiled_loss or cross_entropy
        self.search_kernels = paths.search

    # ------------------------------------------------------------------ training

    def loss(self, batch: dict[str, Tensor], label_smoothing: float) -> tuple[Tensor, Tensor]:
        """Per-sentence summed loss [batch] and target token counts [batch] (padding ignored).

        Compiled (with ``compile``) only while training with autograd on; evaluation runs eager.
        """
        losses, loss_function = token_losses, self.loss_function
        if self.compile_options is not None and self.training and torch.is_grad_enabled():
            if self._compiled_losses is None:
                self._compiled_losses = torch.compile(token_losses, **self.compile_options)
            losses, loss_function = self._compiled_losses, self.compiled_loss_function
        target = batch["tgt_out"]
        token_loss = losses(
            self.model,
            batch["src"],
            batch["tgt_in"],
            target,
            self.pad_id,
            label_smoothing,
            loss_function,
            positions=batch.get("tgt_positions"),
        )
        return token_loss.sum(dim=1), (target != self.pad_id).sum(dim=1)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """The batch's mean loss per target token (the summed loss, under ``loss_normalization:
        update``). Nothing here waits for the device: the token count is the length of the
        host-made ``tgt_positions`` (``data.batching.collate_columns``; a batch without them is
        counted on the device, and its loss finds its positions there)."""
        loss_sum, n_tokens = self.loss(batch, self.hparams.label_smoothing)
        positions = batch.get("tgt_positions")
        tokens = int(n_tokens.sum()) if positions is None else positions.numel()
        loss = loss_sum.sum() / max(tokens, 1)
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens)
        self.log("train/lr", host_value(self.optimizers().param_groups[0]["lr"]), prog_bar=True)
        self._tokens_in_step = tokens
        self._batch_ids = batch.get("ids")  # read for a message only, when an update was skipped
        if self.hparams.loss_normalization == "update":
            # Summed: the update's gradient is divided by its tokens once they are all counted
            # (optimizer_step), so that every target token of the update weighs the same.
            self._update_tokens += self._tokens_in_step
            return loss_sum.sum()
        return loss

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        """Runs Lightning's closure (forward, backward), then steps only if loss and gradients are finite.

        With a fused Adam and no fp16 loss scaler, the skip is decided on the device (the flags are
        the optimizer's ``found_inf``) and the host waits for nothing; otherwise the host decides.
        Logs the gradient norm before clipping (``train/grad_norm``) and the updates skipped so far
        (``train/skipped_updates``); see :mod:`training.nonfinite`.
        """
        loss = optimizer_closure()
        if self.hparams.loss_normalization == "update":
            self._divide_gradients_by_update_tokens()
        scaler = self._grad_scaler()
        grad_norm = total_grad_norm(list(self.model.parameters()))
        if scaler is not None:  # fp16: the gradients are still scaled here
            grad_norm = grad_norm / scaler.get_scale()
        flags = nonfinite_flags(loss, grad_norm, check_grads=scaler is None)
        inner = getattr(optimizer, "optimizer", optimizer)  # Lightning's wrapper holds the optimizer
        on_device = scaler is None and bool(inner.defaults.get("fused"))
        where = UpdatePlace.of(self.trainer, batch_idx, self._batch_ids)
        step = self.nonfinite.decide(self.trainer, flags, where, on_device)
        self.log("train/grad_norm", grad_norm, on_step=True, on_epoch=False)
        self.log("train/skipped_updates", host_value(self.nonfinite.skipped), on_step=True, on_epoch=False)
        if not step:
            optimizer.zero_grad(set_to_none=True)
            return
        if on_device:
            inner.found_inf = flags.amax()  # fused Adam leaves everything as it was where it is 1
        try:
            # The closure has run: hand the precision plugin its result (it unscales and clips).
            optimizer.step(closure=lambda: loss)
        finally:
            if on_device:
                del inner.found_inf

    def on_train_epoch_end(self) -> None:
        self.nonfinite.settle(self.trainer, wait=True)  # the epoch's last updates' flags

    def on_train_end(self) -> None:
        self.nonfinite.settle(self.trainer, wait=True)

    def _divide_gradients_by_update_tokens(self) -> None:
        """Turns the update's gradient of summed losses into that of their mean over its target tokens.

        Lightning divided each batch's summed loss by ``accumulate_grad_batches`` before its
        backward, and DDP averaged the ranks' gradients; the gradient is multiplied back by both
        and divided by the target tokens of every batch of the update on every rank (one scalar
        all-reduce), fairseq's normalisation. It is linear, so fp16's still scaled gradients and
        the clipping and non-finite checks that follow see the normalised gradient.
        """
        trainer = self.trainer
        local, self._update_tokens = self._update_tokens, 0
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if trainer.world_size == 1:  # the host has the count
            if grads:
                torch._foreach_mul_(grads, trainer.accumulate_grad_batches / max(local, 1))
            return
        # The ranks' counts meet on the device, and the scale stays there (no host wait): the count
        # goes over from pinned memory without blocking.
        count = torch.full((), float(local), dtype=torch.float64)
        if self.device.type == "cuda":
            count = count.pin_memory()
        total = trainer.strategy.reduce(count.to(self.device, non_blocking=True), reduce_op="sum")
        scale = (trainer.accumulate_grad_batches * trainer.world_size / total.clamp(min=1.0)).float()
        if grads:
            torch._foreach_mul_(grads, scale)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_batch_end is not None:
            tok_s = self._tokens_in_step / max(now - self._last_batch_end, 1e-9)
            self.log("train/tok_s", host_value(tok_s), prog_bar=True, on_step=True, on_epoch=False)
        self._last_batch_end = now

    def on_train_epoch_start(self) -> None:
        self._last_batch_end = None  # do not count validation time as training time

    def _grad_scaler(self) -> Any:
        """The trainer's fp16 gradient scaler, or None (fp32, bf16, or no trainer)."""
        trainer = self._trainer  # the property raises without a trainer
        return None if trainer is None else getattr(trainer.precision_plugin, "scaler", None)

    def on_train_start(self) -> None:
        # A resumed run gets Adam's settings back from the checkpoint; the hyperparameters (the
        # config, where resume.allow_changes let it differ) then win, and the learning rate sets the
        # coming update's rate (its peak this run's lr.peak). Unchanged, this sets what the restore did.
        opt = self.hparams.optimizer
        optimizer = self.optimizers(use_pl_optimizer=False)
        for group in optimizer.param_groups:
            weight_decay = group_weight_decay(group, opt["weight_decay"])  # AdamW's vectors stay at 0
            group.update(betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=weight_decay)
        scheduler = self.lr_schedulers()
        if isinstance(scheduler, RateScheduler):
            scheduler.apply()

    def configure_optimizers(self) -> dict:
        opt = self.hparams.optimizer
        fused = opt.get("fused")
        if fused is None:
            # Auto: one fused kernel per step on CUDA and on the CPU (on the recipe's model, 5 ms
            # a step against the per-tensor path's 19: BENCHMARKS.md, "Training speed"). Not with
            # fp16's GradScaler, which must unscale gradients before they are clipped, and a fused
            # Adam unscales inside step().
            device = next(self.model.parameters()).device.type
            fused = device in FUSED_ADAM_DEVICES and self._grad_scaler() is None
        adam = build_optimizer(
            self.model,
            opt["name"],
            lr=self.learning_rate.settings.peak,
            betas=tuple(opt["betas"]),
            eps=opt["eps"],
            weight_decay=opt["weight_decay"],
            fused=bool(fused),
        )
        self.learning_rate.start(self._total_updates)
        schedule = RateScheduler(adam, self.learning_rate)  # the one writer of the rate
        return {"optimizer": adam, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def _total_updates(self) -> int:
        """The run's optimizer updates, where a decaying schedule without ``lr.total_steps`` ends:
        Lightning's ``estimated_stepping_batches`` (the fewer of ``trainer.max_steps`` and
        ``trainer.max_epochs`` times the updates of an epoch).

        Raises:
            ValueError: neither bounds the run (or there is no Trainer), naming the settings.
        """
        trainer = self._trainer
        estimated = float("inf") if trainer is None else trainer.estimated_stepping_batches
        if not math.isfinite(estimated):
            raise ValueError(
                f"lr.schedule={self.learning_rate.settings.schedule} needs the run's number of updates: "
                "set lr.total_steps, or bound the run with trainer.max_steps or trainer.max_epochs"
            )
        return int(estimated)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Lightning's mixed-precision plugin refuses to clip for any fused optimizer, bf16 included,
        # because a fused Adam unscales fp16 gradients inside step(). Without a scaler (fp32, bf16)
        # the gradients are not scaled, and clipping them as they are is right.
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        if (
            gradient_clip_val
            and fused
            and self._grad_scaler() is None
            and gradient_clip_algorithm in (None, "norm")
        ):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # -------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every rank's RNG states (dropout draws differently on each), gathered in rank order: a
        # resumed run continues exactly on every rank. Every rank builds the checkpoint; rank 0 writes it.
        checkpoint["rng"] = {"per_rank": gather_objects([rng_states(self.device)])}
        self.nonfinite.settle(self._trainer, wait=True)  # pending flags read, under this trainer's rank
        checkpoint["nonfinite"] = self.nonfinite.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rng = checkpoint.get("rng")
        if rng is not None:
            trainer = self._trainer
            if trainer is None:
                set_rng_states(rng, 0, 1, self.device)
            else:  # the module may not be on its device yet: the strategy's device is where it trains
                set_rng_states(rng, trainer.global_rank, trainer.world_size, trainer.strategy.root_device)
        if "nonfinite" in checkpoint:
            self.nonfinite.load_state_dict(checkpoint["nonfinite"])
        move_legacy_rate_state(checkpoint)


def move_legacy_rate_state(checkpoint: dict[str, Any]) -> None:
    """Moves the learning rate's parts of a checkpoint written before they were one state (the
    module's ``schedule_offset`` and ``fitted_schedule``, the ``PlateauDecay`` callback's) into its
    scheduler's state, where :class:`~training.lr.RateScheduler` reads them. Called before
    Lightning restores the schedulers and callbacks."""
    offset = checkpoint.pop("schedule_offset", None)
    fitted = checkpoint.pop("fitted_schedule", None)
    callbacks = checkpoint.get("callbacks") or {}
    plateau_keys = [key for key in callbacks if key.startswith("PlateauDecay")]
    plateau = callbacks.pop(plateau_keys[0]) if plateau_keys else None
    schedulers = checkpoint.get("lr_schedulers") or []
    if not schedulers or "rate" in schedulers[0]:
        return
    schedulers[0]["rate"] = {"shape": None, "offset": offset or 0, "fitted": fitted, "plateau": plateau}
