"""An update makes the host wait for the device nowhere (counted on the CPU: tests/host_syncs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from data.batching import collate_batch
from data.tokenizer import EOS_ID, SubwordTokenizer
from tests.host_syncs import HostSyncs
from tests.toy_text import toy_pairs, train_word_spm
from training.module import TranslationModule
from training.progress import RunProgress


def _toy_batches(n: int) -> tuple[list[dict], int]:
    """``n`` batches of toy pairs of different lengths, and the vocabulary size."""
    pairs = toy_pairs(12 * n, seed=7)
    tok = SubwordTokenizer(train_word_spm([s for pair in pairs for s in pair]))
    src, tgt = tok.encode([s for s, _ in pairs]), tok.encode([t for _, t in pairs])
    examples = [
        {"id": i, "src_ids": s + [EOS_ID], "tgt_ids": t}
        for i, (s, t) in enumerate(zip(src, tgt, strict=True))
    ]
    return [collate_batch(examples[12 * i : 12 * (i + 1)]) for i in range(n)], tok.vocab_size


class CountUpdates(L.Callback):
    """Counts the syncing calls from each training batch's start to its end: the forward pass, the
    loss, the backward pass, clipping, the non-finite guard and the optimizer step (first callback)."""

    def __init__(self) -> None:
        self.per_update: list[list[tuple[str, str]]] = []
        self._mode: HostSyncs | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self._mode = HostSyncs().__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self._mode.__exit__(None, None, None)
        self.per_update.append(self._mode.calls)


# bf16 autocast, as a GPU trains (the block loss keeps its logit gradient, as it does on a GPU);
# fused Adam, the default, which skips a non-finite update on the device.
@pytest.mark.parametrize("normalization, accumulate", [("batch", 1), ("update", 2)])
def test_a_bf16_update_with_fused_adam_makes_no_host_synchronisation(normalization, accumulate):
    torch.manual_seed(0)
    batches, vocab = _toy_batches(6)
    model = dict(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=4, n_encoder_layers=1,
        n_decoder_layers=1, d_ff=64, dropout=0.1, share_embeddings=True,
    )  # fmt: skip
    module = TranslationModule(model, lr={"peak": 1e-3, "warmup_steps": 4}, loss_normalization=normalization)
    count = CountUpdates()
    trainer = L.Trainer(
        accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1.0, max_steps=6 // accumulate,
        accumulate_grad_batches=accumulate, callbacks=[count],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    assert trainer.optimizers[0].defaults["fused"] is True
    assert len(count.per_update) == 6 and module.nonfinite.pending == []
    waits = [f"batch {i}: {op} at {where}" for i, calls in enumerate(count.per_update) for op, where in calls]
    assert not waits, "\n".join(waits)


def test_the_counter_sees_what_would_wait():
    x = torch.arange(6.0)
    with HostSyncs() as syncs:
        float(x.sum()), x[x > 2], x.tolist(), bool(x.any()), x.nonzero()
        x.index_select(0, torch.tensor([1, 2])), x.masked_fill(x > 2, 0.0)  # these wait for nothing
    ops = [op for op, _ in syncs.calls]
    assert ops == [
        "aten._local_scalar_dense.default", "aten.index.Tensor", "Tensor.tolist",
        "aten._local_scalar_dense.default", "aten.nonzero.default",
    ]  # fmt: skip
    assert all("test_host_syncs.py" in where for _, where in syncs.calls)


def test_the_runs_progress_counts_tokens_from_the_host_made_positions():
    batches, _ = _toy_batches(1)
    progress = RunProgress(pad_id=0)
    trainer = SimpleNamespace(global_step=0, callbacks=[], log_every_n_steps=50, is_global_zero=True)
    progress._marks.append((0.0, 0, 0))
    with HostSyncs() as syncs:
        progress.on_train_batch_end(trainer, None, None, batches[0], 0)  # accumulating: no update yet
    assert syncs.calls == []
    assert progress._tokens == int((batches[0]["tgt_out"] != 0).sum())
