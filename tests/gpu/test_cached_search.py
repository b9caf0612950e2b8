"""On CUDA, greedy and beam search with the K/V caches equal recomputing the whole prefix each step."""

from __future__ import annotations

import pytest
import torch

from bench.uncached import Recomputing
from tests.transformer.helpers import BOS, EOS, PAD, random_tokens, tiny_model
from transformer.search import beam_search, greedy_search

pytestmark = pytest.mark.gpu


def _model_with_eos_bias(norm_first: bool) -> torch.nn.Module:
    """A random fp32 model on CUDA with a bias towards EOS, so that outputs end at varied lengths."""
    model = tiny_model(norm_first, tie_output=False)
    output = torch.nn.Linear(model.cfg.d_model, model.cfg.tgt_vocab_size)
    with torch.no_grad():
        output.weight.copy_(model.output.weight)
        output.bias.zero_()
        output.bias[EOS] = 2.5
    model.output = output
    return model.cuda().eval().pack_for_inference()  # packing is a CPU path: a no-op here


def _ragged_batch(lengths: list[int], vocab: int = 37, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = random_tokens(1, n, vocab, g)
        src[i, n - 1] = EOS
    return src.cuda()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_cached_search_equals_recomputed_search_on_cuda(norm_first):
    model = _model_with_eos_bias(norm_first)
    src = _ragged_batch([5, 8, 3, 6, 11, 2, 9, 7, 4, 10], seed=int(norm_first))
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
