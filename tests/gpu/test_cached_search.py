"""Greedy and beam search with the K/V caches equal recomputing the whole prefix each step, with the
model and the search kernels ``fastpaths.optimize`` gives the device: on the CPU (in CI) and on
CUDA (marked ``gpu``)."""

from __future__ import annotations

import pytest
import torch

from bench.uncached import Recomputing
from decoding.search import beam_search, greedy_search
from fastpaths.optimize import optimize
from tests.transformer.helpers import BOS, EOS, model_with_eos_bias, ragged_batch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_cached_search_equals_recomputed_search(device, norm_first):
    model = model_with_eos_bias(norm_first).to(device).eval()
    kernels = optimize(model, device, "inference").search
    src = ragged_batch([5, 8, 3, 6, 11, 2, 9, 7, 4, 10], seed=int(norm_first)).to(device)
    with torch.inference_mode(), kernels.context():
        greedy = greedy_search(model, src, BOS, EOS)
        assert greedy == greedy_search(Recomputing(model), src, BOS, EOS)
        cached = beam_search(model, src, BOS, EOS, beam_size=4, nbest=4, kernels=kernels)
        recomputed = beam_search(Recomputing(model), src, BOS, EOS, beam_size=4, nbest=4, kernels=kernels)
    assert len({len(g) for g in greedy}) > 1, "outputs should end at different lengths"
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in recomputed]
    for a, b in zip(cached, recomputed, strict=True):
        # Different kernels (one query against the cache, or the whole prefix): fp32 rounding only.
        torch.testing.assert_close(
            torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]), atol=1e-4, rtol=1e-5
        )
