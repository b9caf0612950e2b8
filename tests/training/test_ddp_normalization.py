"""loss_normalization=update on 2 gloo processes: an update over two ranks' batches of 3 and 7
pairs has the gradient of one process's batch of all 10 (the normaliser is the global token
count); the per-batch mean ("batch") does not. Slow: two DDP starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.test_pipeline import ROOT

# A script file, not ``python -c``: Lightning starts rank 1 by running sys.argv[0] again.
SCRIPT = """
import os, sys
import lightning as L
import torch
from torch.utils.data import DataLoader
from data.batching import collate_batch
from data.tokenizer import EOS_ID, SubwordTokenizer
from tests.toy_text import toy_pairs, train_word_spm
from tests.training.test_module import _tiny
from training.module import TranslationModule

ranks, normalization, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pairs = toy_pairs(10, seed=3)
tok = SubwordTokenizer(train_word_spm([s for pair in pairs for s in pair]))
src, tgt = (tok.encode([pair[side] for pair in pairs]) for side in (0, 1))
examples = [{"id": i, "src_ids": s + [EOS_ID], "tgt_ids": t} for i, (s, t) in enumerate(zip(src, tgt))]
parts = [examples[:3], examples[3:]] if ranks == 2 else [examples]
batches = [collate_batch(part) for part in parts]


class RankBatch(torch.utils.data.Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, index):
        return batches[int(os.environ.get("LOCAL_RANK", "0"))]


class Record(L.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_rank == 0:
            torch.save([p.grad.clone() for p in pl_module.model.parameters()], out)


torch.manual_seed(0)
module = TranslationModule(
    _tiny(tok.vocab_size), lr={"peak": 0.0, "warmup_steps": 1}, loss_normalization=normalization
)
trainer = L.Trainer(
    max_steps=1, accelerator="cpu", devices=ranks, strategy="ddp" if ranks == 2 else "auto",
    gradient_clip_val=None, callbacks=[Record()], logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(module, train_dataloaders=DataLoader(RankBatch(), batch_size=None))
"""


@pytest.mark.slow
def test_an_update_over_two_ranks_is_normalised_by_their_tokens_together(tmp_path: Path) -> None:
    script = tmp_path / "update.py"
    script.write_text(SCRIPT)

    def gradients(ranks: int, normalization: str) -> list[torch.Tensor]:
        out = tmp_path / f"{ranks}_{normalization}.pt"
        proc = subprocess.run(
            [sys.executable, str(script), str(ranks), normalization, str(out)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return torch.load(out, weights_only=True)

    one = gradients(1, "update")
    for a, b in zip(gradients(2, "update"), one, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    averaged = gradients(2, "batch")
    assert not all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(averaged, one, strict=True))
