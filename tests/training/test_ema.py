"""The EMA of the weights: torch's formula once per update, validated with (the training weights
back after it), and the model ends fitting with it. Checkpoints and an exact resume:
tests/training/test_resume.py."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from tests.training.test_module import _tiny, _toy_batch
from training.ema import ExponentialMovingAverage
from training.module import TranslationModule

DECAY = 0.5  # far from 1: each update moves the average visibly


class _Validated(TranslationModule):
    """Records the weights and outputs validation sees, in its steps and at its epoch's end (where
    the module searches and scores: training/evaluation.py), and scores nothing (no datamodule)."""

    def validation_step(self, batch, batch_idx):
        with torch.no_grad():  # eval mode, autograd off: the CPU's packed weights are used
            self.seen.append(
                (
                    [p.detach().clone() for p in self.model.parameters()],
                    self.model(batch["src"], batch["tgt_in"]),
                )
            )

    def on_validation_epoch_end(self):
        # Lightning calls the callbacks' on_validation_epoch_end first: the EMA must still be here.
        self.seen_at_end.append([p.detach().clone() for p in self.model.parameters()])


def test_validation_sees_the_ema_of_each_update_and_training_goes_on_from_its_own_weights():
    batch, _, vocab = _toy_batch()
    torch.manual_seed(0)
    module = _Validated({**_tiny(vocab), "dropout": 0.1}, lr={"peak": 1e-2, "warmup_steps": 1})
    module.seen, module.seen_at_end = [], []
    trained, after_validation = [], []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trained.append([p.detach().clone() for p in pl_module.model.parameters()])

        def on_validation_end(self, trainer, pl_module):
            after_validation.append([p.detach().clone() for p in pl_module.model.parameters()])

    trainer = L.Trainer(
        max_steps=4, accelerator="cpu", accumulate_grad_batches=2, val_check_interval=6, limit_val_batches=1,
        num_sanity_val_steps=0, callbacks=[ExponentialMovingAverage(DECAY), Record()], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    loader = DataLoader([batch] * 8, batch_size=None)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=DataLoader([batch], batch_size=None))

    updates = trained[1::2]  # two batches an update: the weights after each of the 4 updates
    ema = [updates[0]]
    for weights in updates[1:]:
        ema.append([DECAY * e + (1 - DECAY) * w for e, w in zip(ema[-1], weights, strict=True)])
    [(validated, output)] = module.seen  # after batch 6: update 3
    [scored] = module.seen_at_end
    for v, s, e, w in zip(validated, scored, ema[2], updates[2], strict=True):
        torch.testing.assert_close(v, e)
        torch.testing.assert_close(s, e)
        assert not torch.equal(v, w)
    for a, w in zip(after_validation[0], updates[2], strict=True):
        assert torch.equal(a, w)  # put back exactly: update 4 starts from them
    reference = copy.deepcopy(module.model).eval()
    with torch.no_grad():
        for p, e in zip(reference.parameters(), ema[2], strict=True):
            p.copy_(e)
        torch.testing.assert_close(output, reference(batch["src"], batch["tgt_in"]))
    for p, e in zip(module.model.parameters(), ema[3], strict=True):  # fitting ends with the EMA
        torch.testing.assert_close(p.detach(), e)


def test_a_decay_outside_0_and_1_is_refused_naming_the_setting():
    for decay in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="ema.decay must be within"):
            ExponentialMovingAverage(decay)


def test_a_checkpoint_saved_mid_validation_holds_the_ema_and_loads_back_both():
    """Saved while validation holds the EMA in the model (a signal, an exception), the checkpoint
    still keeps the training weights beside the EMA; loading it puts each back where it was."""
    torch.manual_seed(0)
    module = TranslationModule(_tiny(12))
    ema = ExponentialMovingAverage(DECAY)
    ema.setup(None, module, "fit")
    training = [p.detach().clone() for p in module.model.parameters()]
    with torch.no_grad():
        for p in ema.average.module.parameters():
            p.add_(1.0)  # an average apart from the weights
    ema.average.n_averaged.fill_(7)
    averaged = [p.detach().clone() for p in ema.average.module.parameters()]
    ema.on_validation_epoch_start(None, module)
    checkpoint = {"state_dict": module.state_dict()}
    ema.on_save_checkpoint(None, module, checkpoint)
    ema.on_validation_end(None, module)
    names = [n for n, _ in module.model.named_parameters()]
    for name, t, a in zip(names, training, averaged, strict=True):
        assert torch.equal(checkpoint["state_dict"][f"model.{name}"], a)
        assert torch.equal(checkpoint["ema"]["training_weights"][f"model.{name}"], t)
    assert int(checkpoint["ema"]["n_averaged"]) == 7

    resumed, restored = TranslationModule(_tiny(12)), ExponentialMovingAverage(DECAY)
    restored.setup(None, resumed, "fit")
    resumed.load_state_dict(checkpoint["state_dict"])  # as Lightning does first: the EMA
    restored.on_load_checkpoint(None, resumed, checkpoint)
    for p, q, t, a in zip(
        resumed.model.parameters(), restored.average.module.parameters(), training, averaged, strict=True
    ):
        assert torch.equal(p, t) and torch.equal(q, a)
    assert int(restored.average.n_averaged) == 7
