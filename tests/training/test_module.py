"""The Lightning module on its own: it memorises a toy batch, and its schedule has the paper's shape."""

import lightning as L
import pytest
from torch.utils.data import DataLoader

from data.batching import collate_batch
from data.tokenizer import BOS_ID, EOS_ID, SubwordTokenizer
from tests.toy_text import toy_pairs, train_word_spm
from training.module import TranslationModule
from training.schedule import inverse_sqrt_factor
from transformer.search import greedy_search


def test_module_overfits_a_toy_batch():
    pairs = toy_pairs(10, seed=3)
    tok = SubwordTokenizer(train_word_spm([s for pair in pairs for s in pair]))
    src_ids = tok.encode([s for s, _ in pairs])
    tgt_ids = tok.encode([t for _, t in pairs])
    examples = zip(src_ids, tgt_ids, strict=True)
    batch = collate_batch(
        [{"id": i, "src_ids": s + [EOS_ID], "tgt_ids": t} for i, (s, t) in enumerate(examples)]
    )
    model = dict(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=32, n_heads=4,
        n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0, share_embeddings=True,
    )  # fmt: skip
    module = TranslationModule(model, optimizer={"lr": 3e-3, "warmup_steps": 10}, label_smoothing=0.0)
    trainer = L.Trainer(
        max_steps=200, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader([batch] * 200, batch_size=None))
    module.eval()
    assert trainer.callback_metrics["train/loss"] < 0.05
    assert greedy_search(module.model, batch["src"], BOS_ID, EOS_ID) == tgt_ids


def test_hyperparameters_must_be_plain_dicts():
    from omegaconf import OmegaConf

    with pytest.raises(TypeError, match="plain dict"):
        TranslationModule(OmegaConf.create({"src_vocab_size": 8, "tgt_vocab_size": 8}))


def test_inverse_sqrt_schedule_rises_linearly_then_decays_as_inverse_sqrt():
    assert inverse_sqrt_factor(50, 100) == pytest.approx(0.5)
    assert inverse_sqrt_factor(100, 100) == pytest.approx(1.0)
    assert inverse_sqrt_factor(400, 100) == pytest.approx(0.5)
    peak = max(range(1, 1000), key=lambda s: inverse_sqrt_factor(s, 100))
    assert peak == 100
