"""What a search keeps between steps: sources shared by a sentence's hypotheses, the K/V caches."""

import pytest
import torch

from decoding.kv_cache import KVCache
from decoding.state import CachedDecoder, SharedSource, new_state
from tests.transformer.helpers import random_tokens, tiny_model
from transformer.attention import MultiHeadAttention


def _key_mask(b, tk):
    lengths = torch.tensor([tk, tk - 2, 1])[:b]
    return (torch.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Tk)


def test_shared_source_equals_each_hypothesis_with_its_own_copy():
    """g hypotheses per source against one K/V row == each hypothesis against repeated K/V."""
    mha = MultiHeadAttention(16, 4).eval()
    memory = torch.randn(3, 9, 16)
    mask = _key_mask(3, 9)
    y = torch.randn(3 * 4, 2, 16)  # 4 hypotheses per source, 2 query steps
    shared = SharedSource.of(mha.source(memory, mask))
    grouped, wg = mha(y, shared, mask, need_weights=True)
    repeated, wr = mha(
        y, memory.repeat_interleave(4, dim=0), mask.repeat_interleave(4, dim=0), need_weights=True
    )
    torch.testing.assert_close(grouped, repeated, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(wg, wr)
    fused, _ = mha(y, shared, mask)
    torch.testing.assert_close(fused, grouped, atol=1e-6, rtol=1e-5)


def test_shared_source_rejects_uneven_groups():
    mha = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="do not split evenly"):
        mha(torch.randn(5, 1, 16), SharedSource.of(mha.source(torch.randn(2, 3, 16))))


def test_shared_source_keeps_the_sentences_selected():
    mha = MultiHeadAttention(16, 4).eval()
    memory = torch.randn(3, 5, 16)
    shared = SharedSource.of(mha.source(memory))
    shared.select(torch.tensor([2, 0]))
    torch.testing.assert_close(shared.tensors[0], mha.source(memory[[2, 0]]).tensors[0])


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


def test_softmax_layers_get_kv_caches():
    model = tiny_model()
    assert all(isinstance(new_state(layer.self_attn.mechanism, 8), KVCache) for layer in model.decoder.layers)


def test_a_decoders_caches_share_one_spare_storage():
    """Beam reordering copies each layer's cache into the storage the layer before freed: the
    layers together hold one storage more than they use, not one each."""
    decoder = CachedDecoder(tiny_model(n_decoder_layers=3))
    with torch.no_grad():
        state = decoder.start(random_tokens(2, 5, 37), max_steps=16)
        assert len({id(cache.spare) for cache in state.states}) == 1
        for _ in range(3):
            decoder.step(torch.full((2,), 4), state)
            state.select(torch.tensor([1, 0]))
    stores = [cache._store.data_ptr() for cache in state.states]
    spare = state.states[0].spare.tensor
    assert spare is not None and len({*stores, spare.data_ptr()}) == 4
