"""The search step's block top-k and in-place normaliser equal topk and log_softmax."""

import pytest
import torch

from fastpaths.search import row_topk, top_log_probs


@pytest.mark.parametrize("vocab", [40, 640, 1000, 8000, 8063])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_topk_equals_topk(vocab, dtype):
    """Block maxima first, then topk inside the best blocks: the same values as ``topk``,
    whole blocks or a partial last block, scaled rows, a row whose best are all at the end."""
    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn(7, vocab, generator=g) * torch.tensor([0.1, 1, 10, 100, 1, 1, 1])[:, None]).to(dtype)
    x[4, -5:] = 1e4  # the partial block holds the best
    x[5, ::64] = 1e4  # each best entry in a block of its own
    x[6, :3] = float("-inf")
    values, index = row_topk(x, 10)
    expected = x.topk(10, dim=-1).values
    assert torch.equal(values, expected)
    assert torch.equal(x.gather(1, index), values)
    assert all(len(set(row)) == 10 for row in index.tolist())  # ten different tokens per row


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("contiguous", [True, False])
def test_top_log_probs_are_log_softmax_at_the_top_tokens(dtype, contiguous):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 1000, generator=g) * 4).to(dtype)
    expected = logits.float().log_softmax(-1).topk(4, dim=-1)
    given = logits.clone() if contiguous else logits.t().clone().t()
    values, tokens = top_log_probs(given, 4)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(values, expected.values, atol=tol, rtol=tol)
    assert torch.equal(logits.gather(1, tokens), logits.gather(1, expected.indices))
