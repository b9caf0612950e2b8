"""An exponential moving average (EMA) of the weights, validated, tested and translated with.

After every optimizer update ``ema = decay * ema + (1 - decay) * weights`` (the first update
copies the weights), by ``torch.optim.swa_utils.AveragedModel`` with
``get_ema_multi_avg_fn`` (one ``_foreach_lerp_`` over all parameters). The EMA is what the run is
judged and used by, as fairseq's ``--ema-decay`` and Marian's ``--exponential-smoothing`` do:

- validation (its loss, and BLEU, which the module's ``on_validation_epoch_end`` searches for; the
  best checkpoint, early stopping) runs with the EMA in the model's parameters, the training
  weights put back at ``on_validation_end``;
- every checkpoint's ``state_dict`` holds the EMA, so that translate.py, checkpoint averaging and
  the test stage (which loads a checkpoint) use it; the training weights, which the optimizer's
  state belongs to, are kept beside it under ``"ema"``, and a resumed run trains on from them with
  the EMA restored exactly;
- after fitting, the model holds the EMA (a test stage without a checkpoint uses it too).

Lightning's ``WeightAveraging`` callback does much the same, but it averages the whole
LightningModule, swaps weights through ``.data`` (which bypasses the version counters the CPU's
packed inference weights are keyed on: ``fastpaths/packed.py``), keeps the average on the
device the module had before the strategy moved it, and copies the average into the model at
``on_train_end``, before ``ModelCheckpoint`` may write ``last.ckpt`` there, whose training
weights would then be the average.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

logger = logging.getLogger(__name__)

# The module's attribute that holds the Transformer, and so the prefix of its keys in ``state_dict``.
MODEL = "model"


def _param_keys(model: nn.Module) -> list[str]:
    """The ``state_dict`` keys of ``model``'s parameters, each name of a tied one included."""
    return [f"{MODEL}.{name}" for name, _ in model.named_parameters(remove_duplicate=False)]


def _params(model: nn.Module) -> list[Tensor]:
    return [p.detach() for p in model.parameters()]


class ExponentialMovingAverage(Callback):
    """Keeps an EMA of ``pl_module.model``'s parameters and validates, saves and ends with it.

    Args:
        decay: weight of the old average at each update, in (0, 1); 0.9999 averages over ~10,000
            updates, 0.999 over ~1,000.

    Raises:
        ValueError: ``decay`` outside (0, 1), naming ``ema.decay``.
    """

    def __init__(self, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema.decay must be within (0, 1) (null: no EMA), not {decay}")
        self.decay = decay
        self.average: AveragedModel | None = None  # made when fitting starts
        self._updated_at = 0  # trainer.global_step at the last EMA update
        self._training_weights: list[Tensor] | None = None  # put aside while validating

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return  # testing loads a checkpoint's state_dict: the EMA already
        # Buffers (the sinusoidal table, random features) are not averaged: the model's own are used.
        self.average = AveragedModel(
            getattr(pl_module, MODEL), multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=False
        )
        self.average.requires_grad_(False)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The strategy has moved the model to its device since setup (and a resume restored the
        # average on the CPU): the average goes where the weights it follows are.
        if self.average is not None:
            self.average.to(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._updated_at = trainer.global_step  # a resumed run's updates so far are in the average

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Once per optimizer update: not after the batches that only accumulate gradients, nor
        # after an update the non-finite guard skipped (the step count did not move).
        if self.average is not None and trainer.global_step > self._updated_at:
            self.average.update_parameters(getattr(pl_module, MODEL))
            self._updated_at = trainer.global_step

    # ------------------------------------------------------------------ validation

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.average is None:
            return
        params = _params(getattr(pl_module, MODEL))
        self._training_weights = [p.clone() for p in params]
        with torch.no_grad():  # in place, through the version counters: packed weights repack
            torch._foreach_copy_(params, _params(self.average.module))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not at the epoch's end: Lightning calls the callbacks' on_validation_epoch_end before the
        # module's, where the module searches and scores (training/evaluation.py), so validation BLEU,
        # the best checkpoint and early stopping would judge the training weights. A checkpoint saved
        # by another callback before this one holds the same (on_save_checkpoint: mid-validation).
        if self._training_weights is None:
            return
        with torch.no_grad():
            torch._foreach_copy_(_params(getattr(pl_module, MODEL)), self._training_weights)
        self._training_weights = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After every checkpoint of the fit: the model ends with the EMA, and the average is let go
        # (a test stage's checkpoint restore must not treat its weights as a training state).
        if self.average is None:
            return
        with torch.no_grad():
            torch._foreach_copy_(_params(getattr(pl_module, MODEL)), _params(self.average.module))
        self.average = None

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self.average is None:
            return
        state = checkpoint["state_dict"]
        model = getattr(pl_module, MODEL)
        keys = _param_keys(model)
        if self._training_weights is None:
            training = {k: state[k] for k in keys}
        else:  # saved mid-validation: the model holds the EMA, the training weights are aside
            by_param = dict(zip([id(p) for p in model.parameters()], self._training_weights, strict=True))
            named = dict(model.named_parameters(remove_duplicate=False))
            training = {k: by_param[id(named[k[len(MODEL) + 1 :]])].clone() for k in keys}
        averaged = dict(self.average.module.named_parameters(remove_duplicate=False))
        state.update({k: averaged[k[len(MODEL) + 1 :]].detach().clone() for k in keys})
        checkpoint["ema"] = {
            "decay": self.decay,
            "n_averaged": self.average.n_averaged.detach().clone(),
            "training_weights": training,
        }

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Called after Lightning loaded the checkpoint's state_dict (the EMA) into the module.
        if self.average is None:
            return
        model = getattr(pl_module, MODEL)
        weights = {
            k[len(MODEL) + 1 :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(MODEL + ".")
        }
        self.average.module.load_state_dict(weights)
        saved = checkpoint.get("ema")
        if saved is None:
            # A checkpoint of a run without EMA (allowed by resume.allow_changes): the average
            # starts from its weights at the next update.
            logger.info("ema: the checkpoint holds no EMA; it starts at the next update")
            return
        trained = {k[len(MODEL) + 1 :]: v for k, v in saved["training_weights"].items()}
        model.load_state_dict({**weights, **trained})
        self.average.n_averaged.copy_(saved["n_averaged"])
