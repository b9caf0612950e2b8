"""A search on CUDA never takes cuDNN's attention (it builds and keeps a plan for every new shape,
and a search's shapes change every step); training keeps whatever SDPA picks for its shapes.

What ``fastpaths.optimize`` gives each device, and that the search enters it, is checked on the
CPU (in CI); on CUDA (marked ``gpu``) a profile of a validation decode under bf16 autocast shows
no cuDNN attention kernel.
"""

from __future__ import annotations

import pytest
import torch

from decoding import DecodingConfig, Searcher
from fastpaths.optimize import CPU_SEARCH, CUDA_SEARCH, optimize
from tests.transformer.helpers import BOS, EOS, model_with_eos_bias, ragged_batch


def test_cuda_search_kernels_switch_cudnn_attention_off_for_the_search_only():
    assert optimize(torch.nn.Module(), "cuda", "inference").search is CUDA_SEARCH
    assert optimize(torch.nn.Module(), "cuda:1", "train").search is CUDA_SEARCH
    assert optimize(torch.nn.Module(), "cpu", "inference").search is CPU_SEARCH
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with CUDA_SEARCH.context():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before  # training's choice is left alone


def test_the_searcher_runs_its_search_inside_the_kernels_context():
    seen = []

    class Recording:
        def __enter__(self):
            seen.append(torch.is_inference_mode_enabled())

        def __exit__(self, *exc):
            return False

    kernels = type(CUDA_SEARCH)(context=Recording, name="recording")
    model = model_with_eos_bias().eval()
    Searcher(model, BOS, EOS, kernels).search(ragged_batch([4, 6]), DecodingConfig(greedy=True))
    assert seen == [True]


@pytest.mark.gpu
def test_a_validation_decode_on_cuda_takes_no_cudnn_attention():
    model = model_with_eos_bias().cuda().eval()
    kernels = optimize(model, "cuda", "train").search
    src = ragged_batch([5, 8, 3, 6, 11, 2, 9, 7, 4, 10]).cuda()
    searcher = Searcher(model, BOS, EOS, kernels)
    with (
        torch.autocast("cuda", dtype=torch.bfloat16),
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as profile,
    ):
        for config in (DecodingConfig(greedy=True), DecodingConfig(beam_size=4)):
            searcher.search(src, config)
    names = {event.name for event in profile.events()}
    assert any("scaled_dot_product" in n for n in names), "the profile saw no attention"
    # The operator (aten::_scaled_dot_product_cudnn_attention) and its kernels (cudnn_...).
    assert not [n for n in names if "cudnn" in n.lower()], sorted(names)
