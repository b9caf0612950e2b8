"""data.length_buckets: batches padded to a few shapes, filler pairs that change nothing."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data.batching import TokenBucketBatchSampler, collate_columns
from data.datamodule import TranslationDataModule
from data.length_buckets import LengthBuckets, bucketed_padding, distinct_shapes
from data.tokenized_pairs import PairColumns
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from training.module import token_losses
from transformer import Transformer, TransformerConfig

BUCKETS = LengthBuckets.parse([8, 12, 16, 24])


@given(st.lists(st.integers(1, 100), min_size=1, max_size=50))
def test_a_length_goes_up_to_the_smallest_bucket_that_holds_it(lengths: list[int]) -> None:
    got = BUCKETS.bucket(np.array(lengths))
    for length, padded in zip(lengths, got.tolist(), strict=True):
        assert padded >= length
        if length <= 24:
            assert padded in BUCKETS.lengths and not any(length <= b < padded for b in BUCKETS.lengths)
        else:
            assert padded % 24 == 0 and padded - length < 24  # beyond the largest: its next multiple
    assert (np.diff(BUCKETS.bucket(np.sort(lengths))) >= 0).all()  # the sorted order is kept


@pytest.mark.parametrize(
    "value, message",
    [
        ("16,32", "list of integers"),
        ([16, 16], "strictly ascending"),
        ([0, 8], "positive"),
        ([8.5], "integers"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"data.length_buckets must be .*{message}"):
        LengthBuckets.parse(value)


def test_no_buckets_is_null_or_empty() -> None:
    assert LengthBuckets.parse(None) is None and LengthBuckets.parse([]) is None


def _columns(pairs: list[tuple[int, int]], seed: int = 0) -> PairColumns:
    """Random pairs of (source length with EOS, target length without BOS/EOS)."""
    rng = np.random.default_rng(seed)
    src = [np.r_[rng.integers(4, 30, s - 1), EOS_ID] for s, _ in pairs]
    tgt = [rng.integers(4, 30, t) for _, t in pairs]
    return PairColumns(
        np.arange(len(pairs)),
        np.concatenate(src),
        np.array([len(s) for s in src]),
        np.concatenate(tgt),
        np.array([len(t) for t in tgt]),
    )


def test_collate_pads_to_the_buckets_with_filler_pairs_after_the_real_ones() -> None:
    columns = _columns([(5, 3), (9, 6), (7, 10)])
    plain = collate_columns(columns)
    padded = collate_columns(columns, BUCKETS, max_tokens=100)
    rows, S, T = 100 // 12, 12, 12  # longest source 9 -> 12, longest target 11 -> 12
    assert padded["src"].shape == (rows, S) and padded["tgt_in"].shape == padded["tgt_out"].shape == (rows, T)
    for key, width in (("src", 9), ("tgt_in", 11), ("tgt_out", 11)):
        assert torch.equal(padded[key][:3, :width], plain[key])  # the real pairs as they were
        assert (padded[key][:3, width:] == PAD_ID).all()
    assert (padded["src"][3:, 0] == EOS_ID).all() and (padded["src"][3:, 1:] == PAD_ID).all()
    assert (padded["tgt_in"][3:, 0] == BOS_ID).all() and (padded["tgt_in"][3:, 1:] == PAD_ID).all()
    assert (padded["tgt_out"][3:] == PAD_ID).all()  # no target token: no loss
    assert padded["ids"].tolist() == [0, 1, 2] + [-1] * (rows - 3)
    assert padded["tgt_lengths"][3:].eq(0).all() and padded["src_lengths"][3:].eq(1).all()
    assert len(padded["tgt_positions"]) == len(plain["tgt_positions"]) == int(plain["tgt_lengths"].sum())


def test_filler_pairs_and_bucket_padding_change_no_loss_and_no_gradient() -> None:
    torch.manual_seed(0)
    columns = _columns([(5, 3), (9, 6), (7, 10), (4, 2)], seed=1)
    config = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
        d_ff=32, dropout=0.0, share_embeddings=True,
    )  # fmt: skip
    model = Transformer(config)

    def loss_and_grads(batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        losses = token_losses(model, batch["src"], batch["tgt_in"], batch["tgt_out"], PAD_ID, 0.1)
        total = losses.sum()
        total.backward()
        return total.detach(), [p.grad.clone() for p in model.parameters()]

    want = loss_and_grads(collate_columns(columns))
    got = loss_and_grads(collate_columns(columns, BUCKETS, max_tokens=120))
    # equal but for the order of fp32 sums over the longer rows (the loss is fp32 by design)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(40, 400))
def test_the_sampler_cuts_by_bucketed_widths_and_every_example_comes_once(seed: int, max_tokens: int) -> None:
    rng = random.Random(seed)
    src = [rng.randint(2, 40) for _ in range(300)]
    tgt = [max(2, s + rng.randint(-3, 3)) for s in src]
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=max_tokens, seed=seed, length_buckets=BUCKETS)
    batches = [list(b) for b in sampler]
    assert sorted(i for b in batches for i in b) == list(range(300))
    shapes = set()
    for b in batches:
        rows, S, T = BUCKETS.batch_shape(np.array(src)[b], np.array(tgt)[b], max_tokens)
        width = max(S, T)
        assert len(b) <= max(1, max_tokens // width)  # a batch fits its bucketed width's budget
        assert rows == max(len(b), max_tokens // width)
        shapes.add((rows, S, T))
    # a few shapes: the rows follow from the widest bucket alone
    assert len({(r, max(S, T)) for r, S, T in shapes}) == len({max(S, T) for _, S, T in shapes})
    padding, fillers, count = bucketed_padding(batches, src, tgt, BUCKETS, max_tokens)
    assert count == len(shapes) and 0 <= fillers < 1 and 0 < padding < 1


def test_the_datamodule_serves_bucketed_training_batches_and_logs_their_cost(
    tiny_corpus_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="data.datamodule")
    dm = TranslationDataModule(
        data_dir=str(tiny_corpus_dir), vocab_size=64, max_tokens=300, cache_dir=str(tmp_path / "cache"),
        seed=3, length_buckets=[16, 32, 64, 128],
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    train = list(dm.train_dataloader())
    shapes = {tuple(b["src"].shape) + (b["tgt_in"].shape[1],) for b in train}
    assert all(S in (16, 32, 64, 128) and T in (16, 32, 64, 128) for _, S, T in shapes), shapes
    assert all(rows == max(1, 300 // max(S, T)) for rows, S, T in shapes), shapes
    ids = sorted(i for b in train for i in b["ids"].tolist() if i >= 0)
    assert ids == list(range(400))  # every pair once; the fillers are -1
    val = next(iter(dm.val_dataloader()))
    assert (val["ids"] >= 0).all()  # validation is never bucketed
    lines = [r.getMessage() for r in caplog.records if "padding fraction" in r.getMessage()]
    assert len(lines) == 2 and "batch shapes an epoch" in lines[0]
    assert lines[1].startswith("train padding fraction with data.length_buckets=[16, 32, 64, 128]: ")
    src, tgt = dm.lengths["train"]
    plain = dm.batch_sampler("train", buckets=False).global_batches()
    assert f"({distinct_shapes(plain, src, tgt)} batch shapes an epoch)" in lines[0]
    assert f"({len(shapes)} batch shapes, {len(train)} batches)" in lines[1]
