"""LSH attention: shared-QK softmax with one bucket, the sorted-chunk pattern, fixed hashes."""

import pytest
import torch

from fastpaths.cpu import for_cpu_inference
from transformer.lsh_attention import SELF, LSHAttention, shared_qk_attention


def _qkv(b=2, h=2, n=13, d=8):
    return torch.randn(b, h, n, d), torch.randn(b, h, n, d), torch.randn(b, h, n, d)


def _key_mask(n, lengths=(13, 6)):
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]  # (B, 1, 1, n)


CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])


@CAUSAL
@pytest.mark.parametrize("chunk", [13, 20])
def test_one_bucket_one_round_and_chunks_covering_the_sequence_is_shared_qk_softmax(causal, chunk):
    torch.manual_seed(0)
    q, k, v = _qkv()
    mask = _key_mask(13)
    out, _ = LSHAttention(8, buckets=1, rounds=1, chunk=chunk)(q, k, v, mask, causal)
    expected = shared_qk_attention(q, v, mask, causal)
    real = mask[:, :, 0, :, None]  # padded queries' rows go unused
    torch.testing.assert_close(out * real, expected * real, atol=1e-5, rtol=1e-5)


def test_a_token_attends_to_itself_only_when_nothing_else_is_allowed():
    q, k, v = _qkv(b=1, h=1, n=5)
    _, weights = LSHAttention(8, buckets=1, rounds=1, chunk=8)(q, k, v, causal=True, need_weights=True)
    assert weights[0, 0, 0, 0] == 1  # the first position has only itself
    assert (weights[0, 0, 1:].diagonal(offset=1) < 1e-30).all()  # the others never see themselves


@CAUSAL
@pytest.mark.parametrize(
    ("buckets", "rounds", "chunk"), [(4, 1, 3), (4, 3, 2), (8, 2, 4), (2, 2, 1), (4, 2, 20)], ids=str
)
def test_sorted_chunks_compute_the_pattern_written_out(causal, buckets, rounds, chunk):
    """The chunked computation == the sets P_i written out as an n × n matrix (need_weights)."""
    torch.manual_seed(0)
    q, k, v = _qkv()
    mask = _key_mask(13)
    attention = LSHAttention(8, buckets, rounds, chunk)
    q.requires_grad_(True)
    v.requires_grad_(True)
    chunked, _ = attention(q, k, v, mask, causal)
    dense, weights = attention(q, k, v, mask, causal, need_weights=True)
    real = mask[:, :, 0, :, None]
    torch.testing.assert_close(chunked * real, dense * real, atol=1e-5, rtol=1e-5)
    # and the same gradients: the chunked masks and the rounds' counts are differentiated as written out
    g = torch.randn_like(dense) * real
    grads = [torch.autograd.grad((out * g).sum(), (q, v)) for out in (chunked, dense)]
    for got, expected in zip(*grads, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    weights = weights.detach()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 13))
    assert (weights[1, :, :6, 6:] == 0).all()  # padded keys contribute nothing
    if causal:
        assert (weights.triu(1) == 0).all()
    # A query sees keys of its own bucket in some round, at most chunk of them per round back.
    hashes = attention.hash(torch.nn.functional.normalize(q, dim=-1), mask[:, :, 0, :])
    shared = (hashes[..., :, None] == hashes[..., None, :]).any(2)  # (B, H, n, n)
    assert (weights[shared.logical_not()] == 0).all()


def test_causal_sets_are_the_last_chunk_positions_of_the_bucket():
    torch.manual_seed(0)
    q, k, v = _qkv(b=1, h=1, n=16)
    attention = LSHAttention(8, buckets=2, rounds=1, chunk=3)
    _, weights = attention(q, k, v, causal=True, need_weights=True)
    hashes = attention.hash(torch.nn.functional.normalize(q, dim=-1), None)[0, 0, 0]
    for i in range(16):
        before = [j for j in range(i) if hashes[j] == hashes[i]][-2:]  # itself and 2 before: chunk 3
        seen = weights[0, 0, i].nonzero().squeeze(1).tolist()
        assert seen == (before if before else [i])


def test_hashes_are_fixed_saved_with_the_model_and_odd_buckets_refused():
    a = LSHAttention(8, buckets=4, rounds=2, chunk=4)
    assert a.state_dict()["rotations"].shape == (8, 2, 2)
    b = LSHAttention(8, buckets=4, rounds=2, chunk=4)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 2, 9, 8)
    assert torch.equal(a.hash(x, None), b.hash(x, None))
    assert a.hash(x, None).max() < 4
    with pytest.raises(ValueError, match="even number of buckets"):
        LSHAttention(8, buckets=3, rounds=1, chunk=4)


@pytest.mark.parametrize(("buckets", "rounds", "chunk"), [(4, 1, 3), (4, 3, 2), (2, 2, 4)], ids=str)
def test_chunks_window_is_a_chunk_and_the_one_before_in_the_bucket(buckets, rounds, chunk):
    """window="chunks" (Reformer's pattern): chunked == written out, and a query sees exactly the
    keys of its bucket in its own chunk of sorted positions and the one before."""
    torch.manual_seed(0)
    q, k, v = _qkv()
    mask = _key_mask(13)
    attention = LSHAttention(8, buckets, rounds, chunk, window="chunks")
    chunked, _ = attention(q, k, v, mask)
    dense, weights = attention(q, k, v, mask, need_weights=True)
    real = mask[:, :, 0, :, None]
    torch.testing.assert_close(chunked * real, dense * real, atol=1e-5, rtol=1e-5)
    hashes = attention.hash(torch.nn.functional.normalize(q, dim=-1), mask[:, :, 0, :])  # (B, H, R, n)
    n = 13
    order = (hashes * n + torch.arange(n)).argsort(-1)
    chunk_of = order.argsort(-1) // chunk  # (B, H, R, n): the chunk of each position's sorted index
    same = hashes[..., :, None] == hashes[..., None, :]
    back = chunk_of[..., :, None] - chunk_of[..., None, :]
    allowed = (same & ((back == 0) | (back == 1))).any(2)  # (B, H, n, n), over the rounds
    eye = torch.eye(n, dtype=torch.bool)  # itself only when nothing else is allowed
    allowed = allowed & ~eye | (allowed.sum(-1, keepdim=True) == 1) & eye
    seen = weights > 1e-30
    rows = mask[:, 0, 0, :, None].expand(2, n, n)[:, None].expand_as(seen)  # real queries only
    assert torch.equal(seen[rows], allowed[rows])


def test_chunks_window_refuses_causal_attention_and_unknown_windows():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="chunks window is for the encoder"):
        LSHAttention(8, 2, 1, 4, window="chunks")(q, k, v, causal=True)
    with pytest.raises(ValueError, match="window is one of sliding, chunks"):
        LSHAttention(8, 2, 1, 4, window="rings")


@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "no-grad-packed"])
def test_the_layer_projects_no_keys_for_shared_qk(inference):
    """LSH's attention layer (``SharedQKAttention``) multiplies only the query and value rows of
    ``in_proj``; the output is the mechanism's on those projections, and the key rows get a zero
    gradient."""
    from transformer.lsh_attention import SharedQKAttention

    torch.manual_seed(0)
    layer = SharedQKAttention(16, 2, mechanism=LSHAttention(8, buckets=2, rounds=2, chunk=3))
    torch.nn.init.normal_(layer.in_proj.bias)
    x = torch.randn(2, 9, 16, requires_grad=not inference)
    w, b = layer.in_proj.weight, layer.in_proj.bias
    heads = lambda t: t.view(2, 9, 2, 8).transpose(1, 2)  # noqa: E731
    q, v = heads(x @ w[:16].T + b[:16]), heads(x @ w[32:].T + b[32:])
    expected = layer.out_proj(layer.mechanism(q, None, v)[0].transpose(1, 2).reshape(2, 9, 16))
    if inference:
        for_cpu_inference(layer)
        with torch.no_grad():
            torch.testing.assert_close(layer(x)[0], expected, atol=1e-5, rtol=1e-5)
        return
    out = layer(x)[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert (w.grad[16:32] == 0).all() and (w.grad[:16] != 0).any() and (w.grad[32:] != 0).any()


def _enumerated(attention: LSHAttention, q: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """LSH attention by direct enumeration, one query at a time: each round's sort by (bucket,
    position) in Python, the set P_i^(r) each query attends to by the module docstring's
    definition, and softmax over their union ∪_r P_i^(r) (equation (4) with N_ij, the rounds whose
    set holds j, is exactly that); i itself scored SELF. q, v: [B, H, n, d] -> [B, H, n, d]."""
    b, h, n, d = q.shape
    k = torch.nn.functional.normalize(q, dim=-1)
    hashes = attention.hash(k, None).tolist()  # [B][H][R][n]
    c = attention.chunk
    out = torch.zeros_like(v)
    for bi in range(b):
        for hi in range(h):
            sorted_index = []
            for r in range(attention.rounds):
                order = sorted(range(n), key=lambda j, r=r: (hashes[bi][hi][r][j], j))
                sorted_index.append({pos: idx for idx, pos in enumerate(order)})
            for i in range(n):
                union = set()
                for r, s in enumerate(sorted_index):
                    for j in range(n):
                        if hashes[bi][hi][r][j] != hashes[bi][hi][r][i]:
                            continue
                        if attention.window == "chunks":
                            inside = s[j] // c in (s[i] // c, s[i] // c - 1)
                        else:
                            gap = s[i] - s[j]
                            inside = 0 <= gap < c if causal else abs(gap) < c
                        if inside:
                            union.add(j)
                keys = sorted(union)
                scores = torch.stack(
                    [torch.tensor(SELF) if j == i else q[bi, hi, i] @ k[bi, hi, j] / d**0.5 for j in keys]
                )
                out[bi, hi, i] = scores.softmax(0) @ v[bi, hi, keys]
    return out


@pytest.mark.parametrize(
    ("window", "causal", "buckets", "rounds", "chunk"),
    [
        ("sliding", False, 4, 3, 2),
        ("sliding", True, 4, 3, 2),
        ("sliding", True, 2, 2, 3),
        ("sliding", False, 2, 4, 1),
        ("chunks", False, 4, 3, 2),
        ("chunks", False, 2, 2, 3),
    ],
    ids=str,
)
def test_rounds_combine_as_softmax_over_the_union_of_what_each_query_attends_to(
    window, causal, buckets, rounds, chunk
):
    """The duplicate correction N_ij counts the rounds whose window holds j (not those whose bucket
    does): the chunked computation, the written-out one and, causal, decoding step by step all
    equal a direct enumeration of each query's sets."""
    torch.manual_seed(3)
    q, _, v = _qkv(n=14)
    attention = LSHAttention(8, buckets, rounds, chunk, window=window)
    expected = _enumerated(attention, q, v, causal)
    chunked, _ = attention(q, q, v, causal=causal)
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=1e-5)
    dense, _ = attention(q, q, v, causal=causal, need_weights=True)
    torch.testing.assert_close(dense, expected, atol=1e-5, rtol=1e-5)
    if causal:
        state = attention.new_state(4)  # grows past its room
        steps = [
            attention(q[:, :, t : t + 1], None, v[:, :, t : t + 1], None, True, state)[0] for t in range(14)
        ]
        torch.testing.assert_close(torch.cat(steps, 2), expected, atol=1e-5, rtol=1e-5)


def test_decoding_reads_a_fixed_number_of_keys_and_never_copies_the_cache():
    """Each step's cost does not grow with the steps: the cache is written in place (its storage
    allocated once), and a step gathers R·c keys whatever the length."""
    torch.manual_seed(0)
    attention = LSHAttention(8, buckets=4, rounds=2, chunk=3)
    state = attention.new_state(40)
    q, _, v = _qkv(b=1, n=40)
    storages = set()
    for t in range(40):
        out, _ = attention(q[:, :, t : t + 1], None, v[:, :, t : t + 1], None, True, state)
        storages.add(state.kv.untyped_storage().data_ptr())
        assert torch.isfinite(out).all()
    assert len(storages) == 1 and state.length == 40
    assert state.ring.shape == (1, 2, 2, 5 * 3)  # per round, each bucket's (and padding's) last c


@CAUSAL
@pytest.mark.parametrize("window", ["sliding", "chunks"])
def test_a_chunk_longer_than_the_sequence_costs_what_the_sequence_does(causal, window):
    """With n <= c every query's set is its whole bucket, so chunks of 512 on 16 tokens compute
    what chunks of 16 do (outputs and gradients), in the same memory: no padding to 512 and no
    neighbouring chunks (they held ~48x the scores of a recipe batch's 16-piece sentences)."""
    from bench.storage_meter import StorageMeter

    if causal and window == "chunks":
        pytest.skip("the chunks window is for the encoder")
    torch.manual_seed(0)
    q, k, v = _qkv(b=6, h=4, n=16, d=16)
    mask = _key_mask(16, (16, 12, 9, 16, 3, 1))
    outputs, grads, peaks = {}, {}, {}
    for chunk in (512, 16):
        attention = LSHAttention(16, buckets=4, rounds=2, chunk=chunk, window=window)
        attention.rotations.copy_(torch.randn(16, 2, 2, generator=torch.Generator().manual_seed(1)))
        qg = q.clone().requires_grad_()
        with StorageMeter() as meter:
            out, _ = attention(qg, k, v, mask, causal)
            out.sum().backward()
        outputs[chunk], grads[chunk], peaks[chunk] = out, qg.grad, meter.peak_bytes
    torch.testing.assert_close(outputs[512], outputs[16], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[512], grads[16], atol=1e-6, rtol=1e-5)
    assert peaks[512] <= peaks[16] * 1.05, peaks
