"""Ensembles: the weighted mean of the members' log-probabilities, with each member's own caches."""

from __future__ import annotations

import pytest
import torch

from bench.uncached import Recomputing
from decoding.ensemble import Ensemble
from decoding.search import beam_search, greedy_search
from decoding.state import CachedDecoder
from tests.transformer.helpers import BOS, EOS, model_with_eos_bias, ragged_batch, tiny_model

LENGTHS = [6, 3, 9, 5, 7, 4]


def tokens(hyps) -> list[list[list[int]]]:  # noqa: ANN001
    return [[h.tokens for h in n] for n in hyps]


def test_an_ensemble_of_a_model_with_itself_is_the_model() -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    pair = Ensemble([model, model], weights=[0.3, 0.7])
    assert greedy_search(pair, src, BOS, EOS) == greedy_search(model, src, BOS, EOS)
    alone = beam_search(model, src, BOS, EOS, beam_size=4, nbest=3)
    together = beam_search(pair, src, BOS, EOS, beam_size=4, nbest=3)
    assert tokens(together) == tokens(alone)
    for a, b in zip(alone, together, strict=True):
        torch.testing.assert_close(torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]))


def test_a_zero_weight_member_changes_nothing() -> None:
    model, other, src = model_with_eos_bias(), tiny_model(), ragged_batch(LENGTHS)
    weighted = Ensemble([model, other], weights=[1.0, 0.0])
    assert tokens(beam_search(weighted, src, BOS, EOS, beam_size=3)) == tokens(
        beam_search(model, src, BOS, EOS, beam_size=3)
    )


def first_step_log_probs(model, src: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    decoder = CachedDecoder(model)
    state = decoder.start(src, max_steps=8)
    return torch.log_softmax(
        model.logits(decoder.step(torch.full((src.size(0),), BOS), state)).float(), dim=-1
    )


@pytest.mark.parametrize("second", ["softmax", "linear", "local"])
def test_members_of_other_attention_mechanisms_ensemble_as_the_mean_of_their_log_probs(second: str) -> None:
    torch.manual_seed(0)
    first = model_with_eos_bias()
    other = tiny_model(attention={"decoder_self": second}, d_model=48, n_heads=6)
    src = ragged_batch(LENGTHS)
    ensemble = Ensemble([first, other], weights=[2.0, 1.0])
    # Greedy's first token is the argmax of the weighted mean, computed here by hand.
    mean = (2 * first_step_log_probs(first, src) + first_step_log_probs(other, src)) / 3
    outputs = greedy_search(ensemble, src, BOS, EOS)
    assert [out[0] if out else EOS for out in outputs] == mean.argmax(dim=-1).tolist()
    # Each member keeps its own caches: the same as recomputing every prefix.
    recomputed = Ensemble([Recomputing(first), Recomputing(other)], weights=[2.0, 1.0])
    assert tokens(beam_search(ensemble, src, BOS, EOS, beam_size=3, nbest=2)) == tokens(
        beam_search(recomputed, src, BOS, EOS, beam_size=3, nbest=2)
    )


def test_an_ensembles_beams_do_not_depend_on_the_batch() -> None:
    ensemble = Ensemble([model_with_eos_bias(), tiny_model(attention={"decoder_self": "linear"})])
    src = ragged_batch(LENGTHS)
    together = tokens(beam_search(ensemble, src, BOS, EOS, beam_size=3, nbest=2))
    alone = [
        tokens(beam_search(ensemble, src[i : i + 1], BOS, EOS, beam_size=3, nbest=2))[0]
        for i in range(len(LENGTHS))
    ]
    assert together == alone


def test_members_must_share_the_vocabularies() -> None:
    with pytest.raises(ValueError, match="tgt_vocab_size=40, model 1 41"):
        Ensemble([tiny_model(), tiny_model(tgt_vocab_size=40)])
    with pytest.raises(ValueError, match="2 weights for 1 models"):
        Ensemble([tiny_model()], weights=[1, 2])
