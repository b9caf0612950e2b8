"""Linear attention, Performer: the factored sums equal the kernel written out; FAVOR+ estimates softmax."""

import copy

import pytest
import torch

import transformer.linear_attention
from transformer.attention import scaled_dot_product_attention
from transformer.feature_maps import EluFeatureMap, FavorFeatureMap, orthogonal_gaussian
from transformer.linear_attention import ExclusivePrefixSum, LinearAttention, causal_linear, with_ones


def _qkv(b=2, h=2, tq=11, tk=11, d=8, scale=1.0):
    return (scale * torch.randn(b, h, tq, d), scale * torch.randn(b, h, tk, d), torch.randn(b, h, tk, d))


def _key_mask(b, tk, lengths=(None, 4)):
    lengths = torch.tensor([tk if n is None else n for n in lengths])[:b]
    return (torch.arange(tk)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Tk)


FEATURE_MAPS = pytest.mark.parametrize(
    "feature_map", [EluFeatureMap(), FavorFeatureMap(8, 32)], ids=["elu+1", "favor+"]
)


@FEATURE_MAPS
@pytest.mark.parametrize("causal", [False, True])
def test_factored_sums_equal_the_written_out_kernel_attention(feature_map, causal):
    """φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1) == (normalised φ(Q)φ(K)ᵀ) V, the n × n form, chunks crossed."""
    attention = LinearAttention(feature_map, chunk=4).eval()
    q, k, v = _qkv()
    mask = None if causal else _key_mask(2, 11)
    out, weights = attention(q, k, v, mask, causal, need_weights=True)
    torch.testing.assert_close(out, weights @ v, atol=1e-5, rtol=1e-4)
    if causal:
        assert (weights.triu(diagonal=1) == 0).all()
    else:
        assert (weights[1, :, :, 4:] == 0).all()  # padded keys have no weight


@FEATURE_MAPS
def test_padded_keys_contribute_nothing(feature_map):
    attention = LinearAttention(feature_map).eval()
    q, k, v = _qkv(b=1, tk=5)
    out, _ = attention(q, k, v)
    garbage_k, garbage_v = 50 * torch.randn(1, 2, 3, 8), 50 * torch.randn(1, 2, 3, 8)
    mask = _key_mask(1, 8, lengths=(5,))
    padded, _ = attention(q, torch.cat([k, garbage_k], 2), torch.cat([v, garbage_v], 2), mask)
    torch.testing.assert_close(padded, out, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_rnn_state_step_by_step_equals_the_prefix_sums(chunk):
    attention = LinearAttention(FavorFeatureMap(8, 16), chunk=chunk).eval()
    q, k, v = _qkv(tq=9, tk=9)
    full, _ = attention(q, k, v, causal=True)
    state = attention.new_state(9)
    steps = [
        attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, True, state)[0]
        for t in range(9)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, atol=1e-5, rtol=1e-4)
    assert state.s.shape == (2, 2, 16, 8) and state.z.shape == (2, 2, 16)  # constant size


def test_prefix_sums_continue_from_a_state():
    fq, fk, v1 = torch.rand(1, 1, 10, 4), torch.rand(1, 1, 10, 4), with_ones(torch.randn(1, 1, 10, 3))
    whole, sz = causal_linear(fq, fk, v1, None, chunk=3)
    first, sz1 = causal_linear(fq[:, :, :6], fk[:, :, :6], v1[:, :, :6], None, chunk=4)
    rest, sz2 = causal_linear(fq[:, :, 6:], fk[:, :, 6:], v1[:, :, 6:], sz1, chunk=4)
    torch.testing.assert_close(torch.cat([first, rest], 2), whole)
    torch.testing.assert_close(sz2, sz)


@pytest.mark.parametrize("length", [4, 10])  # one chunk (the triangle alone), and three
def test_prefix_sums_without_the_state_are_the_same_sums(length):
    fq, fk = torch.rand(2, 2, length, 6), torch.rand(2, 2, length, 6)
    v1 = with_ones(torch.randn(2, 2, length, 3))
    with_state, sz = causal_linear(fq, fk, v1, None, chunk=4)
    without, none = causal_linear(fq, fk, v1, None, chunk=4, need_state=False)
    torch.testing.assert_close(without, with_state)
    assert none is None
    scores = (fq @ fk.transpose(-2, -1)).tril()  # (B, H, T, T): φ(q_i)·φ(k_j), j ≤ i
    torch.testing.assert_close(with_state, scores @ v1)  # the definition, written out
    torch.testing.assert_close(sz, fk.transpose(-2, -1) @ v1)  # Σ_j φ(k_j)[v_j, 1]ᵀ


def test_causal_training_makes_no_state_for_a_short_sequence():
    """Training (no decoding state) on a sequence within one chunk holds no [B, H, m, d + 1] sum:
    with Performer's m = 256 it is 16x the sequence's own [T, m] features at T = 16."""
    from bench.storage_meter import StorageMeter

    attention = LinearAttention(FavorFeatureMap(64, 256), chunk=64).train()
    q, k, v = (torch.randn(8, 4, 16, 64, requires_grad=True) for _ in range(3))
    with StorageMeter() as meter:
        out, _ = attention(q, k, v, causal=True)
        out.sum().backward()
    state_bytes = 8 * 4 * 256 * 65 * 4  # 2.1 MB
    # The features, the triangle and the gradients: 3.5 MB; with the state and its zero prefix, 8.1.
    assert meter.peak_bytes < 2 * state_bytes, (meter.peak_bytes, state_bytes)


@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_exclusive_prefix_sums_and_their_gradient(chunks):
    x = torch.randn(2, 3, chunks, 4, 5, dtype=torch.float64, requires_grad=True)
    expected = x.cumsum(2) - x
    torch.testing.assert_close(ExclusivePrefixSum.apply(x), expected)
    assert torch.autograd.gradcheck(ExclusivePrefixSum.apply, (x,))


@pytest.mark.parametrize("is_query", [True, False])
def test_favor_features_and_their_gradient_equal_the_formula_written_out(is_query):
    """The fused φ(x) and its hand-written gradient == exp(ω·x/d^¼ - |x|²/(2√d) - c)/√m under autograd."""
    torch.manual_seed(0)
    feature_map = FavorFeatureMap(8, 20).double()
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True)
    xs = x * 8**-0.25
    u = xs @ feature_map.omega.T - 0.5 * (xs * xs).sum(-1, keepdim=True)
    if is_query:
        u = u - u.amax(-1, keepdim=True).detach()  # the stabiliser, held fixed by the gradient
    written = torch.exp(u) / 20**0.5
    fused = feature_map(x, is_query)
    torch.testing.assert_close(fused, written)
    g = torch.randn_like(written)
    torch.testing.assert_close(torch.autograd.grad(fused, x, g)[0], torch.autograd.grad(written, x, g)[0])
    if not is_query:  # no stabiliser: the gradient is φ's own, numerically
        assert torch.autograd.gradcheck(lambda x: feature_map(x, False), (x,))


@FEATURE_MAPS
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_of_linear_attention_are_exact(feature_map, causal, monkeypatch):
    """gradcheck in float64, chunks crossed. ε = 0 so that a query's stabiliser, which the gradient
    holds fixed, cancels exactly in the normalisation, as it does in the numerical derivative."""
    monkeypatch.setattr(transformer.linear_attention, "EPS", 0.0)
    attention = LinearAttention(copy.deepcopy(feature_map).double(), chunk=4).eval()
    q, k, v = (x.double().requires_grad_() for x in _qkv(b=1, tq=9, tk=9))
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, None, causal)[0], (q, k, v))


@pytest.mark.parametrize("tq, tk", [(11, 11), (9, 13)])
def test_blocked_performer_equals_the_factored_form_with_its_gradients(tq, tk, monkeypatch):
    """Non-causal FAVOR+ made a block of positions at a time (features made again for backward)
    == φ(Q)(φ(K)ᵀ[V, 1]) with whole feature matrices under autograd, padded keys and blocks crossed."""
    monkeypatch.setattr(transformer.linear_attention, "BLOCK_VALUES", 1)
    monkeypatch.setattr(transformer.linear_attention, "BLOCK_MIN_ROWS", 4)  # 3-4 blocks
    torch.manual_seed(0)
    attention = LinearAttention(FavorFeatureMap(8, 20)).eval()
    q, k, v = (x.double().requires_grad_() for x in _qkv(tq=tq, tk=tk))
    attention.double()
    mask = _key_mask(2, tk)
    fm = attention.feature_map
    fk = fm(k, is_query=False) * mask.transpose(-2, -1)
    num_den = fm(q, is_query=True) @ (fk.transpose(-2, -1) @ with_ones(v))
    factored = num_den[..., :-1] / (num_den[..., -1:] + transformer.linear_attention.EPS)
    blocked, _ = attention(q, k, v, mask)
    torch.testing.assert_close(blocked, factored)
    g = torch.randn_like(factored)
    grads = torch.autograd.grad(blocked, (q, k, v), g)
    for got, want in zip(grads, torch.autograd.grad(factored, (q, k, v), g), strict=True):
        torch.testing.assert_close(got, want)
    assert (grads[1][1, :, 4:] == 0).all() and (grads[2][1, :, 4:] == 0).all()  # padded keys


def test_blocked_performer_gradient_is_exact(monkeypatch):
    """gradcheck of the blocked path in float64, blocks crossed, padded keys (ε = 0, as above)."""
    monkeypatch.setattr(transformer.linear_attention, "EPS", 0.0)
    monkeypatch.setattr(transformer.linear_attention, "BLOCK_VALUES", 1)
    monkeypatch.setattr(transformer.linear_attention, "BLOCK_MIN_ROWS", 3)
    attention = LinearAttention(FavorFeatureMap(8, 12).double()).eval()
    q, k, v = (x.double().requires_grad_() for x in _qkv(b=2, tq=7, tk=8))
    mask = _key_mask(2, 8, lengths=(None, 5))
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, mask)[0], (q, k, v))


def test_performer_error_against_softmax_falls_as_features_grow():
    torch.manual_seed(0)
    q, k, v = _qkv(b=4, h=2, tq=16, tk=16, d=16, scale=0.5)
    exact, _ = scaled_dot_product_attention(q, k, v)
    errors = []
    for m in (16, 256, 4096):
        draws = [LinearAttention(FavorFeatureMap(16, m)).eval()(q, k, v)[0] for _ in range(3)]
        errors.append(sum((out - exact).abs().mean().item() for out in draws) / 3)
    assert errors[0] > 2 * errors[1] > 4 * errors[2], errors


def test_favor_features_estimate_the_softmax_kernel_without_bias():
    """The mean of φ(q)·φ(k) over fresh draws of ω converges to exp(q·k/√d) (Lemma 1)."""
    torch.manual_seed(0)
    d, draws = 8, 4000
    q, k = 0.4 * torch.randn(3, d), 0.4 * torch.randn(3, d)  # small: the estimate is light-tailed
    exact = torch.exp((q * k).sum(-1) / d**0.5)  # (3,)
    feature_map = FavorFeatureMap(d, d)
    estimates = []
    for _ in range(draws):
        feature_map.omega.copy_(orthogonal_gaussian(d, d))
        estimates.append((feature_map(q, is_query=False) * feature_map(k, is_query=False)).sum(-1))
    estimates = torch.stack(estimates)  # (draws, 3)
    standard_error = estimates.std(0) / draws**0.5
    assert ((estimates.mean(0) - exact).abs() < 4 * standard_error).all()
    assert (standard_error < 0.05 * exact).all()  # the test has the power to see a bias


def test_orthogonal_features_are_orthogonal_within_a_block():
    omega = orthogonal_gaussian(12, 8)
    block = omega[:8] / omega[:8].norm(dim=1, keepdim=True)
    torch.testing.assert_close(block @ block.T, torch.eye(8), atol=1e-5, rtol=0)


def test_features_are_redrawn_in_training_only_at_the_interval():
    attention = LinearAttention(FavorFeatureMap(8, 16, redraw_interval=3))
    q, k, v = _qkv()
    draws = []
    for _ in range(7):
        attention(q, k, v)
        draws.append(attention.feature_map.omega.clone())
    changed = [not torch.equal(a, b) for a, b in zip(draws, draws[1:], strict=False)]
    assert changed == [False, False, True, False, False, True]
    attention.eval()
    for _ in range(5):
        attention(q, k, v)
    assert torch.equal(attention.feature_map.omega, draws[-1])


# ------------------------------------------------------------------ Performer at large norms

NORMS = (4, 8, 16, 24, 32, 40)


def _on_sphere(norm: float, *shape: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(*shape, generator=generator)
    return norm * x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["whole", "causal"])
def test_performer_never_collapses_at_large_query_and_key_norms(causal, dtype):
    """d = 64, 256 features, 256 tokens x 4 heads, query and key norms 4 to 40: the output stays a
    weighted average of the values, finite and 0.25-4x the size of exact softmax attention's, and
    its gradients finite and nonzero; at norm 4 its relative error is no worse than 0.42.

    (Random features cannot match a near one-hot softmax at such norms: the estimate may degrade,
    it must not vanish. Before the keys were stabilised, the size fell to 0.000x at norm 32.)"""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    attention = LinearAttention(FavorFeatureMap(64, 256)).eval()
    directions_q, directions_k = (
        _on_sphere(1, 1, 4, 256, 64, generator=g),
        _on_sphere(1, 1, 4, 256, 64, generator=g),
    )
    v = torch.randn(1, 4, 256, 64, generator=g)
    for norm in NORMS:
        q, k, v_ = (x.to(dtype).requires_grad_() for x in (norm * directions_q, norm * directions_k, v))
        out, _ = attention(q, k, v_, causal=causal)
        exact, _ = scaled_dot_product_attention(
            q.detach().float(), k.detach().float(), v_.detach().float(), causal=causal
        )
        assert out.dtype == dtype and torch.isfinite(out).all(), norm
        size = (out.float().norm() / exact.norm()).item()
        assert 0.25 <= size <= 4, (norm, size)
        if norm == 4:
            error = ((out.float() - exact).norm() / exact.norm()).item()
            assert error <= 0.42, error
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v_))
        for grad in grads:
            assert torch.isfinite(grad).all() and grad.float().norm() > 0, norm


@pytest.mark.parametrize("norm", [4, 40])
def test_performer_decoding_state_rescaled_as_keys_grow_equals_the_prefix_sums(norm):
    """Step by step, the state's stabiliser rises as larger keys arrive and the state is rescaled:
    the same outputs as the causal prefix sums over chunks (a stabiliser per chunk)."""
    g = torch.Generator().manual_seed(1)
    attention = LinearAttention(FavorFeatureMap(16, 32), chunk=4).eval()
    scale = torch.linspace(0.2, 1.0, 11)[:, None]  # later keys larger: the running maximum grows
    q, k = _on_sphere(norm, 2, 2, 11, 16, generator=g), _on_sphere(norm, 2, 2, 11, 16, generator=g) * scale
    v = torch.randn(2, 2, 11, 16, generator=g)
    full, _ = attention(q, k, v, causal=True)
    state = attention.new_state(11)
    steps = []
    for t in range(11):
        steps.append(
            attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], None, True, state)[0]
        )
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat(steps, dim=2), full, atol=1e-5, rtol=1e-4)
