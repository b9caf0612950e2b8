"""decoding/alignment.py: the cross-attention of given outputs, on tiny random models (properties)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from decoding.alignment import check_layers, cross_attention, forced_attention, layer_index
from decoding.ensemble import Ensemble
from decoding.search import greedy_search
from decoding.state import CachedDecoder
from tests.transformer.helpers import BOS, EOS, model_with_eos_bias, random_tokens, tiny_model


@given(st.integers(1, 12), st.data())
def test_layers_count_from_one_and_from_the_end(n_layers: int, data: st.DataObject) -> None:
    layer = data.draw(st.integers(1, n_layers))
    assert layer_index(n_layers, layer) == layer - 1
    assert layer_index(n_layers, layer - n_layers - 1) == layer - 1  # -1 is the last, -n the first
    for wrong in (0, n_layers + 1, -n_layers - 1):
        with pytest.raises(ValueError, match=f"the decoder has {n_layers} layer"):
            layer_index(n_layers, wrong)


def pairs_of(lengths: list[tuple[int, int]], seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(source, output) pairs of those lengths, ids from the tiny models' ordinary range."""
    g = torch.Generator().manual_seed(seed)
    return [
        (random_tokens(1, s, 37, g)[0].tolist(), random_tokens(1, o, 41, g)[0].tolist()) for s, o in lengths
    ]


LENGTHS = [(5, 3), (1, 1), (9, 7), (3, 0), (6, 10)]


def test_rows_are_distributions_over_the_real_source_tokens() -> None:
    model = tiny_model()
    for pair, attention in zip(
        LENGTHS, forced_attention(model, pairs_of(LENGTHS), BOS, EOS, [1, 2], max_tokens=64), strict=True
    ):
        source, output = pair
        assert attention.shape == (2, output + 1, source + 1)  # EOS's row and column included
        torch.testing.assert_close(attention.sum(dim=-1), torch.ones(2, output + 1))


def test_a_pair_is_attended_alike_alone_and_in_any_batch() -> None:
    model = tiny_model(norm_first=True)
    pairs = pairs_of(LENGTHS, seed=1)
    together = forced_attention(model, pairs, BOS, EOS, [-1], max_tokens=10_000)
    for pair, found in zip(pairs, together, strict=True):
        (alone,) = forced_attention(model, [pair], BOS, EOS, [-1], max_tokens=1)
        torch.testing.assert_close(alone, found, atol=1e-5, rtol=1e-5)


def test_forced_attention_is_the_attention_the_search_read() -> None:
    """Teacher-forced on a greedy output, each layer's rows are what the incremental decoder's
    cross-attention computed at each step, with its caches."""
    model = model_with_eos_bias()
    src = torch.tensor([[5, 9, 12, 7, EOS]])
    (output,) = greedy_search(model, src, BOS, EOS, max_len_a=0.0, max_len_b=6)
    state = CachedDecoder(model).start(src, len(output) + 1)
    steps = []
    for token in [BOS, *output]:
        _, weights = model.decode(
            torch.tensor([[token]]),
            state.sources,
            state.src_mask,
            state.states,
            state.step,
            need_weights=True,
        )
        state.step += 1
        steps.append(torch.stack([w.float().mean(dim=1)[0, 0] for w in weights]))  # (L, S)
    (forced,) = forced_attention(model, [(src[0, :-1].tolist(), output)], BOS, EOS, [1, 2], max_tokens=100)
    torch.testing.assert_close(forced, torch.stack(steps, dim=1), atol=1e-5, rtol=1e-5)


def test_an_ensemble_attends_as_its_members_weighted_mean() -> None:
    torch.manual_seed(0)
    a, b = tiny_model(), tiny_model(n_decoder_layers=3)
    src = torch.tensor([[5, 9, 12, 7, EOS], [6, 4, EOS, 0, 0]])
    tgt_in = torch.tensor([[BOS, 8, 9, 10], [BOS, 11, 0, 0]])
    ensemble = Ensemble([a, b], weights=[3.0, 1.0])
    expected = 0.75 * cross_attention(a, src, tgt_in, [-1]) + 0.25 * cross_attention(b, src, tgt_in, [-1])
    torch.testing.assert_close(cross_attention(ensemble, src, tgt_in, [-1]), expected)
    torch.testing.assert_close(
        cross_attention(Ensemble([a, a]), src, tgt_in, [1]), cross_attention(a, src, tgt_in, [1])
    )
    with pytest.raises(ValueError, match="has 2 layers"):
        check_layers(ensemble, [3])  # the member with 3 has it, the one with 2 does not
