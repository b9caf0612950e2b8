"""Sampling: reproducible per sentence, top-k 1 is greedy, and draws follow the reshaped distribution."""

from __future__ import annotations

import pytest
import torch

from decoding.ensemble import Ensemble
from decoding.sampling import SamplingConfig, draw, sample
from decoding.search import greedy_search
from tests.transformer.helpers import BOS, EOS, model_with_eos_bias, ragged_batch

LENGTHS = [6, 3, 9, 5, 7, 4]


def samples(model, src, config: SamplingConfig, n: int = 3) -> list[list[list[int]]]:  # noqa: ANN001
    return [[h.tokens for h in per] for per in sample(model, src, BOS, EOS, config, nsamples=n)]


def test_topk_one_is_greedy() -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    greedy = greedy_search(model, src, BOS, EOS)
    assert samples(model, src, SamplingConfig(topk=1, seed=5)) == [[g] * 3 for g in greedy]


@pytest.mark.parametrize(
    "config", [SamplingConfig(seed=2), SamplingConfig(topp=0.8, temperature=1.5, seed=7)]
)
def test_a_sentences_samples_depend_on_the_seed_and_the_sentence_only(config: SamplingConfig) -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    together = samples(model, src, config)
    alone = [samples(model, src[i : i + 1, : LENGTHS[i]], config)[0] for i in range(len(LENGTHS))]
    reordered = samples(model, src.flip(0), config)[::-1]
    assert together == alone == reordered
    assert len({tuple(map(tuple, s)) for s in together}) > 1
    assert samples(model, src, SamplingConfig(topp=config.topp, seed=config.seed + 1)) != together
    # An ensemble samples the same way: its own stream per sentence.
    ensemble = Ensemble([model, model_with_eos_bias(norm_first=True)])
    assert samples(ensemble, src, config) == [
        samples(ensemble, src[i : i + 1, : LENGTHS[i]], config)[0] for i in range(len(LENGTHS))
    ]


def test_samples_have_their_model_log_probability() -> None:
    model, src = model_with_eos_bias(), ragged_batch([5])
    hyp = sample(model, src, BOS, EOS, SamplingConfig(seed=3), nsamples=1)[0][0]
    assert len(hyp.tokens) < 17, "the sample should end with EOS before the length limit"
    tgt_in = torch.tensor([[BOS, *hyp.tokens]])
    tgt_out = torch.tensor([[*hyp.tokens, EOS]])
    log_probs = torch.log_softmax(model(src, tgt_in).float(), dim=-1).gather(2, tgt_out[..., None])
    assert hyp.log_prob == pytest.approx(log_probs.sum().item(), abs=1e-5)


def test_draws_follow_the_distribution_and_stay_in_the_top_k_and_nucleus() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    log_probs = probs.log().expand(40000, 4).contiguous()
    uniforms = torch.rand(40000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    counts = torch.bincount(draw(log_probs, uniforms, SamplingConfig()), minlength=4) / 40000
    torch.testing.assert_close(counts, probs, atol=0.01, rtol=0)
    top2 = torch.bincount(draw(log_probs, uniforms, SamplingConfig(topk=2)), minlength=4) / 40000
    torch.testing.assert_close(top2, torch.tensor([2 / 3, 1 / 3, 0, 0]), atol=0.01, rtol=0)
    nucleus = torch.bincount(draw(log_probs, uniforms, SamplingConfig(topp=0.7)), minlength=4) / 40000
    torch.testing.assert_close(nucleus, torch.tensor([2 / 3, 1 / 3, 0, 0]), atol=0.01, rtol=0)
    sharp = torch.bincount(draw(log_probs, uniforms, SamplingConfig(temperature=0.5)), minlength=4) / 40000
    torch.testing.assert_close(sharp, probs**2 / (probs**2).sum(), atol=0.01, rtol=0)


@pytest.mark.parametrize("bad", [dict(topk=-1), dict(topp=0.0), dict(topp=1.5), dict(temperature=0.0)])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        SamplingConfig(**bad)
