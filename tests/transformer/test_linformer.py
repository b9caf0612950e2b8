"""Linformer attention: exact with identity projections, padding projected out, lengths bounded."""

import pytest
import torch

from transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer.linformer import LinformerAttention, LinformerSelfAttention


def _qkv(b=2, h=2, n=7, d=8):
    return torch.randn(b, h, n, d), torch.randn(b, h, n, d), torch.randn(b, h, n, d)


def test_identity_projections_with_k_equal_to_n_are_softmax():
    q, k, v = _qkv()
    attention = LinformerAttention(projected_length=7, max_length=7)
    with torch.no_grad():
        attention.e.copy_(torch.eye(7))
        attention.f.copy_(torch.eye(7))
    out, _ = attention(q, k, v)
    expected, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_padded_keys_contribute_nothing_and_a_sentence_projects_the_same_alone():
    q, k, v = _qkv(b=1, n=9)
    attention = LinformerAttention(projected_length=4, max_length=16)
    mask = (torch.arange(9) < 5)[None, None, None, :]  # 5 real keys, 4 padded
    junk_k, junk_v = k.clone(), v.clone()
    junk_k[:, :, 5:], junk_v[:, :, 5:] = 1e3, -1e3
    padded, weights = attention(q, junk_k, junk_v, mask, need_weights=True)
    alone, _ = attention(q, k[:, :, :5], v[:, :, :5])
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)
    assert weights.shape == (1, 2, 9, 9) and (weights[..., 5:] == 0).all()


def test_cross_attention_projects_keys_of_another_length():
    q, k, v = torch.randn(2, 2, 3, 8), torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)
    out, weights = LinformerAttention(projected_length=4, max_length=16)(q, k, v, need_weights=True)
    assert out.shape == (2, 2, 3, 8) and weights.shape == (2, 2, 3, 11)
    torch.testing.assert_close(weights @ v, out, atol=1e-5, rtol=1e-5)  # the implied weights P·F


def test_a_sequence_longer_than_the_projections_and_causal_use_are_refused():
    q, k, v = _qkv(n=9)
    with pytest.raises(ValueError, match="9 keys, but its projections cover attention.max_length=8"):
        LinformerAttention(4, max_length=8)(q, k, v)
    with pytest.raises(ValueError, match="cannot be causal"):
        LinformerAttention(4, max_length=16)(q, k, v, causal=True)


@pytest.mark.parametrize("layout", ["contiguous", "split from a projection"])
def test_the_heads_projected_at_once_are_each_heads_own_product(layout):
    """E K for all heads in one product equals E K_h head by head, whatever the keys' strides
    (the layer hands over views of its fused Q/K/V projection), values and gradients alike."""
    torch.manual_seed(0)
    b, h, n, d = 2, 3, 9, 4
    if layout == "contiguous":
        k = torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True)
        heads = k
    else:
        k = torch.randn(b, n, 3 * h * d, dtype=torch.float64, requires_grad=True)
        heads = k[..., h * d : 2 * h * d].unflatten(-1, (h, d)).transpose(1, 2)  # (B, H, n, d) view
    attention = LinformerAttention(projected_length=5, max_length=12).double()
    projected, _ = attention.project_sequence(heads, heads, None)
    expected = torch.stack([attention.e[:, :n] @ heads[:, i] for i in range(h)], dim=1)
    torch.testing.assert_close(projected, expected)
    g = torch.randn_like(projected)
    torch.testing.assert_close(
        torch.autograd.grad(projected, k, g)[0], torch.autograd.grad(expected, k, g)[0]
    )


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_self_attention_projects_the_inputs_first_and_is_the_same_layer(padded):
    """The layer's self-attention takes E x and F x through W_K, W_V (k rows, not n), the bias
    weighted by E's and F's sums over the real keys: the same outputs, weights and gradients as
    the mechanism given the layer's n projected keys and values."""
    torch.manual_seed(0)
    layer = LinformerSelfAttention(16, 4, mechanism=LinformerAttention(5, 12)).double()
    with torch.no_grad():
        layer.in_proj.bias.normal_()  # zero at initialisation: the bias term would go untested
    x = torch.randn(3, 9, 16, dtype=torch.float64, requires_grad=True)
    mask = (torch.arange(9) < torch.tensor([9, 6, 3])[:, None])[:, None, None, :] if padded else None
    compressed, compress = [], layer.mechanism.compress
    layer.mechanism.compress = lambda *args: compressed.append(True) or compress(*args)
    out, weights = layer(x, mask=mask, need_weights=True)
    assert compressed == [True]  # 9 positions, 5 projected rows: the sequence projected first
    q, k, v = MultiHeadAttention.project(layer, x)
    expected, expected_weights = layer.mechanism(q, k, v, mask, need_weights=True)
    expected = layer.out_proj(expected.transpose(1, 2).reshape(3, 9, 16))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    g = torch.randn_like(out)
    leaves = [x, *layer.parameters()]
    got = torch.autograd.grad(layer(x, mask=mask)[0], leaves, g)
    for a, b in zip(got, torch.autograd.grad(expected, leaves, g), strict=True):
        torch.testing.assert_close(a, b)


def test_self_attention_under_bf16_autocast_gives_fp32_gradients_close_to_fp32s():
    """The projections' own backward (one gradient for in_proj, written block by block) under
    autocast: the parameters' and the input's gradients stay fp32, near those without autocast."""
    torch.manual_seed(0)
    layer = LinformerSelfAttention(32, 4, mechanism=LinformerAttention(8, 16))
    x = torch.randn(2, 16, 32, requires_grad=True)
    grads = []
    for enabled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            out, _ = layer(x)
        grads.append(torch.autograd.grad(out.float().sum(), [x, *layer.parameters()]))
    for a, b in zip(*grads, strict=True):
        assert b.dtype == torch.float32
        assert (b - a).norm() <= 0.02 * a.norm()  # bf16's 8 bits of mantissa, summed over n


def test_a_sequence_no_longer_than_the_projection_takes_the_usual_path():
    """With n ≤ k the n keys are fewer rows than the k projected ones: the layer projects them
    as for any mechanism, and E K, F V are taken from them."""
    layer = LinformerSelfAttention(16, 4, mechanism=LinformerAttention(5, 12))
    assert layer.mechanism.compresses(6) and not layer.mechanism.compresses(5)
    calls, compressed = [], []
    layer.mechanism.register_forward_pre_hook(lambda m, args: calls.append(len(args)))
    compress = layer.mechanism.compress
    layer.mechanism.compress = lambda *args: compressed.append(True) or compress(*args)
    layer(torch.randn(2, 5, 16))
    assert calls == [7] and not compressed  # the mechanism given the n keys and values
