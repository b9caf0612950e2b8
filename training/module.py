"""The Lightning module: loss, optimisation, validation BLEU, test-time beam search.

Built from plain hyperparameters (dicts of numbers and strings), so that a checkpoint loads
with ``torch.load(weights_only=True)`` and without Hydra.

``compile`` runs the training forward and loss (:func:`token_losses`) through ``torch.compile``;
only that: validation and test (loss and search) run the model as it is, and the compiled
function is not a submodule, so the checkpoint of a compiled run is the same as an eager run's
(keys ``model.*``, no ``_orig_mod.``) and loads without ``torch.compile``.

The module is device-blind: the program that trains applies the device's fast paths
(``fastpaths.optimize``) and hands their loss and search kernels over (:meth:`TranslationModule.use`).
Validation and the test stage decode through ``decoding.Searcher``, as ``translate.py`` does: the
sources of the stage are collected batch by batch and searched at its end, batched longest first
under the device's budget.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.metrics import CorpusScores, corpus_scores
from data.corpora import valid_split_key
from data.tokenizer import SPECIAL_IDS
from decoding import DecodingConfig, Searcher, SearchKernels, SearchSettings
from training.loss import LossFunction, cross_entropy
from training.memory import peak_resident_mib, release_free_memory, resident_mib
from training.nonfinite import NonFiniteGuard, UpdatePlace, nonfinite_flags, total_grad_norm
from training.optimizer import OPTIMIZERS, build_optimizer, group_weight_decay
from training.progress import host_value
from training.schedule import NEEDS_TOTAL, SCHEDULES, schedule_factor
from training.schedule_fit import FittedSchedule
from training.selection import metric_prefix
from transformer import Transformer, TransformerConfig

logger = logging.getLogger(__name__)

# Devices where ``optimizer.fused: null`` chooses PyTorch's fused Adam (one kernel for all
# parameters); it has a CPU kernel since PyTorch 2.4, within pyproject's range.
FUSED_ADAM_DEVICES = ("cuda", "cpu")

# How an update's gradient is normalised (TranslationModule's ``loss_normalization``): "batch",
# the mean of each batch's per-token mean loss; "update", the update's summed loss over its tokens.
LOSS_NORMALIZATIONS = ("batch", "update")

DEFAULT_OPTIMIZER = {
    "name": "adam",
    "lr": 5e-4,
    "betas": (0.9, 0.98),
    "eps": 1e-9,
    "weight_decay": 0.0,
    "warmup_steps": 4000,
    "schedule": "inverse_sqrt",
    "total_steps": None,
    "min_lr_ratio": 0.0,
    "plateau_factor": 0.5,
    "plateau_patience": 2,
    "fused": None,
}


@dataclass(frozen=True)
class EvalDecoding(SearchSettings):
    """The test stage's decoding (:class:`~decoding.config.SearchSettings`) and validation's beam.

    Attributes:
        valid_beam_size: beam size of the validation BLEU each epoch, with the test stage's
            ``alpha`` and length limit; 1 is greedy search, the fastest.
    """

    valid_beam_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.valid_beam_size < 1:
            raise ValueError(f"valid_beam_size must be at least 1, not {self.valid_beam_size}")

    def stage(self, split: str) -> DecodingConfig:
        """The search of a stage: validation's (``valid_beam_size``; 1 greedy) or the test's."""
        beam = self.beam_size if split == "test" else self.valid_beam_size
        settings = {f.name: getattr(self, f.name) for f in fields(SearchSettings)}
        return DecodingConfig(**{**settings, "beam_size": beam}, greedy=beam == 1)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EvalDecoding:
        """From the ``decoding`` hyperparameters; missing settings take their defaults.

        Raises:
            ValueError: a setting that is not a field, or a value the fields refuse.
        """
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"decoding: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return cls(**values)


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


def gather_objects(items: list[Any]) -> list[Any]:
    """Concatenates ``items`` from every rank (all ranks get the whole list); a no-op alone."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return items
    gathered: list[list[Any]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


def token_losses(
    model: nn.Module,
    src: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    pad_id: int,
    label_smoothing: float,
    loss_function: LossFunction = cross_entropy,
    positions: Tensor | None = None,
) -> Tensor:
    """Label-smoothed cross-entropy of every target token, zero at padding.

    The forward pass and the loss in one function: what ``compile`` compiles.

    Args:
        model: a ``Transformer``: ``model(src, tgt_in, project=False)`` is the decoder output
            [batch, tgt_len, d_model], ``model.output`` the projection to the vocabulary.
        src: [batch, src_len] source ids; tgt_in: [batch, tgt_len] BOS + target ids.
        tgt_out: [batch, tgt_len] target ids + EOS, right-padded with ``pad_id``.
        pad_id: the padding id (ignored positions).
        label_smoothing: epsilon of label smoothing.
        loss_function: the output projection and the loss (``training.loss``): the plain
            ``F.cross_entropy`` of the logits, or a faster equal from ``fastpaths.optimize``.
        positions: [N] flat positions of ``tgt_out``'s real tokens, known on the host
            (``data.batching.collate_columns``' ``tgt_positions``); None: found on the device.

    Returns:
        [batch, tgt_len] losses, 0 at padding.
    """
    hidden = model(src, tgt_in, project=False)  # (B, T, d_model)
    output = model.output
    return loss_function(
        hidden, output.weight, output.bias, tgt_out, pad_id, label_smoothing, positions=positions
    )  # (B, T)


def compile_options(compile: bool | dict | None) -> dict | None:
    """``torch.compile`` keyword arguments from the ``compile`` setting; None: do not compile.

    ``False``/``None``: None; ``True``: ``{}`` (torch.compile's defaults: inductor, shapes made
    dynamic after the first change); a dict: those arguments, e.g. ``{"mode": "max-autotune"}``.
    """
    if compile is None or compile is False:
        return None
    if compile is True:
        return {}
    return _checked_plain_dict("compile", compile)


class TranslationModule(L.LightningModule):
    """Trains a ``Transformer`` with label-smoothed cross-entropy and scores it with sacreBLEU.

    Args:
        model: ``TransformerConfig`` fields (vocabulary sizes included).
        optimizer: ``name`` (``adam`` or ``adamw``: :mod:`training.optimizer`), its settings ``lr``
            (peak), ``betas``, ``eps``, ``weight_decay``, ``fused`` (None: fused on CUDA and the CPU
            unless fp16 scales the gradients); the schedule (:mod:`training.schedule`): its name
            ``schedule`` (``inverse_sqrt``, ``cosine``, ``linear``), ``warmup_steps``, and for the
            decaying ones ``total_steps`` (None: the Trainer's estimate) and ``min_lr_ratio``.
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
        compile: ``torch.compile`` the training forward and loss: False (default), True, or a
            dict of ``torch.compile`` arguments (see :func:`compile_options`). Not a
            hyperparameter: how this process runs the model, not what the checkpoint holds.
        max_nonfinite_in_a_row: stop (:class:`~training.nonfinite.NonFiniteError`) after this many
            updates in a row with a non-finite loss or gradient; each is skipped. Not a
            hyperparameter either.
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
    ) -> None:
        super().__init__()
        model = _checked_plain_dict("model", model)
        optimizer = {**DEFAULT_OPTIMIZER, **_checked_plain_dict("optimizer", optimizer)}
        optimizer["betas"] = tuple(optimizer["betas"])
        if optimizer["name"] not in OPTIMIZERS:  # refused when the config is read, not at fit
            raise ValueError(f"optimizer.name={optimizer['name']!r} is not one of {', '.join(OPTIMIZERS)}")
        if optimizer["schedule"] not in SCHEDULES:
            raise ValueError(
                f"optimizer.schedule={optimizer['schedule']!r} is not one of {', '.join(SCHEDULES)}"
            )
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
        # The learning-rate multiplier by update: the configured schedule (configure_optimizers), and
        # from where a time-limited run fitted one to its budget (training/budget_fit.py), that one.
        self.configured_factor: Callable[[int], float] = lambda step: 1.0
        self.fitted_schedule: FittedSchedule | None = None
        # optimizer.schedule=plateau: the multiplier training.plateau.PlateauDecay lowers (else 1).
        self.lr_scale = 1.0
        # Updates the configured schedule has already run: a fine-tuned run continuing its
        # checkpoint's schedule (training/finetune_reset.py) sets it; checkpoints keep it.
        self.schedule_offset = 0
        self.output_dir: str | None = None  # where the test stage writes its translations
        self.test_scores: CorpusScores | None = None
        # Per split evaluated (each validation set's, or "test"), this rank's batches: the host's
        # (example id, source ids) rows, and each sentence's summed NLL and target tokens on the device.
        self._eval_records: dict[str, list[tuple[list[tuple[int, list[int]]], Tensor, Tensor]]] = {}
        self._last_batch_end: float | None = None
        self.compile_options = compile_options(compile)
        # sacreBLEU's tokenizer for BLEU; None: the target language's (common/metrics.py). Not a
        # hyperparameter: how this process scores, not what the checkpoint holds.
        self.bleu_tokenize: str | None = None
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
        # A resumed run gets Adam's settings and the schedule's peak back from the checkpoint; the
        # hyperparameters (the config, where resume.allow_changes let it differ) then win. Unchanged,
        # this sets the values the restore did, by LambdaLR's own expression.
        opt = self.hparams.optimizer
        optimizer = self.optimizers(use_pl_optimizer=False)
        scheduler = self.lr_schedulers()
        if scheduler is None:
            return
        scheduler.base_lrs = [float(opt["lr"])] * len(optimizer.param_groups)
        for group, lr_lambda, base_lr in zip(
            optimizer.param_groups, scheduler.lr_lambdas, scheduler.base_lrs, strict=True
        ):
            weight_decay = group_weight_decay(group, opt["weight_decay"])  # AdamW's vectors stay at 0
            group.update(betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=weight_decay)
            group["initial_lr"] = base_lr
            group["lr"] = base_lr * lr_lambda(scheduler.last_epoch)
        # The optimizer's groups are what the optimizer, the progress bar and LearningRateMonitor
        # read; the scheduler's get_last_lr() follows at its next step.

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
            lr=opt["lr"],
            betas=tuple(opt["betas"]),
            eps=opt["eps"],
            weight_decay=opt["weight_decay"],
            fused=bool(fused),
        )
        name = opt["schedule"]
        total = self._total_updates() if name in NEEDS_TOTAL else None
        self.configured_factor = schedule_factor(
            name, int(opt["warmup_steps"]), total, float(opt["min_lr_ratio"])
        )
        # LambdaLR counts the steps taken from 0; update k (from 1) takes lr_factor(k).
        schedule = torch.optim.lr_scheduler.LambdaLR(adam, lambda step: self.lr_factor(step + 1))
        return {"optimizer": adam, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def lr_factor(self, step: int) -> float:
        """The multiplier of the peak rate at update ``step`` (from 1): the configured schedule's,
        or from where one was fitted to a time budget (``training/budget_fit.py``) the fitted one's,
        times ``lr_scale`` (lowered on plateaus by ``training/plateau.py``). The configured schedule
        is read ``schedule_offset`` updates on (a fine-tuned run continuing its checkpoint's)."""
        fitted = self.fitted_schedule
        if fitted is not None and step >= fitted.start:
            return fitted.factor(step) * self.lr_scale
        return self.configured_factor(step + self.schedule_offset) * self.lr_scale

    def _total_updates(self) -> int:
        """The run's optimizer updates, where the schedule decays to its floor.

        ``optimizer.total_steps``, else Lightning's ``estimated_stepping_batches`` (the fewer of
        ``trainer.max_steps`` and ``trainer.max_epochs`` times the updates of an epoch).

        Raises:
            ValueError: neither bounds the run (or there is no Trainer), naming the settings.
        """
        total = self.hparams.optimizer["total_steps"]
        if total is not None:
            return int(total)
        trainer = self._trainer
        estimated = float("inf") if trainer is None else trainer.estimated_stepping_batches
        if not math.isfinite(estimated):
            raise ValueError(
                f"optimizer.schedule={self.hparams.optimizer['schedule']} needs the run's number of updates: "
                "set optimizer.total_steps, or bound the run with trainer.max_steps or trainer.max_epochs"
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

    # --------------------------------------------------------- validation / test

    @property
    def searcher(self) -> Searcher:
        """The model as ``translate.py`` searches it (``decoding.Searcher``), with this run's kernels."""
        return Searcher(self.model, self.bos_id, self.eos_id, self.search_kernels)

    def _eval_step(self, batch: dict[str, Tensor], split: str) -> None:
        """The batch's loss, and its sources kept for the stage's search: one read by the host."""
        nll, n_tokens = self.loss(batch, label_smoothing=0.0)
        src = batch["src"]
        head = torch.stack([batch["ids"], batch["src_lengths"]], dim=1).to(src.dtype)
        rows = [(row[0], row[2 : 2 + row[1]]) for row in torch.cat([head, src], dim=1).tolist()]
        self._eval_records.setdefault(split, []).append((rows, nll, n_tokens))

    def _search(self, split: str) -> list[tuple[int, float, int, list[int]]]:
        """This rank's sentences of ``split``: (example id, summed NLL, target tokens, output ids),
        their outputs searched at once, as ``translate.py`` searches (``decoding.Searcher``)."""
        batches = self._eval_records.pop(split, [])
        if not batches:
            return []
        numbers = torch.cat([torch.stack([b[1].double(), b[2].double()], dim=1) for b in batches])
        nll, n_tokens = zip(*numbers.tolist(), strict=True)  # one read for the stage
        # (example id, source ids with EOS) of every real pair (filler rows have id -1).
        kept = [(r, i) for i, r in enumerate(row for found, _, _ in batches for row in found) if r[0] >= 0]
        sources = [ids[:-1] if ids and ids[-1] == self.eos_id else ids for (_, ids), _ in kept]
        found = self.searcher.search_ids(sources, self.decoding.stage(split), self.decoding_budget)
        return [
            (id_, nll[i], int(n_tokens[i]), hyps[0].tokens if hyps else [])
            for ((id_, _), i), hyps in zip(kept, found, strict=True)
        ]

    def on_validation_end(self) -> None:
        # After the epoch's checkpoint (callbacks' hooks run first): what validation held, and the
        # holes training's batches left, go back to the kernel (training/memory.py).
        release_free_memory()

    def on_test_start(self) -> None:
        release_free_memory()  # training's and averaging's freed memory, before the search

    def on_validation_epoch_start(self) -> None:
        self._eval_records = {}

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        # One loader per validation set, in the data module's order of their splits.
        split = self.trainer.datamodule.validation_splits[dataloader_idx]
        self._eval_step(batch, split)

    def on_test_epoch_start(self) -> None:
        self._eval_records = {}

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def _score(self, split: str) -> tuple[CorpusScores, float, list[str]]:
        """Gathers every rank's outputs of ``split`` by example id (once each) and scores the whole
        split. Every rank calls it for every split evaluated, in the same order, records or not:
        the gather is collective."""
        records = self._search(split)
        by_id = {rec[0]: rec for rec in gather_objects(records)}  # drops sampler repeats
        datamodule = self.trainer.datamodule
        references = datamodule.reference_texts(split)
        ids = sorted(by_id)
        if len(ids) < len(references) and self.trainer.is_global_zero:
            # Only with limit_*_batches / fast_dev_run: say so rather than pass a subset off as the split.
            logger.warning(
                "%s: scoring %d of %d sentences (batches were limited)", split, len(ids), len(references)
            )
        records = [by_id[i] for i in ids]
        hypotheses = datamodule.tgt_tokenizer.decode([rec[3] for rec in records])
        nll = sum(rec[1] for rec in records) / max(sum(rec[2] for rec in records), 1)
        refs = [references[i] for i in ids]
        lang = datamodule.split_target_lang(split) if hasattr(datamodule, "split_target_lang") else ""
        scores = corpus_scores(hypotheses, refs, lang or self.hparams.tgt_lang, self.bleu_tokenize)
        return scores, nll, hypotheses

    def on_validation_epoch_end(self) -> None:
        """Scores and logs each validation set: ``val/bleu``, ``val/chrf``, ``val/loss``, ``val/ppl``
        for the main validation split, ``val/<name>/bleu`` and the rest for each of
        ``data.valid_sets`` (training/selection.py)."""
        if self.trainer.sanity_checking:
            self._eval_records = {}
            return
        names = self.trainer.datamodule.valid_set_names or [None]
        said = []
        for name in names:
            scores, nll, _ = self._score(valid_split_key(name))
            ppl = float(torch.tensor(nll).exp())
            prefix = metric_prefix(name)
            metrics = {"loss": nll, "ppl": ppl, "bleu": scores.bleu, "chrf": scores.chrf, "ter": scores.ter}
            for metric, value in metrics.items():
                # The main split's four in the progress bar, as always; of several sets, their BLEU.
                shown = (name is None and metric != "ter") or metric == "bleu"
                # add_dataloader_idx=False: the names say the set (Lightning would append
                # /dataloader_idx_<i> to what is logged while a loader's index is current).
                self.log(
                    prefix + metric,
                    value,
                    prog_bar=shown,
                    sync_dist=False,
                    rank_zero_only=False,
                    add_dataloader_idx=False,
                )
            said.append(("" if name is None else f" {name}", nll, ppl, scores))
        # Where a run's memory goes, validation by validation (results.json has the run's peak).
        memory = {"memory/resident_mib": resident_mib(), "memory/peak_resident_mib": peak_resident_mib()}
        self.log_dict(memory, sync_dist=False, rank_zero_only=False, add_dataloader_idx=False)
        if not self.trainer.is_global_zero:
            return
        mib = memory["memory/resident_mib"], memory["memory/peak_resident_mib"]
        resident = f"; resident {mib[0]:.0f} MiB, peak {mib[1]:.0f}"
        for i, (label, nll, ppl, scores) in enumerate(said):
            logger.info(
                "epoch %d validation%s: loss %.4f ppl %.2f BLEU %.2f chrF %.2f TER %.2f  (%s)%s",
                self.current_epoch,
                label,
                nll,
                ppl,
                scores.bleu,
                scores.chrf,
                scores.ter,
                scores.bleu_signature,
                resident if i == len(said) - 1 else "",  # the memory once, after the last set
            )

    def on_test_epoch_end(self) -> None:
        scores, nll, hypotheses = self._score("test")
        self.test_scores = scores
        self.log_dict(
            {
                "test/bleu": scores.bleu,
                "test/bleu_lc": scores.bleu_lowercase,
                "test/chrf": scores.chrf,
                "test/ter": scores.ter,
            },
            rank_zero_only=False,
        )
        if self.trainer.is_global_zero:
            complete = len(hypotheses) == len(self.trainer.datamodule.reference_texts("test"))
            if self.output_dir is not None and complete:  # a partial file would misalign with the test set
                path = Path(self.output_dir) / f"test.{self.hparams.tgt_lang}.hyp"
                path.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
                logger.info("test translations written to %s", path)
            logger.info("test (beam %d):\n%s", self.decoding.beam_size, scores.report())

    # -------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every rank's RNG states (dropout draws differently on each), gathered in rank order: a
        # resumed run continues exactly on every rank. Every rank builds the checkpoint; rank 0 writes it.
        checkpoint["rng"] = {"per_rank": gather_objects([rng_states(self.device)])}
        self.nonfinite.settle(self._trainer, wait=True)  # pending flags read, under this trainer's rank
        checkpoint["nonfinite"] = self.nonfinite.state_dict()
        if self.fitted_schedule is not None:  # a resumed run keeps the schedule fitted to its budget
            checkpoint["fitted_schedule"] = self.fitted_schedule.state_dict()
        if self.schedule_offset:  # and a fine-tuned run the schedule it continued
            checkpoint["schedule_offset"] = self.schedule_offset

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
        if "fitted_schedule" in checkpoint:
            self.fitted_schedule = FittedSchedule.from_state_dict(checkpoint["fitted_schedule"])
        self.schedule_offset = int(checkpoint.get("schedule_offset", 0))


def rng_states(device: torch.device) -> dict[str, Tensor]:
    """This process's RNG states: the CPU's, and the CUDA (or MPS) device's it trains on."""
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    if device.type == "mps":
        states["mps"] = torch.mps.get_rng_state()
    return states


def set_rng_states(rng: dict[str, Any], rank: int, world_size: int, device: torch.device) -> None:
    """Restores rank ``rank``'s states from a checkpoint's ``rng`` (:func:`rng_states` of every rank).

    On another number of processes than were saved, rank ``r`` takes the states of saved rank
    ``r % saved`` and rank 0 warns once that the run can no longer be bit-exact (the batches
    each rank sees change too). Checkpoints written before per-rank states held rank 0's alone
    (``torch``, and ``cuda`` for every visible GPU); they are read as one saved rank.
    """
    if "per_rank" in rng:
        saved = rng["per_rank"]
    else:
        cuda = rng.get("cuda")
        old = {"torch": rng["torch"]}
        if cuda is not None and device.type == "cuda" and (device.index or 0) < len(cuda):
            old["cuda"] = cuda[device.index or 0]
        saved = [old]
    if len(saved) != world_size and rank == 0:
        logger.warning(
            "resuming on %d process(es) from a checkpoint of %d: the batches each rank trains on and its"
            " dropout draws change, so the run can no longer be bit-exact with one never stopped",
            world_size,
            len(saved),
        )
    states = saved[rank % len(saved)]
    torch.set_rng_state(states["torch"])
    if "cuda" in states and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"], device)
    if "mps" in states and device.type == "mps":
        torch.mps.set_rng_state(states["mps"])
