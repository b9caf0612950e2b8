"""oneDNN-packed weights for CPU inference: F.linear's results, fresh after updates, never in autograd."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F

from tests.transformer.helpers import BOS, EOS, random_tokens, tiny_model
from transformer import packing
from transformer.packing import PackedLinears, packing_available
from transformer.search import beam_search, greedy_search

needs_onednn = pytest.mark.skipif(not packing_available(), reason="this PyTorch build has no oneDNN")


def _weights(out_features=24, in_features=16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(out_features, in_features, generator=g), torch.randn(out_features, generator=g)


@needs_onednn
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", [(5, 16), (3, 7, 16)])
def test_packed_linear_equals_f_linear(relu, shape):
    weight, bias = _weights()
    x = torch.randn(*shape)
    packed = PackedLinears(enabled=True)
    with torch.no_grad():
        got = packed.linear("w", x, weight, bias, relu=relu)
        expected = F.linear(x, weight, bias)
        expected = F.relu(expected) if relu else expected
    assert packed._packs, "the packed path was not taken"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_packed_linear_in_bfloat16_and_under_autocast():
    weight, bias = _weights()
    x = torch.randn(6, 16)
    packed = PackedLinears(enabled=True)
    with torch.no_grad():
        expected = F.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16())
        got = packed.linear("w", x.bfloat16(), weight.bfloat16(), bias.bfloat16())
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = packed.linear("w", x, weight, bias)
            reference = F.linear(x, weight, bias)
        assert auto.dtype == reference.dtype == torch.bfloat16
        torch.testing.assert_close(auto, reference, atol=2e-2, rtol=2e-2)


@needs_onednn
def test_a_slice_of_a_matrix_is_packed_under_its_own_name():
    weight, bias = _weights()
    x = torch.randn(4, 16)
    packed = PackedLinears(enabled=True)
    with torch.no_grad():
        top = packed.linear("top", x, weight[:8], bias[:8])
        rest = packed.linear("rest", x, weight[8:], bias[8:])
    torch.testing.assert_close(torch.cat([top, rest], -1), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_weights_changed_in_place_are_packed_again():
    """An optimizer step (or load_state_dict) between two decodings must not leave stale packs."""
    torch.manual_seed(0)
    model = tiny_model().pack_for_inference()
    src, tgt = random_tokens(2, 5, 37), random_tokens(2, 4, 41)
    with torch.no_grad():
        model(src, tgt)  # packs
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(src, tgt).logsumexp(-1).mean().backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        after = model(src, tgt)
        model.pack_for_inference(False)
        unpacked = model(src, tgt)
    torch.testing.assert_close(after, unpacked, atol=1e-4, rtol=1e-4)
    model.pack_for_inference()
    model.load_state_dict(tiny_model().state_dict())
    with torch.no_grad():
        loaded = model(src, tgt)
        model.pack_for_inference(False)
        torch.testing.assert_close(loaded, model(src, tgt), atol=1e-4, rtol=1e-4)


def test_autograd_never_sees_packed_weights():
    """With autograd on, the packed model computes the same loss and the same gradients."""
    torch.manual_seed(0)
    plain = tiny_model().train()
    packed = copy.deepcopy(plain).pack_for_inference()
    src, tgt = random_tokens(2, 5, 37), random_tokens(2, 4, 41)
    grads = []
    for model in (plain, packed):
        torch.manual_seed(1)  # the same dropout masks
        model(src, tgt).logsumexp(-1).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


@needs_onednn
def test_packed_model_decodes_like_the_plain_one():
    torch.manual_seed(0)
    plain = tiny_model()
    packed = copy.deepcopy(plain).pack_for_inference()
    src = random_tokens(3, 7, 37)

    def outputs(model):
        beams = beam_search(model, src, BOS, EOS, beam_size=3, nbest=3)
        return greedy_search(model, src, BOS, EOS), [[h.tokens for h in n] for n in beams]

    assert outputs(packed) == outputs(plain)
    assert packed.packed._packs and packed.decoder.layers[0].ffn.packed._packs


@needs_onednn
def test_copies_and_pickles_start_without_packs():
    model = tiny_model().pack_for_inference()
    with torch.no_grad():
        model(random_tokens(2, 5, 37), random_tokens(2, 4, 41))
    assert model.packed._packs
    clone = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    src, tgt = random_tokens(1, 3, 37), random_tokens(1, 2, 41)
    with torch.no_grad():
        expected = model(src, tgt)
    for other in (clone, loaded):
        assert other.packed.enabled and not other.packed._packs
        with torch.no_grad():
            torch.testing.assert_close(other(src, tgt), expected)
        assert other.packed._packs


def test_without_onednn_it_is_f_linear(monkeypatch):
    monkeypatch.setattr(packing, "packing_available", lambda: False)
    weight, bias = _weights()
    x = torch.randn(5, 16)
    packed = PackedLinears(enabled=True)
    with torch.no_grad():
        got = packed.linear("w", x, weight, bias, relu=True)
    torch.testing.assert_close(got, F.relu(F.linear(x, weight, bias)))
    assert not packed._packs
