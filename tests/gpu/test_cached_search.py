"""On CUDA, greedy and beam search with the K/V caches equal recomputing the whole prefix each step."""

from __future__ import annotations

import pytest
import torch

from bench.uncached import Recomputing
from fastpaths.cpu import for_cpu_inference
from tests.transformer.helpers import BOS, EOS, model_with_eos_bias, ragged_batch
from transformer.search import beam_search, greedy_search

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_cached_search_equals_recomputed_search_on_cuda(norm_first):
    model = for_cpu_inference(model_with_eos_bias(norm_first).cuda().eval())  # plain on a GPU
    src = ragged_batch([5, 8, 3, 6, 11, 2, 9, 7, 4, 10], seed=int(norm_first)).cuda()
    greedy = greedy_search(model, src, BOS, EOS)
    assert greedy == greedy_search(Recomputing(model), src, BOS, EOS)
    assert len({len(g) for g in greedy}) > 1, "outputs should end at different lengths"
    cached = beam_search(model, src, BOS, EOS, beam_size=4, nbest=4)
    recomputed = beam_search(Recomputing(model), src, BOS, EOS, beam_size=4, nbest=4)
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in recomputed]
    for a, b in zip(cached, recomputed, strict=True):
        # Different kernels (one query against the cache, or the whole prefix): fp32 rounding only.
        torch.testing.assert_close(
            torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]), atol=1e-4, rtol=1e-5
        )
