"""Nyström attention: softmax with as many landmarks as tokens, segments that follow the real length."""

import math

import pytest
import torch

from transformer.attention import scaled_dot_product_attention
from transformer.nystrom import NystromAttention, iterative_pinv, segments


def _qkv(b=2, h=2, n=13, d=8):
    return torch.randn(b, h, n, d), torch.randn(b, h, n, d), torch.randn(b, h, n, d)


@pytest.mark.parametrize(("iterations", "tolerance"), [(6, 0.05), (20, 5e-4)])
@pytest.mark.parametrize("extra", [0, 3], ids=["m=n", "m=n+3"])
def test_as_many_landmarks_as_tokens_is_softmax_to_the_pseudo_inverses_tolerance(
    iterations, tolerance, extra
):
    """Every token its own landmark: Ŝ = S A⁺ S = S, up to equation (16)'s iteration (6 steps:
    within 0.05 of softmax's output; 20 steps: within 5e-4)."""
    torch.manual_seed(0)
    q, k, v = _qkv()
    expected, _ = scaled_dot_product_attention(q, k, v)
    out, weights = NystromAttention(13 + extra, iterations)(q, k, v, need_weights=True)
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=0)
    torch.testing.assert_close(weights @ v, out, atol=1e-5, rtol=1e-5)


def test_the_iteration_converges_to_the_inverse():
    a = torch.randn(3, 6, 6).softmax(-1)
    torch.testing.assert_close(iterative_pinv(a, 30) @ a, torch.eye(6).expand(3, 6, 6), atol=1e-4, rtol=0)


def test_segments_follow_each_sentences_real_length():
    one_hot = segments(8, 3, torch.tensor([6, 2]))
    assert one_hot[0].int().argmax(-1)[:6].tolist() == [0, 0, 1, 1, 2, 2]
    assert one_hot[1].int().argmax(-1)[:2].tolist() == [0, 1]  # segment 2 empty
    assert not one_hot[0, 6:].any() and not one_hot[1, 2:].any()


def test_a_sentence_is_the_same_alone_and_padded():
    torch.manual_seed(0)
    q, k, v = _qkv(b=1, n=11)
    mask = (torch.arange(11) < 7)[None, None, None, :]
    junk_q, junk_k, junk_v = q.clone(), k.clone(), v.clone()
    junk_q[:, :, 7:], junk_k[:, :, 7:], junk_v[:, :, 7:] = 50.0, -50.0, 1e3
    attention = NystromAttention(landmarks=3)
    padded, _ = attention(junk_q, junk_k, junk_v, mask)
    alone, _ = attention(q[:, :, :7], k[:, :, :7], v[:, :, :7])
    torch.testing.assert_close(padded[:, :, :7], alone, atol=1e-5, rtol=1e-5)


def test_unpadded_segments_by_reshape_are_the_one_hot_means():
    """Without a mask and with n a multiple of m, the landmarks are a reshape's means; a mask with
    every key real takes the one-hot route. Outputs and gradients agree (to fp32's rounding: the
    mechanism computes in fp32)."""
    torch.manual_seed(0)
    leaves = [t.requires_grad_() for t in _qkv(n=12)]
    everything = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    attention = NystromAttention(landmarks=4)
    by_reshape, _ = attention(*leaves)
    by_one_hot, _ = attention(*leaves, everything)
    torch.testing.assert_close(by_reshape, by_one_hot, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(by_reshape)
    first = torch.autograd.grad(by_reshape, leaves, g)
    second = torch.autograd.grad(by_one_hot, leaves, g)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_causal_use_is_refused():
    with pytest.raises(ValueError, match="cannot be causal"):
        NystromAttention(4)(*_qkv(), causal=True)


@pytest.mark.parametrize("lengths", [None, [13, 9, 2]], ids=["unpadded", "padded"])
def test_the_fused_path_is_the_written_out_products(lengths):
    """Without weights, the two outer products go through the fused kernel, associated the other
    way (softmax(QK̃ᵀ)·(A⁺·softmax(Q̃Kᵀ)V)); with them, through the written-out matrices. The
    same outputs and gradients."""
    torch.manual_seed(0)
    n = 13 if lengths else 16
    q, k, v = (torch.randn(3, 2, n, 8, requires_grad=True) for _ in range(3))  # fp32: the flash kernel's
    mask = None if lengths is None else (torch.arange(n) < torch.tensor(lengths)[:, None])[:, None, None, :]
    attention = NystromAttention(4)
    fused, none = attention(q, k, v, mask)
    written, weights = attention(q, k, v, mask, need_weights=True)
    assert none is None and weights is not None
    torch.testing.assert_close(fused, written, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(fused)
    grads = torch.autograd.grad(fused, (q, k, v), g), torch.autograd.grad(written, (q, k, v), g)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _smooth(n: int, d: int, scale: float, generator: torch.Generator, frequencies: int = 3) -> torch.Tensor:
    """[2, 2, n, d]: each coordinate a random mix of the first ``frequencies`` Fourier modes over the
    positions (smooth in the position, as the paper's argument for segment-means assumes)."""
    t = torch.linspace(0, 1, n)[:, None]
    modes = [torch.cos(2 * math.pi * f * t) for f in range(frequencies)]
    modes += [torch.sin(2 * math.pi * f * t) for f in range(1, frequencies)]
    basis = torch.cat(modes, 1)  # (n, 2F - 1)
    return scale * basis @ torch.randn(2, 2, basis.size(1), d, generator=generator) / basis.size(1) ** 0.5


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_fewer_landmarks_than_tokens_is_close_to_softmax_on_smooth_inputs(scale, seed):
    """256 tokens, m = 8, 16, 32 landmarks (m < n): on queries, keys and values smooth in the
    position the relative error to softmax is within 0.15 at m = 8 and 0.02 from m = 16 (the rest
    is the 6 pseudo-inverse steps), and does not grow with m. On random inputs, which segment means
    cannot summarise, the same measure is ~0.9: the bound is not one any input meets."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (_smooth(256, 16, s, g) for s in (scale, scale, 1.0))
    exact, _ = scaled_dot_product_attention(q, k, v)
    errors = {}
    for m in (8, 16, 32):
        out, _ = NystromAttention(m)(q, k, v)
        errors[m] = ((out - exact).norm() / exact.norm()).item()
    assert errors[8] <= 0.15 and errors[16] <= 0.02 and errors[32] <= 0.02, errors
    assert errors[32] <= errors[16] * 1.1 and errors[16] <= errors[8] * 1.1, errors
    rough = torch.randn(2, 2, 256, 16, generator=g)
    out, _ = NystromAttention(16)(rough, rough.flip(2), rough)
    exact, _ = scaled_dot_product_attention(rough, rough.flip(2), rough)
    assert ((out - exact).norm() / exact.norm()).item() > 0.5


def test_more_landmarks_than_tokens_cost_what_as_many_cost():
    """With m > n the extra landmarks are empty segments that drop out: the layer takes n
    landmarks, the same output without an m × m iteration (64 landmarks on 16 tokens held 8x the
    memory before)."""
    from bench.storage_meter import StorageMeter

    torch.manual_seed(0)
    q, k, v = (torch.randn(6, 4, 16, 64) for _ in range(3))
    mask = (torch.arange(16)[None] < torch.tensor([16, 12, 9, 16, 3, 1])[:, None])[:, None, None, :]
    outputs, peaks = {}, {}
    for m in (64, 16):
        qg = q.clone().requires_grad_()
        with StorageMeter() as meter:
            out, _ = NystromAttention(m)(qg, k, v, mask)
            out.sum().backward()
        outputs[m], peaks[m] = out, meter.peak_bytes
    torch.testing.assert_close(outputs[64], outputs[16])
    assert peaks[64] <= peaks[16] * 1.05, peaks
    # and still softmax attention to the 6-step iteration's tolerance (every token a landmark)
    expected = scaled_dot_product_attention(q, k, v, mask)[0]
    real = mask[:, 0, 0, :, None].expand(-1, -1, 64)[:, None].expand_as(q)
    torch.testing.assert_close(outputs[64][real], expected[real], atol=0.05, rtol=0)
