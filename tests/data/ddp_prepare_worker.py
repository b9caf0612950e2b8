"""One rank of the 2-process CPU DDP test (tests/data/test_ddp_preparation.py); run by it, not by pytest.

Usage: ``RANK=r LOCAL_RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m
tests.data.ddp_prepare_worker CORPUS_DIR CACHE_DIR OUT_JSON``. The rank calls ``prepare_data``
itself, as ``train.py`` does on every rank before the Trainer exists (all ranks at once under
``torchrun`` or SLURM), then fits through a DDP Trainer (gloo), which calls ``prepare_data`` on
local rank 0 and ``setup`` on every rank. It records how often it read, trained SentencePiece
and encoded.
"""

from __future__ import annotations

import json
import sys

import lightning as L
import torch

from data import prepared as prepared_mod
from data import spm_training
from data import tokenizer as tok_mod
from data.datamodule import TranslationDataModule

COUNTS = {"corpus_splits_written": 0, "sentencepiece_trained": 0, "encode_calls": 0}


def _counted(module: object, name: str, key: str) -> None:
    original = getattr(module, name)

    def counted(*args: object, **kwargs: object) -> object:
        COUNTS[key] += 1
        return original(*args, **kwargs)

    setattr(module, name, counted)


class Recorder(L.LightningModule):
    """Records the example ids of its training batches."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.ids: list[int] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.ids += batch["ids"].tolist()
        return (self.w * batch["src"].float().mean()).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(corpus_dir: str, cache_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    _counted(prepared_mod, "write_pairs", "corpus_splits_written")
    _counted(spm_training, "train_sentencepiece", "sentencepiece_trained")
    _counted(tok_mod.SubwordTokenizer, "encode", "encode_calls")
    dm = TranslationDataModule(data_dir=corpus_dir, vocab_size=64, max_tokens=300, cache_dir=cache_dir)
    dm.prepare_data()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=cache_dir,
    )
    module = Recorder()
    trainer.fit(module, datamodule=dm)
    result = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "counts": COUNTS,
        "fingerprint": dm.src_tokenizer.fingerprint,
        "vocab_size": dm.src_vocab_size,
        "ids": module.ids,
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
