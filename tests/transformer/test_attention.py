"""Scaled dot-product attention: the written-out path, the fused path and the masks."""

import pytest
import torch

from transformer.attention import (
    MultiHeadAttention,
    causal_mask,
    fused_attention,
    scaled_dot_product_attention,
)
from transformer.kv_cache import KVCache


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
    fast, none = mha.self_attention(x, mask=mask)
    slow, w = mha.self_attention(x, mask=mask, need_weights=True)
    assert none is None and w.shape == (2, 4, 6, 6)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)


def test_cross_attention_groups_share_keys_without_copies():
    """g hypotheses per source against one K/V row == each hypothesis against repeated K/V."""
    mha = MultiHeadAttention(16, 4).eval()
    memory = torch.randn(3, 9, 16)
    mask = _key_mask(3, 9)
    y = torch.randn(3 * 4, 2, 16)  # 4 hypotheses per source, 2 query steps
    grouped, wg = mha.cross_attention(y, mha.project_kv(memory), mask, need_weights=True)
    k, v = mha.project_kv(memory.repeat_interleave(4, dim=0))
    repeated, wr = mha.cross_attention(y, (k, v), mask.repeat_interleave(4, dim=0), need_weights=True)
    torch.testing.assert_close(grouped, repeated, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(wg, wr)
    fused, _ = mha.cross_attention(y, mha.project_kv(memory), mask)
    torch.testing.assert_close(fused, grouped, atol=1e-6, rtol=1e-5)


def test_cross_attention_rejects_uneven_groups():
    mha = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="do not split evenly"):
        mha.cross_attention(torch.randn(5, 1, 16), mha.project_kv(torch.randn(2, 3, 16)))


@pytest.mark.parametrize("grad", [False, True])
def test_kv_cache_reorders_rows_and_keeps_them_contiguous(grad):
    """select keeps the chosen rows (duplicates too); with autograd off it leaves room for one
    step, so the next step's keys and values are one contiguous block for attention."""
    cache = KVCache(capacity=2)
    steps = [torch.randn(4, 2, 1, 3) for _ in range(5)]
    expected = torch.empty(4, 2, 0, 3)  # the keys each row should hold
    order = torch.tensor([1, 1, 3, 0])
    with torch.set_grad_enabled(grad):
        for t, step in enumerate(steps):
            k, v = cache.extend(step.requires_grad_(grad), -step)
            expected = torch.cat([expected, step.detach()], dim=2)
            torch.testing.assert_close(k, expected)
            torch.testing.assert_close(v, -expected)
            if t > 0 and not grad:
                assert k.is_contiguous() and v.is_contiguous()
            cache.select(order)
            expected = expected[order]


def test_a_decoders_caches_share_one_spare_storage():
    """Beam reordering copies each layer's cache into the storage the layer before freed: the
    layers together hold one storage more than they use, not one each."""
    from tests.transformer.helpers import random_tokens, tiny_model

    model = tiny_model(n_decoder_layers=3)
    with torch.no_grad():
        memory, src_mask = model.encode(random_tokens(2, 5, 37))
        state = model.start_decoding(memory, src_mask)
        assert len({id(cache.spare) for cache in state.self_caches}) == 1
        for _ in range(3):
            model.decode_step(torch.full((2,), 4), state)
            state.select(torch.tensor([1, 0]))
    stores = [cache._store.data_ptr() for cache in state.self_caches]
    spare = state.self_caches[0].spare.tensor
    assert spare is not None and len({*stores, spare.data_ptr()}) == 4
