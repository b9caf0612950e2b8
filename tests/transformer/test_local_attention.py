"""Local, atrous and sparse attention: exact where they must be, on blocks, with a window-bounded cache."""

import pytest
import torch

from transformer.attention import scaled_dot_product_attention
from transformer.local_attention import LocalAttention


def _qkv(b=2, h=2, n=13, d=8):
    return torch.randn(b, h, n, d), torch.randn(b, h, n, d), torch.randn(b, h, n, d)


def _key_mask(b, n, lengths=(None, 6)):
    lengths = torch.tensor([n if k is None else k for k in lengths])[:b]
    return (torch.arange(n)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, n)


KINDS = {
    "local": dict(window=3),
    "atrous": dict(window=2, dilation=3),
    "sparse": dict(window=2, stride=4),
}
EACH = pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])


@CAUSAL
@pytest.mark.parametrize("kind", [dict(window=13), dict(window=20), dict(window=13, stride=3)], ids=str)
def test_a_window_covering_the_sequence_is_softmax(kind, causal):
    q, k, v = _qkv()
    mask = _key_mask(2, 13)
    expected, _ = scaled_dot_product_attention(q, k, v, mask, causal)
    out, _ = LocalAttention(**kind)(q, k, v, mask, causal)
    real = mask[:, :, 0, :, None]  # (B, 1, n, 1): padded queries see other keys; their rows go unused
    torch.testing.assert_close(out * real, expected * real, atol=1e-5, rtol=1e-5)


@EACH
@CAUSAL
@pytest.mark.parametrize("n", [1, 5, 13, 16])
def test_blocks_compute_the_pattern_written_out(kind, causal, n):
    """The blocked computation == softmax over the pattern A(i) as an n × n mask (need_weights)."""
    q, k, v = _qkv(n=n)
    mask = _key_mask(2, n, lengths=(None, max(1, n // 2)))
    attention = LocalAttention(**kind)
    dense, weights = attention(q, k, v, mask, causal, need_weights=True)
    blocked, _ = attention(q, k, v, mask, causal)
    real = mask[:, :, 0, :, None]  # (B, 1, n, 1)
    torch.testing.assert_close(blocked * real, dense * real, atol=1e-5, rtol=1e-5)
    pos = torch.arange(n)
    seen = weights[0, 0] > 0
    assert torch.equal(seen, attention.allowed(pos[:, None], pos[None, :], causal))


def test_the_patterns_are_what_their_papers_say():
    i, j = torch.tensor(9), torch.arange(12)
    seen = {
        name: j[LocalAttention(**kind).allowed(i, j, causal=True)].tolist() for name, kind in KINDS.items()
    }
    assert seen == {"local": [7, 8, 9], "atrous": [6, 9], "sparse": [3, 7, 8, 9]}
    assert j[LocalAttention(window=2).allowed(i, j, causal=False)].tolist() == [8, 9, 10]


@EACH
def test_the_decoding_cache_is_bounded_by_the_window_and_equals_recomputation(kind):
    attention = LocalAttention(**kind)
    q, k, v = _qkv(n=20)
    full, _ = attention(q, k, v, causal=True)
    state = attention.new_state(20)
    for t in range(20):
        out, _ = attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, True, state)
        torch.testing.assert_close(out, full[:, :, t : t + 1], atol=1e-5, rtol=1e-5)
        assert state.k.size(2) <= attention.span
    held = state.k.size(2) + (0 if state.summary_k is None else state.summary_k.size(2))
    assert held == attention.span + (20 - attention.span) // 4 * bool(attention.stride)


def test_rows_reordered_in_the_cache_follow_their_hypotheses():
    attention = LocalAttention(window=3)
    q, k, v = _qkv(b=3, n=6)
    state = attention.new_state(6)
    for t in range(4):
        attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, True, state)
    order = torch.tensor([2, 2, 0])
    state.select(order)
    out, _ = attention(q[order, :, 4:5], k[order, :, 4:5], v[order, :, 4:5], None, True, state)
    full, _ = attention(q[order, :, :5], k[order, :, :5], v[order, :, :5], causal=True)
    torch.testing.assert_close(out, full[:, :, 4:5], atol=1e-5, rtol=1e-5)


@CAUSAL
def test_sparse_summaries_recomputed_for_backward_give_the_written_out_gradients(causal, monkeypatch):
    """The strided part made a block of queries at a time and again for backward (its weights not
    kept): the outputs and the gradients of q, k, v equal the pattern written out (need_weights),
    padding and blocks crossed; and gradcheck in float64."""
    import transformer.local_attention

    monkeypatch.setattr(transformer.local_attention.StridedSummaries, "BLOCK", 3)
    attention = LocalAttention(window=2, stride=3)
    q, k, v = (x.double().requires_grad_() for x in _qkv(n=17))
    mask = _key_mask(2, 17, lengths=(None, 10))
    real = mask[:, :, 0, :, None]
    blocked, _ = attention(q, k, v, mask, causal)
    dense, _ = attention(q, k, v, mask, causal, need_weights=True)
    # (the written-out pattern's softmax is taken in fp32: fp32's tolerance)
    torch.testing.assert_close(blocked * real, dense * real, atol=1e-6, rtol=1e-5)
    g = torch.randn_like(dense, dtype=torch.float64) * real
    for got, want in zip(
        torch.autograd.grad((blocked * g).sum(), (q, k, v)),
        torch.autograd.grad((dense * g).sum(), (q, k, v)),
        strict=True,
    ):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    small = [x[:1, :1, :8].detach().requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, None, causal)[0], small)
