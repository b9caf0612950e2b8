"""The CPU seam computes what the plain calls compute.

Packed weights give F.linear's results, fresh after updates, never in autograd; the written-out
attention and its short-row softmax equal the paper's attention; block top-k equals topk.

Every test here is ``cpu_dependent``: ``.ci/run`` runs them again on an emulated AVX2-only CPU,
where the bf16 branches meet the oneDNN that refuses bf16 weights, not a monkeypatch.
"""

import copy
import io
import os

import pytest
import torch
import torch.nn.functional as F

from tests.transformer.helpers import BOS, EOS, random_tokens, tiny_model
from transformer import cpu_kernels, hardware
from transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer.cpu_kernels import PackedLinears, packing_available, padded_rows, row_topk
from transformer.search import beam_search, greedy_search

pytestmark = pytest.mark.cpu_dependent
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


def test_padded_rows_are_few_sizes_and_never_fewer_rows():
    sizes = [padded_rows(rows) for rows in range(1, 4097)]
    assert all(rows <= size <= max(rows, 1.5 * rows) for rows, size in enumerate(sizes, start=1))
    assert sizes[:8] == list(range(1, 9))
    # 8 small counts, then two sizes per octave: what bounds oneDNN's kernels per matrix.
    assert len(set(sizes)) == 8 + 2 * 9
    assert all(padded_rows(size) == size for size in set(sizes))


@needs_onednn
@pytest.mark.parametrize("rows", [9, 13, 17, 33, 100, 129])
def test_padded_packed_linear_equals_f_linear(rows):
    weight, bias = _weights()
    x = torch.randn(rows, 16)
    packed = PackedLinears(enabled=True)
    with torch.no_grad():
        got = packed.linear("w", x, weight, bias, relu=True)
        got_3d = packed.linear("w", x.view(1, rows, 16), weight, bias)
    assert padded_rows(rows) > rows and packed._packs, "the padded packed path was not taken"
    assert got.shape == (rows, 24) and got.is_contiguous() and got_3d.shape == (1, rows, 24)
    torch.testing.assert_close(got, F.relu(F.linear(x, weight, bias)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_3d[0], F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_bounded_kernel_caches_stop_the_padding(monkeypatch):
    """With oneDNN's caches bounded (translate.py), rows are multiplied as they are, and give
    the padded path's results; settings already in the environment are kept."""
    for name in cpu_kernels._CACHE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    cpu_kernels.kernel_caches_bounded.cache_clear()
    weight, bias = _weights()
    x = torch.randn(13, 16)
    with torch.no_grad():
        padded = PackedLinears(enabled=True).linear("w", x, weight, bias)
        assert not cpu_kernels.kernel_caches_bounded()
        monkeypatch.setenv("LRU_CACHE_CAPACITY", "1024")  # a user's own, unbounded: kept, so padding stays
        assert not cpu_kernels.bound_kernel_caches()
        assert (
            os.environ["LRU_CACHE_CAPACITY"] == "1024"
            and os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16"
        )
        monkeypatch.delenv("LRU_CACHE_CAPACITY")
        assert cpu_kernels.bound_kernel_caches()
        pads, pad = [], F.pad
        monkeypatch.setattr(cpu_kernels.F, "pad", lambda *a, **k: pads.append(a) or pad(*a, **k))
        unpadded = PackedLinears(enabled=True).linear("w", x, weight, bias)
    cpu_kernels.kernel_caches_bounded.cache_clear()  # monkeypatch restores the environment after this
    assert padded_rows(13) > 13 and not pads, "bounded caches should multiply the 13 rows as they are"
    torch.testing.assert_close(unpadded, padded, atol=0, rtol=0)


def _bf16_packed_equals_f_linear(packed: PackedLinears) -> None:
    """bf16 weights and inputs, and fp32 ones under bf16 autocast: packed gives F.linear's bf16 results."""
    weight, bias = _weights()
    x = torch.randn(6, 16)
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
        padded = packed.linear("w", torch.randn(13, 16).bfloat16(), weight.bfloat16(), bias.bfloat16())
        assert padded.shape == (13, 24) and padded.dtype == torch.bfloat16


@needs_onednn
@pytest.mark.skipif(not hardware.native_bf16(), reason="this CPU has no native bf16 (oneDNN's report)")
def test_packed_linear_in_bfloat16_and_under_autocast():
    packed = PackedLinears(enabled=True)
    _bf16_packed_equals_f_linear(packed)
    assert packed._packs["w"][0][-1] == torch.bfloat16  # packed as bf16


@needs_onednn
def test_without_native_bf16_bf16_is_packed_in_fp32(monkeypatch):
    """On a CPU without native bf16 (AVX2-only x86), oneDNN refuses to pack bf16 weights: they are
    packed in fp32 instead, with the same results in bf16, and bf16 is never handed to packing."""
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    reorder = torch.ops.mkldnn._reorder_linear_weight
    reordered: list[torch.dtype] = []

    def spy(weight, *args):
        reordered.append(weight.dtype)
        return reorder(weight, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", spy)
    packed = PackedLinears(enabled=True)
    _bf16_packed_equals_f_linear(packed)
    assert reordered and set(reordered) == {torch.float32}


@needs_onednn
def test_bf16_is_packed_in_what_this_cpu_computes():
    """No monkeypatch: this CPU's own report decides. bf16 is packed as bf16 where it is native,
    in fp32 elsewhere (on an AVX2-only CPU oneDNN itself refuses bf16 packing); F.linear's bf16
    results either way."""
    packed = PackedLinears(enabled=True)
    _bf16_packed_equals_f_linear(packed)
    expected = torch.bfloat16 if hardware.native_bf16() else torch.float32
    assert {key[-1] for key, _, _ in packed._packs.values()} == {expected}


@needs_onednn
def test_without_native_bf16_a_bf16_model_decodes_as_unpacked(monkeypatch):
    """translate.py --dtype bfloat16 on such a CPU: the packed bf16 model's greedy and beam outputs
    are those of the same model with F.linear (inputs and weights the same bf16 values)."""
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    torch.manual_seed(0)
    model = tiny_model().to(torch.bfloat16).eval()
    src = random_tokens(3, 7, 37)
    with torch.no_grad():
        plain = greedy_search(model, src, BOS, EOS, 1.5, 5), beam_search(model, src, BOS, EOS, beam_size=3)
        model.pack_for_inference()
        packed = greedy_search(model, src, BOS, EOS, 1.5, 5), beam_search(model, src, BOS, EOS, beam_size=3)
    assert packed[0] == plain[0]
    assert [h[0].tokens for h in packed[1]] == [h[0].tokens for h in plain[1]]


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
@pytest.mark.parametrize("fused", [False, True])
def test_weights_changed_in_place_are_packed_again(fused):
    """An optimizer step (or load_state_dict) between two decodings must not leave stale packs;
    nor a fused Adam step, which writes the parameters without bumping their version counters."""
    torch.manual_seed(0)
    model = tiny_model().pack_for_inference()
    src, tgt = random_tokens(2, 5, 37), random_tokens(2, 4, 41)
    with torch.no_grad():
        model(src, tgt)  # packs
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=fused)
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
    monkeypatch.setattr(cpu_kernels, "packing_available", lambda: False)
    weight, bias = _weights()
    x = torch.randn(5, 16)
    packed = PackedLinears(enabled=True)
    with torch.no_grad():
        got = packed.linear("w", x, weight, bias, relu=True)
    torch.testing.assert_close(got, F.relu(F.linear(x, weight, bias)))
    assert not packed._packs


@pytest.mark.parametrize("length", [1, 2, 7, 15, 16, 33])
def test_softmax_equals_torch_softmax(length):
    """The written-out softmax (short rows, autograd off) equals PyTorch's, masked keys included;
    with autograd on it is PyTorch's and has gradients."""
    scores = torch.randn(10, 4, 3, length) * 5
    scores[0, 0, 0, : length - 1] = float("-inf")  # one key left
    with torch.no_grad():
        torch.testing.assert_close(cpu_kernels.softmax(scores.clone()), scores.softmax(dim=-1))
    leaf = scores.clone().requires_grad_()
    cpu_kernels.softmax(leaf)[..., 0].sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


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
        assert cpu_kernels.prefers_written_out(q, tk)
        full = mask & torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq) if causal else mask
        got = cpu_kernels.attention(q, k, v, full)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


def test_multi_head_attention_takes_the_seam_only_where_it_pays():
    """fp32 with autograd on (training) and long queries use the fused kernel; decoding-sized
    queries with autograd off use the written-out one; both give the same outputs."""
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    assert not cpu_kernels.prefers_written_out(torch.randn(2, 4, 5, 4), 5)  # autograd on
    assert not cpu_kernels.prefers_written_out(torch.randn(2, 4, cpu_kernels.SMALL_QUERY + 1, 4), 17)
    # bf16 (training under autocast) is written out over short keys only: long ones go fused.
    q16 = torch.randn(1, 2, 64, 4, dtype=torch.bfloat16)
    assert cpu_kernels.prefers_written_out(q16, cpu_kernels.LONG_KEYS)
    assert not cpu_kernels.prefers_written_out(q16, cpu_kernels.LONG_KEYS + 1)
    with_weights, _ = mha.self_attention(x, causal=True, need_weights=True)
    with torch.no_grad():
        torch.testing.assert_close(mha.self_attention(x, causal=True)[0], with_weights, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------- 5. dropout masks


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_keeps_the_rate_and_the_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(200_003)  # not a multiple of four: the last draw is cut
    y = cpu_kernels.Dropout(p).train()(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005
    # What is kept is scaled by the inverse of the (rounded) keep rate: the mean stays 1.
    assert torch.allclose(y[kept], torch.full_like(y[kept], 65536 / (65536 - round(p * 65536))))
    assert abs(y.mean().item() - 1.0) < 0.01


def test_dropout_lanes_are_independent_and_uniform():
    """Each of a draw's four 16-bit lanes drops at the same rate (no lane with a fixed bit)."""
    torch.manual_seed(1)
    keep, _ = cpu_kernels.keep_mask(torch.Size([4 * 50_000]), 0.5, torch.device("cpu"))
    rates = keep.view(-1, 4).float().mean(0)
    assert torch.all((rates - 0.5).abs() < 0.01), rates


def test_dropout_backward_uses_the_forward_mask_and_seed_reproduces_it():
    x = torch.randn(64, 33, requires_grad=True)
    layer = cpu_kernels.Dropout(0.2).train()
    torch.manual_seed(3)
    y = layer(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad != 0, y != 0)
    torch.manual_seed(3)
    assert torch.equal(layer(x), y)  # the global generator draws the bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dropout_mask_in_the_dtype_is_the_bool_mask(dtype):
    """The mask made in a dtype keeps what the bool mask of the same draws keeps, and the layer
    gives, forward and backward, exactly x * bool mask * scale whatever mask it keeps."""
    shape = torch.Size([37, 3, 7])  # not a multiple of four elements
    torch.manual_seed(5)
    keep, scale = cpu_kernels.keep_mask(shape, 0.3, torch.device("cpu"))
    torch.manual_seed(5)
    mask, same_scale = cpu_kernels.keep_mask(shape, 0.3, torch.device("cpu"), dtype)
    assert mask.dtype == dtype and same_scale == scale
    assert torch.equal(mask, keep.to(dtype))
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    g = torch.randn(shape, dtype=dtype)
    torch.manual_seed(5)
    y = cpu_kernels.Dropout(0.3).train()(x)
    # What the backward pass keeps: the mask in bf16's own dtype, a bool (1 byte) beside fp32.
    (saved,) = y.grad_fn.saved_tensors
    assert saved.dtype == (dtype if dtype == torch.bfloat16 else torch.bool)
    y.backward(g)
    assert y.dtype == dtype
    assert torch.equal(y, x.detach().mul(keep).mul_(scale))
    assert torch.equal(x.grad, g.mul(keep).mul_(scale))


def test_dropout_is_nn_dropout_in_eval_and_in_bfloat16_keeps_its_dtype():
    x = torch.randn(8, 16)
    assert torch.equal(cpu_kernels.Dropout(0.1).eval()(x), x)
    y = cpu_kernels.Dropout(0.1).train()(x.bfloat16())
    assert y.dtype == torch.bfloat16


def test_dropout_leaves_torch_compile_one_graph():
    """Under torch.compile the masks are the compiled code's own: no graph break at each dropout
    (the in-place random_ of keep_mask breaks a graph), and the rate is still the rate."""
    layer = torch.nn.Sequential(torch.nn.Linear(16, 16), cpu_kernels.Dropout(0.25), torch.nn.ReLU())
    layer.train()
    explained = torch._dynamo.explain(layer)(torch.randn(4, 16))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(cpu_kernels.Dropout(0.25).train(), backend="aot_eager")(torch.ones(200_000))
    torch._dynamo.reset()
    assert abs(float((out == 0).float().mean()) - 0.25) < 0.01
    assert torch.allclose(out[out != 0], torch.tensor(1 / 0.75))
