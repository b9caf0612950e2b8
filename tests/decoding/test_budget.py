"""The budgets of a search by device: the batch of hypothesis tokens, the logits' block."""

import pytest
import torch

from decoding import budget
from decoding.config import DecodingConfig


def test_a_gpu_decodes_far_more_at_once_than_the_cpu():
    assert budget.default_max_tokens("cpu") == budget.CPU_TOKENS == 3072  # translate.py's 400 MiB
    for device in ("cuda", torch.device("cuda:1"), "mps"):
        assert budget.default_max_tokens(device) == budget.ACCELERATOR_TOKENS
        # hundreds of sentences of Multi30k's ~15 subwords searched with beam 5 at once
        assert budget.ACCELERATOR_TOKENS // (5 * 16) >= 200
    assert budget.logit_block_rows("cpu", 8000) == budget.CPU_LOGIT_VALUES // 8000
    assert budget.logit_block_rows("cuda", 8000) == budget.ACCELERATOR_LOGIT_VALUES // 8000
    assert budget.logit_block_rows("cpu", 10**9) == 1


@pytest.mark.parametrize(
    "config, hypotheses",
    [
        (DecodingConfig(beam_size=4), 4),
        (DecodingConfig(greedy=True), 1),
        (DecodingConfig(sampling=True, nbest=3), 3),
    ],
)
def test_each_source_counts_once_per_hypothesis_with_its_eos(config, hypotheses):
    assert config.hypotheses == hypotheses
    assert budget.hypothesis_widths([3, 0, 7], config.hypotheses) == [
        4 * hypotheses,
        hypotheses,
        8 * hypotheses,
    ]


def test_the_config_says_which_search():
    assert DecodingConfig().search == "beam"
    assert DecodingConfig(greedy=True).search == "greedy"
    assert DecodingConfig(sampling=True, nbest=4).search == "sampling"
    with pytest.raises(ValueError, match="greedy and sampling exclude each other"):
        DecodingConfig(greedy=True, sampling=True)
    with pytest.raises(ValueError, match="nbest=6 must be between 1 and the beam size"):
        DecodingConfig(beam_size=5, nbest=6)
