"""Subword regularisation: the training split's batches are segmented afresh, reproducibly by seed,
epoch and batch (also in a worker process and after a resume); everything else stays deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data.batching import BatchIndices
from data.datamodule import TranslationDataModule
from data.sampling import SampledPairs

VOCAB = 64


def _datamodule(corpus_dir: Path, tmp_path: Path, **kwargs: object) -> TranslationDataModule:
    args = {
        "data_dir": str(corpus_dir),
        "vocab_size": VOCAB,
        "max_tokens": 300,
        "cache_dir": str(tmp_path / "cache"),
        "seed": 3,
    }
    dm = TranslationDataModule(**{**args, **kwargs})
    dm.setup("fit")
    return dm


def _batches(loader: torch.utils.data.DataLoader) -> list[dict]:
    return [{k: v.tolist() for k, v in batch.items()} for batch in loader]


def test_sampled_batches_hold_the_same_text_in_other_segmentations_and_eval_stays_the_best(
    tiny_corpus_dir: Path, tmp_path: Path
) -> None:
    best = _datamodule(tiny_corpus_dir, tmp_path)
    sampled = _datamodule(tiny_corpus_dir, tmp_path, spm_sampling_alpha=0.1)
    assert isinstance(sampled._served["train"], SampledPairs)
    plain, drawn = _batches(best.train_dataloader()), _batches(sampled.train_dataloader())
    assert [b["ids"] for b in plain] == [b["ids"] for b in drawn]  # the same batches, planned alike
    assert plain != drawn
    longer = 0
    tok = sampled.tgt_tokenizer
    for a, b in zip(plain, drawn, strict=True):
        for side in ("src", "tgt_out"):  # decoded, the same sentences
            assert tok.decode(a[side]) == tok.decode(b[side])
        longer += sum(b["tgt_lengths"]) - sum(a["tgt_lengths"])
    assert longer > 0  # samples are mostly longer than the best segmentation
    for split in ("val_dataloader", "test_dataloader"):
        assert _batches(getattr(best, split)()) == _batches(getattr(sampled, split)())


def test_a_batch_draws_the_same_however_fetched_and_afresh_each_epoch(
    tiny_corpus_dir: Path, tmp_path: Path
) -> None:
    dm = _datamodule(tiny_corpus_dir, tmp_path, spm_sampling_alpha=0.2, spm_sampling_nbest=-1)
    pairs = dm._served["train"]
    indices = list(range(20))
    first = pairs.__getitems__(BatchIndices(indices, epoch=0))
    pairs.__getitems__(BatchIndices(list(range(20, 40)), epoch=0))  # other draws in between
    again = pairs.__getitems__(BatchIndices(indices, epoch=0))
    later = pairs.__getitems__(BatchIndices(indices, epoch=1))
    assert first.src_values.tolist() == again.src_values.tolist()
    assert first.tgt_values.tolist() == again.tgt_values.tolist()
    assert first.src_values.tolist() != later.src_values.tolist()
    # An epoch through the loader: in a worker process as in this one; the next epoch draws anew.
    sampler_epochs = []
    for workers in (0, 1):
        dm.num_workers = workers
        loader = dm.train_dataloader()
        epochs = []
        for epoch in (0, 1):
            loader.batch_sampler.set_epoch(epoch)
            epochs.append(_batches(loader))
        sampler_epochs.append(epochs)
    assert sampler_epochs[0] == sampler_epochs[1]
    e0, e1 = sampler_epochs[0]
    assert {i for b in e0 for i in b["ids"]} == {i for b in e1 for i in b["ids"]}
    assert [b["src"] for b in e0] != [b["src"] for b in e1]


def test_a_sample_past_max_len_keeps_the_best_segmentation(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    """alpha 0.01, a nearly flat distribution: long samples, about half of these past 12."""
    dm = _datamodule(tiny_corpus_dir, tmp_path, spm_sampling_alpha=0.01, max_len=12)
    assert len(dm.lengths["train"][0]) > 10
    for batch in dm.train_dataloader():
        assert int(batch["src_lengths"].max()) <= 12 and int(batch["tgt_lengths"].max()) <= 12


@pytest.mark.parametrize(
    ("alpha", "nbest", "said"), [(0.0, -1, "spm_sampling_alpha"), (0.1, 1, "spm_sampling_nbest=1")]
)
def test_settings_that_would_not_sample_are_refused_naming_them(
    tiny_corpus_dir: Path, tmp_path: Path, alpha: float, nbest: int, said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        _datamodule(tiny_corpus_dir, tmp_path, spm_sampling_alpha=alpha, spm_sampling_nbest=nbest)
