"""Each validation's cross-attention of one fixed validation sentence, as an image in the loggers.

The first validation sentence (of the first validation set) is translated greedily by the model
as it is at that validation, and its last decoder layer's cross-attention (heads averaged) is
drawn as in translate.py's ``--attention-dir``, so a run's IMAGES tab in TensorBoard shows the
alignment forming.
"""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

from common.attention_plot import attention_figure, figure_pixels

logger = logging.getLogger(__name__)

TAG = "val/cross_attention"


def log_image(loggers: list[Logger], pixels: np.ndarray, step: int) -> int:
    """Gives ``pixels`` [height, width, 3] uint8 to every logger that takes images; returns how many."""
    n = 0
    for lg in loggers:
        if isinstance(lg, TensorBoardLogger):
            lg.experiment.add_image(TAG, pixels, global_step=step, dataformats="HWC")
        elif isinstance(lg, WandbLogger):
            lg.log_image(key=TAG, images=[pixels], step=step)
        elif isinstance(lg, MLFlowLogger):
            lg.experiment.log_image(lg.run_id, pixels, f"cross_attention/step{step:08d}.png")
        else:
            continue  # the CSV logger takes no images
        n += 1
    return n


class AttentionImage(Callback):
    """Logs the cross-attention heatmap of validation sentence ``index`` after every validation.

    Args:
        index: which validation sentence (0: the first of the file); fixed for the whole run.
    """

    def __init__(self, index: int = 0) -> None:
        self.index = index

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        datamodule = trainer.datamodule
        text = datamodule.source_texts(datamodule.validation_splits[0])[self.index]
        src_ids = datamodule.src_tokenizer.encode([text])[0]
        model = pl_module.model
        src = torch.tensor([src_ids + [pl_module.eos_id]], device=pl_module.device)  # (1, S)
        out = pl_module.searcher.search(src, pl_module.decoding.stage("valid"))[0][0].tokens
        tgt_in = torch.tensor([[pl_module.bos_id] + out], device=pl_module.device)  # (1, T)
        weights = model.cross_attention_weights(src, tgt_in)[-1][0].float().mean(dim=0).cpu()  # (T, S)
        src_labels = datamodule.src_tokenizer.id_to_piece(src_ids + [pl_module.eos_id])
        out_labels = datamodule.tgt_tokenizer.id_to_piece(out + [pl_module.eos_id])
        title = f"validation sentence {self.index}, step {trainer.global_step}, last layer, heads averaged"
        pixels = figure_pixels(attention_figure(weights, src_labels, out_labels, title))
        log_image(trainer.loggers, pixels, trainer.global_step)
