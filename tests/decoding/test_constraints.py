"""Search constraints: a forced prefix, a minimum length and no repeated n-grams, in every search."""

from __future__ import annotations

import pytest
import torch

from decoding.sampling import SamplingConfig, sample
from decoding.search import beam_search, greedy_search
from tests.transformer.helpers import BOS, EOS, model_with_eos_bias, ragged_batch

LENGTHS = [4, 9, 6, 2, 7]


def outputs(search: str, model, src, **constraints) -> list[list[list[int]]]:  # noqa: ANN001
    """Per sentence, its outputs (all beams or samples) of one search."""
    if search == "greedy":
        return [[out] for out in greedy_search(model, src, BOS, EOS, **constraints)]
    if search == "beam":
        hyps = beam_search(model, src, BOS, EOS, beam_size=3, nbest=3, **constraints)
    else:
        hyps = sample(
            model, src, BOS, EOS, SamplingConfig(topk=3, temperature=0.5, seed=1), nsamples=3, **constraints
        )
    return [[h.tokens for h in n] for n in hyps]


def repeats_an_ngram(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


SEARCHES = ["greedy", "beam", "sampling"]


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_ngram_repeats(search: str, n: int) -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    free = outputs(search, model, src, max_len_b=30)
    assert any(repeats_an_ngram(out, n) for sentence in free for out in sentence), "the test needs repeats"
    constrained = outputs(search, model, src, max_len_b=30, no_repeat_ngram=n)
    assert not any(repeats_an_ngram(out, n) for sentence in constrained for out in sentence)


@pytest.mark.parametrize("search", SEARCHES)
def test_minimum_length(search: str) -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    assert min(len(out) for s in outputs(search, model, src) for out in s) < 4, "the test needs short outputs"
    assert min(len(out) for s in outputs(search, model, src, min_len=4) for out in s) >= 4


@pytest.mark.parametrize("search", SEARCHES)
def test_a_prefix_starts_every_output_and_an_empty_one_forces_nothing(search: str) -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    prefixes = [[5, 6], [], [7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], [11]]
    forced = outputs(search, model, src, prefixes=prefixes)
    free = outputs(search, model, src)
    for prefix, sentence, unforced in zip(prefixes, forced, free, strict=True):
        for out in sentence:
            assert out[: len(prefix)] == prefix  # a prefix longer than the length limit too
        if not prefix:
            assert sentence == unforced


def test_a_prefix_keeps_the_model_scores() -> None:
    """A forced token costs its log-probability: beam search's score of a prefix's output equals
    the unforced search's score of the same tokens."""
    model, src = model_with_eos_bias(), ragged_batch([6])
    best = beam_search(model, src, BOS, EOS, beam_size=4)[0][0]
    forced = beam_search(model, src, BOS, EOS, beam_size=4, prefixes=[best.tokens[:2]])[0][0]
    assert forced.tokens == best.tokens
    torch.testing.assert_close(torch.tensor(forced.log_prob), torch.tensor(best.log_prob))
