"""Packed weights give F.linear's results, fresh after updates, never in autograd.

Every test here is ``cpu_dependent``: ``.ci/run`` runs them again on an emulated AVX2-only CPU,
where the bf16 branches meet the oneDNN that refuses bf16 weights, not a monkeypatch.
"""

import copy
import io
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decoding.search import beam_search, greedy_search
from fastpaths import hardware
from fastpaths import packed as packed_module
from fastpaths.cpu import for_cpu_inference
from fastpaths.packed import PackedLinear, PackedProjection, packing_available, padded_rows
from tests.transformer.helpers import BOS, EOS, random_tokens, tiny_model
from transformer.attention import InProjection

pytestmark = pytest.mark.cpu_dependent
needs_onednn = pytest.mark.skipif(not packing_available(), reason="this PyTorch build has no oneDNN")


def _weights(out_features=24, in_features=16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(out_features, in_features, generator=g), torch.randn(out_features, generator=g)


def _packed(weight, bias, relu=False, cls=nn.Linear):
    """A PackedLinear of these weights (the parameters are the tensors' copies)."""
    linear = cls(weight.size(1), weight.size(0))
    linear.weight, linear.bias = nn.Parameter(weight.clone()), nn.Parameter(bias.clone())
    packed_cls = PackedProjection if cls is InProjection else PackedLinear
    return packed_cls.from_linear(linear, relu=relu)


@needs_onednn
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", [(5, 16), (3, 7, 16)])
def test_packed_linear_equals_f_linear(relu, shape):
    weight, bias = _weights()
    x = torch.randn(*shape)
    packed = _packed(weight, bias, relu)
    with torch.no_grad():
        got = packed(x)
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
    relu, plain = _packed(weight, bias, relu=True), _packed(weight, bias)
    with torch.no_grad():
        got = relu(x)
        got_3d = plain(x.view(1, rows, 16))
    assert padded_rows(rows) > rows and relu._packs, "the padded packed path was not taken"
    assert got.shape == (rows, 24) and got.is_contiguous() and got_3d.shape == (1, rows, 24)
    torch.testing.assert_close(got, F.relu(F.linear(x, weight, bias)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_3d[0], F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@needs_onednn
def test_bounded_kernel_caches_stop_the_padding(monkeypatch):
    """With oneDNN's caches bounded (translate.py), rows are multiplied as they are, and give
    the padded path's results; settings already in the environment are kept."""
    for name in packed_module.KERNEL_CACHE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    packed_module.kernel_caches_bounded.cache_clear()
    weight, bias = _weights()
    x = torch.randn(13, 16)
    with torch.no_grad():
        padded = _packed(weight, bias)(x)
        assert not packed_module.kernel_caches_bounded()
        monkeypatch.setenv("LRU_CACHE_CAPACITY", "1024")  # a user's own, unbounded: kept, so padding stays
        assert not packed_module.bound_kernel_caches()
        assert (
            os.environ["LRU_CACHE_CAPACITY"] == "1024"
            and os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16"
        )
        monkeypatch.delenv("LRU_CACHE_CAPACITY")
        assert packed_module.bound_kernel_caches()
        pads, pad = [], F.pad
        monkeypatch.setattr(packed_module.F, "pad", lambda *a, **k: pads.append(a) or pad(*a, **k))
        unpadded = _packed(weight, bias)(x)
    packed_module.kernel_caches_bounded.cache_clear()  # monkeypatch restores the environment after this
    assert padded_rows(13) > 13 and not pads, "bounded caches should multiply the 13 rows as they are"
    torch.testing.assert_close(unpadded, padded, atol=0, rtol=0)


def _bf16_packed_equals_f_linear() -> list[PackedLinear]:
    """bf16 weights and inputs, and fp32 ones under bf16 autocast: packed gives F.linear's bf16
    results. Returns the packed layers used."""
    weight, bias = _weights()
    x = torch.randn(6, 16)
    bf16, fp32 = _packed(weight.bfloat16(), bias.bfloat16()), _packed(weight, bias)
    with torch.no_grad():
        expected = F.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16())
        got = bf16(x.bfloat16())
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = fp32(x)
            reference = F.linear(x, weight, bias)
        assert auto.dtype == reference.dtype == torch.bfloat16
        torch.testing.assert_close(auto, reference, atol=2e-2, rtol=2e-2)
        padded = bf16(torch.randn(13, 16).bfloat16())
        assert padded.shape == (13, 24) and padded.dtype == torch.bfloat16
    return [bf16, fp32]


@needs_onednn
@pytest.mark.skipif(not hardware.native_bf16(), reason="this CPU has no native bf16 (oneDNN's report)")
def test_packed_linear_in_bfloat16_and_under_autocast():
    bf16, fp32 = _bf16_packed_equals_f_linear()
    assert bf16._packs[None][0][-1] == fp32._packs[None][0][-1] == torch.bfloat16  # packed as bf16


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
    _bf16_packed_equals_f_linear()
    assert reordered and set(reordered) == {torch.float32}


@needs_onednn
def test_bf16_is_packed_in_what_this_cpu_computes():
    """No monkeypatch: this CPU's own report decides. bf16 is packed as bf16 where it is native,
    in fp32 elsewhere (on an AVX2-only CPU oneDNN itself refuses bf16 packing); F.linear's bf16
    results either way."""
    layers = _bf16_packed_equals_f_linear()
    expected = torch.bfloat16 if hardware.native_bf16() else torch.float32
    assert {key[-1] for layer in layers for key, _, _ in layer._packs.values()} == {expected}


@needs_onednn
def test_without_native_bf16_a_bf16_model_decodes_as_unpacked(monkeypatch):
    """translate.py --dtype bfloat16 on such a CPU: the packed bf16 model's greedy and beam outputs
    are those of the same model with F.linear (inputs and weights the same bf16 values; the
    attention the same swapped module, whose bf16 rounding differs from SDPA's)."""
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    torch.manual_seed(0)
    model = for_cpu_inference(tiny_model().to(torch.bfloat16).eval())
    src = random_tokens(3, 7, 37)

    def outputs():
        return greedy_search(model, src, BOS, EOS, 1.5, 5), beam_search(model, src, BOS, EOS, beam_size=3)

    with torch.no_grad():
        packed = outputs()
        assert model.output._packs
        monkeypatch.setattr(packed_module, "packing_available", lambda: False)  # F.linear
        plain = outputs()
    assert packed[0] == plain[0]
    assert [h[0].tokens for h in packed[1]] == [h[0].tokens for h in plain[1]]


@needs_onednn
def test_rows_of_a_projection_are_packed_on_their_own():
    """``InProjection.rows``: each block of rows packed by itself, the blocks together the whole."""
    weight, bias = _weights()
    x = torch.randn(4, 16)
    projection = _packed(weight, bias, cls=InProjection)
    with torch.no_grad():
        top, rest, whole = projection.rows(x, 0, 8), projection.rows(x, 8, 24), projection(x)
    assert set(projection._packs) == {(0, 8), (8, 24), None}
    torch.testing.assert_close(torch.cat([top, rest], -1), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("fused", [False, True])
def test_weights_changed_in_place_are_packed_again(fused):
    """An optimizer step (or load_state_dict) between two decodings must not leave stale packs;
    nor a fused Adam step, which writes the parameters without bumping their version counters."""
    torch.manual_seed(0)
    model = for_cpu_inference(tiny_model())
    plain = tiny_model()  # the same modules, unswapped: the reference
    src, tgt = random_tokens(2, 5, 37), random_tokens(2, 4, 41)
    with torch.no_grad():
        model(src, tgt)  # packs
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1, fused=fused)
    model(src, tgt).logsumexp(-1).mean().backward()
    opt.step()
    model.eval()
    plain.load_state_dict(model.state_dict())
    plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), plain(src, tgt), atol=1e-4, rtol=1e-4)
    model.load_state_dict(tiny_model().state_dict())
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), plain(src, tgt), atol=1e-4, rtol=1e-4)


def test_autograd_never_sees_packed_weights():
    """With autograd on, the packed model computes the same loss and the same gradients."""
    torch.manual_seed(0)
    plain = tiny_model().train()
    packed = for_cpu_inference(copy.deepcopy(plain))
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
    packed = for_cpu_inference(copy.deepcopy(plain))
    src = random_tokens(3, 7, 37)

    def outputs(model):
        beams = beam_search(model, src, BOS, EOS, beam_size=3, nbest=3)
        return greedy_search(model, src, BOS, EOS), [[h.tokens for h in n] for n in beams]

    assert outputs(packed) == outputs(plain)
    assert packed.output._packs and packed.decoder.layers[0].ffn.linear1._packs


@needs_onednn
def test_copies_and_pickles_start_without_packs():
    model = for_cpu_inference(tiny_model())
    with torch.no_grad():
        model(random_tokens(2, 5, 37), random_tokens(2, 4, 41))
    assert model.output._packs
    clone = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    src, tgt = random_tokens(1, 3, 37), random_tokens(1, 2, 41)
    with torch.no_grad():
        expected = model(src, tgt)
    for other in (clone, loaded):
        assert isinstance(other.output, PackedLinear) and not other.output._packs
        assert other.output.weight is other.tgt_embed.weight  # still tied
        with torch.no_grad():
            torch.testing.assert_close(other(src, tgt), expected)
        assert other.output._packs


def test_without_onednn_it_is_f_linear(monkeypatch):
    monkeypatch.setattr(packed_module, "packing_available", lambda: False)
    weight, bias = _weights()
    x = torch.randn(5, 16)
    packed = _packed(weight, bias, relu=True)
    with torch.no_grad():
        got = packed(x)
    torch.testing.assert_close(got, F.relu(F.linear(x, weight, bias)))
    assert not packed._packs
