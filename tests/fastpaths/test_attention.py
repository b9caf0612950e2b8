"""The written-out attention and its short-row softmax equal the paper's attention, and the
CPU's kernel module takes them only where they pay."""

import pytest
import torch

from fastpaths import attention as cpu_attention
from fastpaths.cpu import for_cpu_inference
from transformer.attention import MultiHeadAttention, scaled_dot_product_attention

pytestmark = pytest.mark.cpu_dependent


@pytest.mark.parametrize("length", [1, 2, 7, 15, 16, 33])
def test_softmax_equals_torch_softmax(length):
    """The written-out softmax (short rows, autograd off) equals PyTorch's, masked keys included;
    with autograd on it is PyTorch's and has gradients."""
    scores = torch.randn(10, 4, 3, length) * 5
    scores[0, 0, 0, : length - 1] = float("-inf")  # one key left
    with torch.no_grad():
        torch.testing.assert_close(cpu_attention.softmax(scores.clone()), scores.softmax(dim=-1))
    leaf, reference = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    weights = cpu_attention.softmax(leaf)
    torch.testing.assert_close(weights, reference.softmax(dim=-1))
    weights[..., 0].sum().backward()
    reference.softmax(dim=-1)[..., 0].sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    torch.testing.assert_close(leaf.grad, reference.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tq", "tk", "causal"), [(1, 9, False), (5, 20, False), (6, 6, True), (4, 11, True)])
def test_written_out_attention_equals_the_papers(dtype, tq, tk, causal):
    """What decoding (autograd off, few queries) and bf16 take on the CPU equals equation (1),
    key padding and causal masks included."""
    g = torch.Generator().manual_seed(tq * 100 + tk)
    q, k, v = (torch.randn(3, 2, n, 8, generator=g).to(dtype) for n in (tq, tk, tk))
    mask = (torch.arange(tk) < torch.tensor([tk, tk - 2, 3])[:, None])[:, None, None, :]
    mask[..., 0] = True  # every causal row sees key 0
    expected, _ = scaled_dot_product_attention(q.float(), k.float(), v.float(), mask, causal)
    with torch.no_grad():
        assert cpu_attention.prefers_written_out(q, tk)
        full = mask & torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq) if causal else mask
        got = cpu_attention.attention(q, k, v, full)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


def test_multi_head_attention_takes_the_seam_only_where_it_pays():
    """fp32 with autograd on (training) and long queries use the fused kernel; decoding-sized
    queries with autograd off use the written-out one; both give the same outputs."""
    mha = for_cpu_inference(MultiHeadAttention(16, 4, causal=True).eval())
    x = torch.randn(2, 5, 16)
    assert not cpu_attention.prefers_written_out(torch.randn(2, 4, 5, 4), 5)  # autograd on
    assert not cpu_attention.prefers_written_out(torch.randn(2, 4, cpu_attention.SMALL_QUERY + 1, 4), 17)
    # bf16 (training under autocast) is written out over short keys only: long ones go fused.
    q16 = torch.randn(1, 2, 64, 4, dtype=torch.bfloat16)
    assert cpu_attention.prefers_written_out(q16, cpu_attention.LONG_KEYS)
    assert not cpu_attention.prefers_written_out(q16, cpu_attention.LONG_KEYS + 1)
    with_weights, _ = mha(x, need_weights=True)
    with torch.no_grad():
        torch.testing.assert_close(mha(x)[0], with_weights, atol=1e-6, rtol=1e-5)
