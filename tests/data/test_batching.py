"""The token-budget rule, the translator's batches and the sampler, over many random length lists; collate."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data.batching import (
    TokenBucketBatchSampler,
    collate_batch,
    longest_first_batches,
    padding_fraction,
    token_budget_batches,
)
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID

# No example database on disk (it would land in the working tree); no per-example deadline.
PROPS = settings(max_examples=100, deadline=None, database=None)

lengths = st.lists(st.integers(min_value=1, max_value=60), min_size=0, max_size=300)
budget = st.integers(min_value=8, max_value=400)


def _pairs(draw_src: list[int], seed: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    tgt = [max(1, s + int(rng.integers(-5, 6))) for s in draw_src]
    return draw_src, tgt


def _epoch(sampler: TokenBucketBatchSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


# ------------------------------------------------------------------- the rule, and the translator's


@PROPS
@given(widths=lengths, max_tokens=st.integers(min_value=1, max_value=400))
def test_token_budget_batches_are_consecutive_within_budget_and_greedy(
    widths: list[int], max_tokens: int
) -> None:
    for order in (widths, sorted(widths)):  # sorted: the sampler's case, cut without a loop per example
        bounds = token_budget_batches(order, max_tokens)
        # Consecutive, in the order given, covering every position once.
        assert [i for s, e in bounds for i in range(s, e)] == list(range(len(order)))
        for s, e in bounds:
            assert e > s
            assert (e - s) * max(order[s:e]) <= max_tokens or e - s == 1  # a lone over-wide example
        for s, e in bounds[:-1]:
            assert (e - s + 1) * max(order[s : e + 1]) > max_tokens  # the next one did not fit: greedy


def test_token_batches_cover_every_sentence_within_the_budget() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(300)]
    for max_tokens in (1, 30, 100, 10_000):
        batches = longest_first_batches(lengths, max_tokens)
        assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
        for batch in batches:
            widths = [lengths[i] for i in batch]
            assert widths == sorted(widths, reverse=True)  # sorted by length
            assert len(batch) == 1 or len(batch) * max(widths) <= max_tokens
        if max_tokens == 1:
            assert len(batches) == len(lengths)  # each too long for the budget: alone
    assert longest_first_batches([], 10) == []
    with pytest.raises(ValueError, match="at least 1"):
        longest_first_batches([3], 0)
    with pytest.raises(ValueError, match="at least 1"):
        TokenBucketBatchSampler([3], None, max_tokens=0)


def test_translator_batches_run_longest_first() -> None:
    batches = longest_first_batches([2, 9, 4, 9, 1], 18)
    assert batches[0] == [1, 3]  # the two widest, equal widths in input order
    assert [i for b in batches for i in b] == [1, 3, 2, 0, 4]


# ---------------------------------------------------------------------------------- the sampler


@PROPS
@given(src=lengths, max_tokens=budget, seed=st.integers(0, 2**16), shuffle=st.booleans())
def test_budget_respected_and_each_example_once(
    src: list[int], max_tokens: int, seed: int, shuffle: bool
) -> None:
    src, tgt = _pairs(src, seed)
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=max_tokens, shuffle=shuffle, seed=seed)
    for epoch in (0, 1):
        batches = _epoch(sampler, epoch)
        assert len(batches) == len(sampler)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(src)))  # every example exactly once
        for b in batches:
            width = max(max(src[i], tgt[i]) for i in b)
            assert len(b) * width <= max_tokens or len(b) == 1  # a lone over-long example


@PROPS
@given(
    src=lengths,
    max_tokens=budget,
    seed=st.integers(0, 2**16),
    world=st.integers(1, 5),
    shuffle=st.booleans(),
)
def test_ranks_disjoint_equal_counts_cover_all(
    src: list[int], max_tokens: int, seed: int, world: int, shuffle: bool
) -> None:
    src, tgt = _pairs(src, seed)
    samplers = [
        TokenBucketBatchSampler(src, tgt, max_tokens, shuffle, seed, num_replicas=world, rank=r)
        for r in range(world)
    ]
    per_rank = [_epoch(s, 3) for s in samplers]
    counts = {len(b) for b in per_rank} | {len(s) for s in samplers}
    assert len(counts) == 1  # equal number of batches on every rank, and equal to len()
    seen = [sorted(i for b in batches for i in b) for batches in per_rank]
    union = sorted(itertools.chain.from_iterable(seen))
    if len(samplers[0]) * world <= len(src):
        # Enough examples to split batches instead of repeating: disjoint, exactly once.
        assert union == list(range(len(src)))
    else:  # a handful of examples on many ranks: repeats, still everything at least once
        assert set(union) == set(range(len(src)))
    for b in (b for batches in per_rank for b in batches):
        assert len(b) >= 1


def test_disjoint_ranks_on_a_realistic_size() -> None:
    rng = np.random.default_rng(0)
    src = rng.integers(3, 40, size=2000).tolist()
    tgt = rng.integers(3, 40, size=2000).tolist()
    for world in (2, 3, 4, 7, 8):
        per_rank = [
            set(i for b in TokenBucketBatchSampler(src, tgt, 512, True, 1, world, r) for i in b)
            for r in range(world)
        ]
        assert sum(len(s) for s in per_rank) == 2000
        assert set().union(*per_rank) == set(range(2000))


@PROPS
@given(src=lengths, seed=st.integers(0, 2**16))
def test_order_depends_only_on_seed_and_epoch(src: list[int], seed: int) -> None:
    src, tgt = _pairs(src, seed)
    a = TokenBucketBatchSampler(src, tgt, 64, shuffle=True, seed=seed)
    b = TokenBucketBatchSampler(src, tgt, 64, shuffle=True, seed=seed)
    assert _epoch(a, 5) == _epoch(b, 5)
    assert _epoch(a, 2) == _epoch(b, 2) == _epoch(a, 2)
    assert len(_epoch(a, 0)) == len(_epoch(a, 1)) == len(a)  # len() is the same every epoch


def test_shuffle_changes_between_epochs_and_seeds() -> None:
    rng = np.random.default_rng(1)
    src = rng.integers(3, 30, size=500).tolist()
    s = TokenBucketBatchSampler(src, None, 200, shuffle=True, seed=0)
    e0, e1 = _epoch(s, 0), _epoch(s, 1)
    assert e0 != e1
    # Not only the batch order: examples of equal length move between batches.
    assert {tuple(sorted(b)) for b in e0} != {tuple(sorted(b)) for b in e1}
    assert _epoch(TokenBucketBatchSampler(src, None, 200, shuffle=True, seed=1), 0) != e0


def test_no_shuffle_is_fixed_and_sorted_by_length() -> None:
    src = [5, 1, 9, 3, 3, 7, 2]
    s = TokenBucketBatchSampler(src, None, max_tokens=10, shuffle=False)
    assert _epoch(s, 0) == _epoch(s, 4)
    flat = [i for b in _epoch(s, 0) for i in b]
    assert [src[i] for i in flat] == sorted(src)


@PROPS
@given(
    src=lengths,
    seed=st.integers(0, 2**16),
    world=st.integers(1, 3),
    stop=st.integers(0, 50),
)
def test_restored_position_gives_the_remaining_batches(
    src: list[int], seed: int, world: int, stop: int
) -> None:
    src, tgt = _pairs(src, seed)
    for rank in range(world):
        full = TokenBucketBatchSampler(src, tgt, 100, True, seed, world, rank)
        expected = _epoch(full, 2)
        stop_at = min(stop, len(expected))

        first = TokenBucketBatchSampler(src, tgt, 100, True, seed, world, rank)
        first.set_epoch(2)
        it = iter(first)
        head = [next(it) for _ in range(stop_at)]
        state = first.state_dict()
        assert state["epoch"] == 2 and state["position"] == stop_at

        resumed = TokenBucketBatchSampler(src, tgt, 100, True, seed, world, rank)
        resumed.load_state_dict(state)
        resumed.set_epoch(2)  # Lightning calls set_epoch before iterating: same epoch, kept
        assert head + list(resumed) == expected
        assert list(resumed) == expected  # the next pass is whole again
        resumed.load_state_dict(state)
        resumed.set_epoch(3)  # another epoch: the restored position does not apply
        assert list(resumed) == _epoch(full, 3)


def test_load_state_refuses_another_layout() -> None:
    src = list(range(1, 50))
    state = TokenBucketBatchSampler(src, None, 100, num_replicas=2).state_dict()
    with pytest.raises(ValueError, match="num_replicas"):
        TokenBucketBatchSampler(src, None, 100, num_replicas=1).load_state_dict(state)


def test_over_long_example_gets_its_own_batch() -> None:
    s = TokenBucketBatchSampler([3, 50, 3, 3], None, max_tokens=10, shuffle=False)
    batches = list(s)
    assert [1] in batches
    assert all(len(b) * 3 <= 10 for b in batches if b != [1])


def test_padding_fraction() -> None:
    # batch [0, 1]: src 2 * 4 = 8 slots for 4 + 2, tgt 2 * 3 = 6 slots for 3 + 3
    assert padding_fraction([[0, 1]], [4, 2], [3, 3]) == pytest.approx(1 - 12 / 14)
    assert padding_fraction([[0], [1]], [4, 2], [3, 3]) == 0.0
    assert padding_fraction([], [], []) == 0.0


def test_collate_layout() -> None:
    examples = [
        {"id": 7, "src_ids": [10, 11, EOS_ID], "tgt_ids": [20, 21, 22]},
        {"id": 3, "src_ids": [12, EOS_ID], "tgt_ids": [23]},
    ]
    b = collate_batch(examples)
    assert all(v.dtype == torch.long for v in b.values())
    assert b["src"].tolist() == [[10, 11, EOS_ID], [12, EOS_ID, PAD_ID]]
    assert b["src_lengths"].tolist() == [3, 2]
    assert b["tgt_in"].tolist() == [[BOS_ID, 20, 21, 22], [BOS_ID, 23, PAD_ID, PAD_ID]]
    assert b["tgt_out"].tolist() == [[20, 21, 22, EOS_ID], [23, EOS_ID, PAD_ID, PAD_ID]]
    assert b["tgt_lengths"].tolist() == [4, 2]
    assert b["ids"].tolist() == [7, 3]
    # Decoder input and target are the same sequence shifted by one.
    for row, n in enumerate(b["tgt_lengths"].tolist()):
        assert b["tgt_in"][row, 1:n].tolist() == b["tgt_out"][row, : n - 1].tolist()


@PROPS
@given(src=lengths, max_tokens=budget, seed=st.integers(0, 2**16))
def test_batches_are_the_greedy_cut_of_the_sorted_order(src: list[int], max_tokens: int, seed: int) -> None:
    src, tgt = _pairs(src, seed)
    sampler = TokenBucketBatchSampler(src, tgt, max_tokens=max_tokens, shuffle=False)
    batches = list(sampler)
    width = [max(s, t) for s, t in zip(src, tgt, strict=True)]
    for batch, following in itertools.pairwise(batches):
        # Each batch is as long as the budget allows: the next example in order would not fit.
        assert (len(batch) + 1) * width[following[0]] > max_tokens


@PROPS
@given(src=lengths, seed=st.integers(0, 2**16), shuffle=st.booleans())
def test_sort_order_is_the_lexicographic_one(src: list[int], seed: int, shuffle: bool) -> None:
    # (longest, src, tgt), ties by the epoch's random key: what np.lexsort gives, so batches stay
    # the same as those of runs made before the single-key sort.
    src, tgt = _pairs(src, seed)
    sampler = TokenBucketBatchSampler(src, tgt, seed=seed)
    rng = np.random.default_rng([seed, 1]) if shuffle else None
    tie = np.random.default_rng([seed, 1]).permutation(len(src)) if shuffle else np.arange(len(src))
    s, t = np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64)
    expected = np.lexsort((tie, t, s, np.maximum(s, t)))
    assert sampler._sorted_order(rng).tolist() == expected.tolist()


def test_tokenized_pairs_gather_rows_across_record_batches_in_batch_order() -> None:
    import pickle

    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    from data.batching import collate_columns
    from data.tokenized_pairs import TokenizedPairs

    rng = np.random.default_rng(0)
    src = [rng.integers(4, 50, rng.integers(1, 9)).tolist() for _ in range(60)]
    tgt = [rng.integers(4, 50, rng.integers(1, 9)).tolist() for _ in range(60)]
    table = pa.table({"id": list(range(100, 160)), "src_ids": src, "tgt_ids": tgt})
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=7))  # as a cache file's record batches
    rows = np.array([i for i in range(60) if i % 4])  # e.g. the pairs within max_len
    served = TokenizedPairs(datasets.Dataset(InMemoryTable(chunked)), rows)
    assert len(served) == len(rows)
    indices = [30, 2, 17, 2, 44, 0, 9]  # any order, repeats allowed
    for ds in (served, pickle.loads(pickle.dumps(served))):
        batch = collate_columns(ds.__getitems__(indices))
        expected = collate_batch(
            [{"id": 100 + r, "src_ids": src[r], "tgt_ids": tgt[r]} for r in rows[indices]]
        )
        assert batch.keys() == expected.keys()
        assert all(torch.equal(batch[k], expected[k]) for k in batch)
    assert served[3] == {"id": 100 + rows[3], "src_ids": src[rows[3]], "tgt_ids": tgt[rows[3]]}
