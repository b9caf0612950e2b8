"""Training in the precision trainer.precision=auto picks for the device (on a GPU bf16-mixed, or
16-mixed where bf16 is not native), with the fast paths ``fastpaths.optimize`` gives it, eager and
compiled: finite, decreasing loss; fused Adam where no fp16 loss scaler is in the way; the
matmuls in that precision. On the CPU (eager, in CI) and on CUDA (marked ``gpu``)."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from data.batching import collate_batch
from data.tokenizer import EOS_ID, SubwordTokenizer
from fastpaths.optimize import optimize
from tests.toy_text import toy_pairs, train_word_spm
from training.module import TranslationModule
from training.precision import choose_precision


def _toy_batch() -> tuple[dict, int]:
    """40 toy pairs in one batch, and the vocabulary size."""
    pairs = toy_pairs(40, seed=5)
    tok = SubwordTokenizer(train_word_spm([s for pair in pairs for s in pair]))
    src, tgt = tok.encode([s for s, _ in pairs]), tok.encode([t for _, t in pairs])
    examples = [
        {"id": i, "src_ids": s + [EOS_ID], "tgt_ids": t}
        for i, (s, t) in enumerate(zip(src, tgt, strict=True))
    ]
    return collate_batch(examples), tok.vocab_size


class RecordSteps(L.Callback):
    """The loss and the parameters' device of every step, and the dtype of the last decoder layer's
    feed-forward output. (The device is read during training: at the end of ``fit`` Lightning's
    ``Strategy.teardown`` moves the module back to the CPU.)"""

    def __init__(self, watch_logits: bool) -> None:
        self.watch_logits = watch_logits  # not inside a compiled graph: dynamo would trace the hook
        self.losses: list[float] = []
        self.devices: set[str] = set()
        self.ffn_dtypes: set[torch.dtype] = set()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.watch_logits:
            hook = pl_module.model.decoder.layers[-1].ffn.register_forward_hook
            hook(lambda module, inputs, out: self.ffn_dtypes.add(out.dtype))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.losses.append(float(outputs["loss"]))
        self.devices.add(next(pl_module.model.parameters()).device.type)


@pytest.mark.parametrize(
    "accelerator, compile",
    [
        ("cpu", False),
        pytest.param("gpu", False, marks=pytest.mark.gpu, id="gpu-eager"),
        pytest.param("gpu", True, marks=pytest.mark.gpu, id="gpu-compiled"),
    ],
)
def test_auto_precision_training_gives_finite_decreasing_loss(accelerator, compile):
    precision = choose_precision("auto", accelerator).precision
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision, torch.float32)
    torch.manual_seed(0)
    batch, vocab = _toy_batch()
    model = dict(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=64, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=128, dropout=0.1, share_embeddings=True,
    )  # fmt: skip
    module = TranslationModule(model, lr={"peak": 3e-3, "warmup_steps": 10}, compile=compile)
    record = RecordSteps(watch_logits=not compile)
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, precision=precision, gradient_clip_val=1.0, max_steps=80,
        callbacks=[record], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    module.use(optimize(module.model, trainer.strategy.root_device, "train"))  # as train.py does
    trainer.fit(module, train_dataloaders=DataLoader([batch] * 80, batch_size=None))
    assert record.devices == {trainer.strategy.root_device.type}  # every step ran on the device
    # optimizer.fused: null is on for CUDA and the CPU, unless fp16's loss scaler must unscale before clipping
    assert trainer.optimizers[0].defaults["fused"] is (precision != "16-mixed")
    if compile:
        assert module._compiled_losses is not None
    else:
        assert record.ffn_dtypes == {half}  # autocast ran the matmuls in bf16 (or fp16)
    losses = record.losses
    assert len(losses) == 80 and all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first, (first, last)
    assert sorted(losses[-10:])[-1] < sorted(losses[:10])[0]  # every late step below every early one


class NoSyncInUpdates(L.Callback):  # CUDA's check; tests/training/test_host_syncs.py counts on the CPU
    """Turns CUDA's synchronisation check to "error" from each batch's start to its end (forward,
    loss, backward, clipping, the non-finite guard, the optimizer step), after ``warmup`` batches
    (a compiled step's first batches compile)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.checked = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if batch_idx >= self.warmup:
            torch.cuda.synchronize()  # what came before is not this update's
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if batch_idx >= self.warmup:
            torch.cuda.set_sync_debug_mode("default")
            self.checked += 1


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_a_bf16_update_never_makes_the_host_wait_for_the_gpu(compile):
    """tests/training/test_host_syncs.py counts the same on the CPU."""
    if choose_precision("auto", "gpu").precision != "bf16-mixed":
        pytest.skip("fp16's loss scaler reads its found_inf on the host: bf16 GPUs only")
    torch.manual_seed(0)
    batch, vocab = _toy_batch()
    model = dict(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=64, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=128, dropout=0.1, share_embeddings=True,
    )  # fmt: skip
    module = TranslationModule(model, lr={"peak": 1e-3, "warmup_steps": 10}, compile=compile)
    module.use(optimize(module.model, "cuda", "train"))
    check = NoSyncInUpdates(warmup=3)
    trainer = L.Trainer(
        accelerator="gpu", devices=1, precision="bf16-mixed", gradient_clip_val=1.0, max_steps=8,
        callbacks=[check], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    loader = DataLoader([batch] * 8, batch_size=None, pin_memory=True)
    try:
        trainer.fit(module, train_dataloaders=loader)  # a synchronisation raises inside the update
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert check.checked == 5 and trainer.optimizers[0].defaults["fused"] is True
