"""Corpora mixed by weight: each epoch holds each corpus ``weight`` times over, a new unbiased
draw of the fractional share every epoch (every pair as likely as any other, whatever its
length), the same number of batches every epoch, each within the token budget."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from data.batching import TokenBucketBatchSampler
from data.mixing import CorpusMix, corpus_weights


def _corpora(sizes: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: its corpus, source and target length (few distinct lengths, many ties)."""
    rng = np.random.default_rng(seed)
    corpus_of = np.repeat(np.arange(len(sizes)), sizes)
    src = rng.integers(2, 9, len(corpus_of))
    tgt = src + rng.integers(0, 3, len(corpus_of))
    return corpus_of, src, tgt


@pytest.mark.parametrize("weights", [[1.0, 1.0], [2.0, 1.0], [1.0, 0.5], [3.0, 0.25, 1.7]])
def test_each_corpus_counts_its_weight_times_over_in_every_draw(weights):
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


@pytest.mark.parametrize("weight", [0.5, 0.3, 1.7])
def test_every_pair_is_drawn_as_often_as_its_weight_says_whatever_its_length(weight):
    # Corpus 1: 24 pairs of distinct lengths (each alone in its group) and 36 sharing 3 lengths.
    src = np.concatenate([np.full(40, 5), np.arange(3, 27), np.repeat([4, 9, 30], 12)])
    tgt = src + 1
    corpus_of = np.repeat([0, 1], [40, 60])
    mix = CorpusMix(corpus_of, [1.0, weight], TokenBucketBatchSampler.length_keys(src, tgt))
    epochs = 3000
    counts = np.zeros(len(src))
    for epoch in range(epochs):
        drawn = mix.examples(np.random.default_rng([11, epoch]))
        assert len(drawn) == len(mix)
        counts += np.bincount(drawn, minlength=len(src))
    frequency = counts[corpus_of == 1] / epochs
    # Binomial standard error of a frequency near 0.5 over 3,000 epochs: ~0.009; 0.05 is > 5 of them.
    assert np.abs(frequency - weight).max() < 0.05, frequency
    # Long pairs as often as short ones: the correlation of frequency and length is noise.
    lengths = src[corpus_of == 1]
    assert abs(np.corrcoef(lengths, frequency)[0, 1]) < 0.3
    assert (counts[corpus_of == 0] == epochs).all()  # weight 1: every pair every epoch


def test_a_draw_is_not_the_same_pairs_every_epoch_when_every_length_is_unique():
    src = np.arange(2, 12)  # the case that always drew the 5 shortest
    mix = CorpusMix(np.ones(10, dtype=np.int64), [1.0, 0.5], TokenBucketBatchSampler.length_keys(src, src))
    drawn = {tuple(sorted(mix.examples(np.random.default_rng([0, e])).tolist())) for e in range(40)}
    assert len(drawn) > 10
    assert set().union(*drawn) == set(range(10))  # the longest pairs are drawn too


def test_a_mixed_sampler_keeps_its_batch_count_and_budget_and_resumes_exactly():
    corpus_of, src, tgt = _corpora([150, 500])
    src[150::7] += np.arange(len(src[150::7]))  # rare long pairs in the drawn corpus
    tgt = np.maximum(tgt, src)
    mix = CorpusMix(corpus_of, [2.0, 0.3], TokenBucketBatchSampler.length_keys(src, tgt))

    def sampler() -> TokenBucketBatchSampler:
        return TokenBucketBatchSampler(src, tgt, max_tokens=256, shuffle=True, seed=5, mix=mix)

    s = sampler()
    epochs = []
    for epoch in range(12):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s)  # the count Lightning read once holds in every epoch
        assert sum(len(b) for b in batches) == len(mix)
        assert all(len(b) * max(max(src[b]), max(tgt[b])) <= 256 for b in batches)
        epochs.append(batches)
    assert epochs[0] != epochs[1]
    # Resumed mid-epoch 1: the rest of the epoch is the straight run's.
    resumed = sampler()
    resumed.load_state_dict({"epoch": 1, "position": 4})
    assert list(resumed) == epochs[1][4:]


def test_the_widest_order_bounds_the_keys_of_every_draw():
    corpus_of, src, tgt = _corpora([90, 300, 40])
    src[::5] += np.arange(len(src[::5])) % 17
    keys = TokenBucketBatchSampler.length_keys(src, np.maximum(tgt, src))
    mix = CorpusMix(corpus_of, [1.5, 0.35, 0.8], keys)
    bound = keys[mix.widest_order()]
    assert (np.diff(bound) >= 0).all() and len(bound) == len(mix)
    for epoch in range(50):
        drawn = np.sort(keys[mix.examples(np.random.default_rng([2, epoch]))])
        assert (drawn <= bound).all()


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0, 100.0])
def test_temperature_weights_give_shares_proportional_to_size_to_the_one_over_t(temperature):
    pairs = [100_000, 10_000, 1_000]
    weights = corpus_weights(pairs, temperature)
    per_epoch = np.array(pairs) * np.array(weights)
    assert per_epoch.sum() == pytest.approx(sum(pairs))
    expected = np.array(pairs, dtype=float) ** (1 / temperature)
    assert per_epoch / per_epoch.sum() == pytest.approx(expected / expected.sum())
    if temperature == 1.0:
        assert weights == pytest.approx([1.0, 1.0, 1.0])
    # the larger T, the flatter: the smallest corpus's share grows
    assert per_epoch[2] / per_epoch.sum() >= pairs[2] / sum(pairs) - 1e-12


def test_a_temperature_below_one_is_refused():
    with pytest.raises(ValueError, match="data.corpora_temperature must be at least 1, not 0.5"):
        corpus_weights([10, 20], 0.5)
