"""Scaled dot-product attention: the written-out path, the fused path and the masks."""

import pytest
import torch

from transformer.attention import (
    MultiHeadAttention,
    causal_mask,
    fused_attention,
    scaled_dot_product_attention,
)


def _qkv(b=3, h=2, tq=5, tk=7, d=8):
    return torch.randn(b, h, tq, d), torch.randn(b, h, tk, d), torch.randn(b, h, tk, d)


def _key_mask(b, tk):
    lengths = torch.tensor([tk, tk - 2, 1])[:b]
    return (torch.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Tk)


def test_weights_are_row_stochastic_and_respect_the_mask():
    q, k, v = _qkv()
    mask = _key_mask(3, 7)
    out, w = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 5))
    assert (w.masked_select(~mask.expand_as(w)) == 0).all()
    torch.testing.assert_close(out, w @ v)


def test_weights_are_softmax_of_scaled_scores():
    q, k, v = _qkv(b=1, h=1, tq=2, tk=3, d=4)
    _, w = scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)  # sqrt(4) = 2
    torch.testing.assert_close(w, expected)


@pytest.mark.parametrize("tq,tk", [(5, 5), (1, 5), (3, 7)])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_equals_written_out(tq, tk, with_mask, causal):
    q, k, v = _qkv(tq=tq, tk=tk)
    mask = _key_mask(3, tk) if with_mask else None
    if with_mask and causal:
        # Key 0 is visible to every causal query; keep it unmasked so no row is all -inf.
        mask[..., 0] = True
    expected, _ = scaled_dot_product_attention(q, k, v, mask, causal)
    torch.testing.assert_close(fused_attention(q, k, v, mask, causal), expected, atol=1e-6, rtol=1e-5)


def test_causal_mask_with_cached_prefix():
    # 2 new queries after 3 cached keys: positions 3 and 4 of 5.
    expected = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 5, torch.device("cpu")), expected)


def test_causal_rows_never_see_the_future():
    q, k, v = _qkv(tq=6, tk=6)
    _, w = scaled_dot_product_attention(q, k, v, causal=True)
    assert (w.triu(diagonal=1) == 0).all()


def test_multihead_need_weights_matches_fused_path():
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    mask = _key_mask(2, 6)
    fast, none = mha(x, mask=mask)
    slow, w = mha(x, mask=mask, need_weights=True)
    assert none is None and w.shape == (2, 4, 6, 6)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
