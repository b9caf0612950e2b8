"""Corpora mixed by weight: each epoch holds each corpus ``weight`` times over, the same lengths
every epoch (so the same batches count), a new draw of the fractional share every epoch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from data.batching import TokenBucketBatchSampler
from data.mixing import CorpusMix


def _corpora(sizes: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: its corpus, source and target length (few distinct lengths, many ties)."""
    rng = np.random.default_rng(seed)
    corpus_of = np.repeat(np.arange(len(sizes)), sizes)
    src = rng.integers(2, 9, len(corpus_of))
    tgt = src + rng.integers(0, 3, len(corpus_of))
    return corpus_of, src, tgt


@pytest.mark.parametrize("weights", [[1.0, 1.0], [2.0, 1.0], [1.0, 0.5], [3.0, 0.25, 1.7]])
def test_each_corpus_counts_its_weight_times_over_with_the_same_lengths_every_epoch(weights):
    corpus_of, src, tgt = _corpora([120, 333, 57][: len(weights)])
    keys = TokenBucketBatchSampler.length_keys(src, tgt)
    mix = CorpusMix(corpus_of, weights, keys)
    draws = [mix.examples(np.random.default_rng([7, epoch])) for epoch in range(3)] + [mix.examples(None)]
    for drawn in draws:
        assert len(drawn) == len(mix)
        per_corpus = np.bincount(corpus_of[drawn], minlength=len(weights))
        assert per_corpus.tolist() == mix.per_corpus.tolist()
        for c, w in enumerate(weights):
            n = int((corpus_of == c).sum())
            assert per_corpus[c] == int(w) * n + round((w - int(w)) * n)
            counts = Counter(drawn[corpus_of[drawn] == c].tolist())
            # every pair at least floor(w) times, at most once more
            assert set(counts.values()) <= {int(w), int(w) + 1} - ({0} if int(w) == 0 else set())
            assert len(counts) == (n if w >= 1 else round(w * n))
        # the same lengths, in the same numbers, whatever the draw
        assert sorted(keys[drawn].tolist()) == sorted(keys[draws[0]].tolist())


def test_the_fractional_share_is_a_new_draw_each_epoch_and_the_same_for_the_same_generator():
    corpus_of, src, tgt = _corpora([200, 400])
    mix = CorpusMix(corpus_of, [1.0, 0.5], TokenBucketBatchSampler.length_keys(src, tgt))
    first, again = (mix.examples(np.random.default_rng([3, 0])) for _ in range(2))
    second = mix.examples(np.random.default_rng([3, 1]))
    assert first.tolist() == again.tolist()
    assert set(first.tolist()) != set(second.tolist())


def test_a_weight_must_be_positive():
    with pytest.raises(ValueError, match="corpus 1: weight must be positive, not 0"):
        CorpusMix(np.array([0, 1]), [1.0, 0.0], np.array([5, 5]))


def test_a_mixed_sampler_keeps_its_batch_count_and_budget_and_resumes_exactly():
    corpus_of, src, tgt = _corpora([150, 500])
    mix = CorpusMix(corpus_of, [2.0, 0.3], TokenBucketBatchSampler.length_keys(src, tgt))

    def sampler() -> TokenBucketBatchSampler:
        return TokenBucketBatchSampler(src, tgt, max_tokens=64, shuffle=True, seed=5, mix=mix)

    s = sampler()
    epochs = []
    for epoch in range(3):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s)  # the count Lightning read once holds in every epoch
        assert sum(len(b) for b in batches) == len(mix)
        assert all(len(b) * max(max(src[b]), max(tgt[b])) <= 64 for b in batches)
        epochs.append(batches)
    assert epochs[0] != epochs[1]
    # Resumed mid-epoch 1: the rest of the epoch is the straight run's.
    resumed = sampler()
    resumed.load_state_dict({"epoch": 1, "position": 4})
    assert list(resumed) == epochs[1][4:]
