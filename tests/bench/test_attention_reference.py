"""Our mechanisms give lucidrains' outputs where the mathematics is the same (issue 23, item 2).

Each test builds ours and theirs with ``bench/lucidrains.py``'s mapping of our settings
(the one that the benchmark times), gives both the same projections (theirs copied into ours;
a bias theirs lacks is zero in ours) and the same random features or projection matrices, and
asserts equal outputs at fp32 precision. Tiny shapes, one thread. The packages are in the ``dev``
extra, which CI installs, so these run there; skipped, with the package's name, where they are
not installed.

Where the mathematics differs, the test makes it the same and says how:

* performer: theirs adds 1e-4 to every random feature (``softmax_kernel(eps=1e-4)``; the causal
  path 1e-6 to every prefix sum), ours floors the normaliser at the smallest normal float: both
  set to 0 here. Their keys are divided by exp(their largest exponent over all positions), ours
  by exp(the largest over the sequence, or causal over the positions so far, chunk by chunk):
  constants that cancel in the ratio. The random features themselves are drawn by each (copied here).
* nystrom: the pseudo-inverse's starting point Aᵀ / (‖A‖₁‖A‖_∞) takes each head's own norms
  here, the largest over the whole batch and all heads there (so one sentence's output depends
  on its neighbours'): equal with one sentence of one head, or with our iteration in theirs.
  Lengths are multiples of the landmarks: theirs pads a sequence at its front otherwise, and the
  padding joins the first segment's mean.
* local: their ``window_size`` w' with ``exact_windowsize`` sees |i − j| ≤ w', ours |i − j| < w:
  w' = w − 1. Their blocks are then w − 1 wide, and a length that is not a multiple is padded at
  the end, where, without a mask, the padding is attended to: equal at multiples of w − 1, or at
  any length with a mask of real positions given to theirs.
* lsh: theirs hashes into n / bucket_size buckets (not a setting; the benchmark sets ours to
  it), drawing the random rotations afresh at every call, and a query sees its chunk of the
  sorted order and the chunk before it (fixed chunks: ours with ``lsh_window="chunks"``, which
  the benchmark uses non-causal; causal, ours slides over ``chunk`` sorted positions back).
  The same when every bucket is exactly one chunk: two buckets of n / 2 positions in every
  round, built here by choosing queries on known sides of the rotations, which are drawn from
  the same seed. Causal: not the position(s) that come first in their bucket in every round,
  whose only key is themselves: theirs then combines the rounds by exp(z_r − logsumexp(z)) with
  z_r ≈ −5e4, where fp32 keeps ~3 decimal places, so its weights sum to 1.0017 (ours: 1).
  Their full shared-QK attention (``FullQKAttention``, used up to ``bucket_size`` positions) is
  ours with one bucket, one round and a chunk covering the sequence.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from bench.lucidrains import PAIRS, our_layer, our_mechanism, reference_core, reference_layer
from transformer.attention import MultiHeadAttention
from transformer.mechanisms import AttentionConfig

ROOT = Path(__file__).resolve().parents[2]
D_MODEL, HEADS = 32, 2
D_HEAD = D_MODEL // HEADS


def needs(package: str, module: str):
    """The module of a reference package, or a skip naming it and the extra."""
    return pytest.importorskip(
        module, reason=f"{package} not installed (the dev extra: pip install -e '.[dev]')"
    )


def load_projections(ours: MultiHeadAttention, qkv: Tensor, qkv_bias: Tensor | None, out: nn.Linear) -> None:
    """Their Q, K, V projection ([3·d_model, d_model], rows q, k, v) and output projection into ours;
    a bias theirs lacks is 0."""
    with torch.no_grad():
        ours.in_proj.weight.copy_(qkv)
        ours.in_proj.bias.copy_(torch.zeros(3 * ours.d_model) if qkv_bias is None else qkv_bias)
        ours.out_proj.weight.copy_(out.weight)
        ours.out_proj.bias.copy_(torch.zeros(ours.d_model) if out.bias is None else out.bias)


def close(ours: Tensor, theirs: Tensor) -> None:
    torch.testing.assert_close(ours, theirs.view_as(ours), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ performer


@pytest.fixture
def no_epsilons(monkeypatch):
    """Their 1e-4 on every random feature and our floor on the normaliser, both 0 (see the docstring)."""
    pp = needs("performer-pytorch", "performer_pytorch.performer_pytorch")
    import transformer.linear_attention

    monkeypatch.setattr(pp, "softmax_kernel", functools.partial(pp.softmax_kernel, eps=0.0))
    monkeypatch.setattr(transformer.linear_attention, "EPS", 0.0)
    return functools.partial(pp.causal_linear_attention_noncuda, eps=0.0)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_core(no_epsilons, causal):
    cfg = AttentionConfig(features=24)  # not a multiple of d: a partial block of orthogonal rows
    ours = our_mechanism("performer", cfg, D_HEAD, causal, 40).eval()
    theirs = reference_core("performer", cfg, D_HEAD, causal)
    theirs.causal_linear_fn = no_epsilons
    ours.feature_map.omega.copy_(theirs.projection_matrix)
    q, k, v = (torch.randn(2, HEADS, 40, D_HEAD) for _ in range(3))
    close(ours(q, k, v, None, causal)[0], theirs(q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_performer_layer(no_epsilons, causal):
    cfg = AttentionConfig(features=32)
    ours = our_layer("performer", cfg, D_MODEL, HEADS, causal, 40).eval()
    theirs = reference_layer("performer", cfg, D_MODEL, HEADS, causal, 40).eval()
    theirs.fast_attention.causal_linear_fn = no_epsilons
    qkv = torch.cat([theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight])
    load_projections(
        ours, qkv, torch.cat([theirs.to_q.bias, theirs.to_k.bias, theirs.to_v.bias]), theirs.to_out
    )
    ours.mechanism.feature_map.omega.copy_(theirs.fast_attention.projection_matrix)
    x = torch.randn(2, 40, D_MODEL)
    close(ours(x)[0], theirs(x))


# ------------------------------------------------------------------------------------ linformer


@pytest.mark.parametrize(
    "length", [48, 64]
)  # shorter than max_length (their first columns, as ours) and equal
def test_linformer_layer(length):
    needs("linformer", "linformer")
    cfg = AttentionConfig(projected_length=8, max_length=64)
    ours = our_layer("linformer", cfg, D_MODEL, HEADS, False, length).eval()
    theirs = reference_layer("linformer", cfg, D_MODEL, HEADS, False, length).eval()
    load_projections(
        ours, torch.cat([theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight]), None, theirs.to_out
    )
    with torch.no_grad():  # E, F [k, max_length] = their proj_k, proj_v [seq_len, k] transposed
        ours.mechanism.e.copy_(theirs.proj_k.T)
        ours.mechanism.f.copy_(theirs.proj_v.T)
    x = torch.randn(2, length, D_MODEL)
    close(ours(x)[0], theirs(x))


# -------------------------------------------------------------------------------------- nystrom


def _nystrom_pair(heads: int):
    cfg = AttentionConfig(landmarks=8)
    ours = our_layer("nystrom", cfg, D_MODEL, heads, False, 32).eval()
    theirs = reference_layer("nystrom", cfg, D_MODEL, heads, False, 32).eval()
    load_projections(ours, theirs.to_qkv.weight, None, theirs.to_out[0])
    return ours, theirs


def test_nystrom_layer_one_head():
    needs("nystrom-attention", "nystrom_attention")
    ours, theirs = _nystrom_pair(heads=1)
    x = torch.randn(1, 32, D_MODEL)
    close(ours(x)[0], theirs(x))


def test_nystrom_layer_heads_and_batch_with_per_head_norms(monkeypatch):
    """Several heads and sentences: equal once theirs starts its pseudo-inverse from each head's own norms."""
    ns = needs("nystrom-attention", "nystrom_attention.nystrom_attention")
    from transformer.nystrom import iterative_pinv

    monkeypatch.setattr(ns, "moore_penrose_iter_pinv", lambda x, iters=6: iterative_pinv(x, iters))
    ours, theirs = _nystrom_pair(heads=HEADS)
    x = torch.randn(2, 32, D_MODEL)
    close(ours(x)[0], theirs(x))


# ---------------------------------------------------------------------------------------- local


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [28, 30])  # 4 blocks of their w - 1 = 7; 30: padded, with a mask
def test_local_core(causal, length):
    needs("local-attention", "local_attention")
    cfg = AttentionConfig(window=8)
    ours = our_mechanism("local", cfg, D_HEAD, causal, length)
    theirs = reference_core("local", cfg, D_HEAD, causal)
    q, k, v = (torch.randn(2, HEADS, length, D_HEAD) for _ in range(3))
    mask = None if length % 7 == 0 else torch.ones(2, length, dtype=torch.bool)
    close(ours(q, k, v, None, causal)[0], theirs(q, k, v, mask=mask))


@pytest.mark.parametrize("causal", [False, True])
def test_local_layer(causal):
    needs("local-attention", "local_attention")
    cfg = AttentionConfig(window=8)
    ours = our_layer("local", cfg, D_MODEL, HEADS, causal, 28).eval()
    theirs = reference_layer("local", cfg, D_MODEL, HEADS, causal, 28).eval()
    assert theirs.attn_fn.rel_pos is None  # no rotary embedding: ours has none
    load_projections(ours, theirs.to_qkv.weight, None, theirs.to_out)
    x = torch.randn(2, 28, D_MODEL)
    close(ours(x)[0], theirs(x))


# ------------------------------------------------------------------------------------------ lsh

SEED = 1234  # the seed their rotations are drawn from, at the start of their forward


def _rotations(rounds: int) -> Tensor:
    """The rotations theirs draws after ``torch.manual_seed(SEED)`` for 2 buckets: [d, rounds, 1]."""
    torch.manual_seed(SEED)
    return torch.randn(1, D_HEAD, rounds, 1)[0]


def _balanced_queries(rotations: Tensor, batch: int, n: int, generator: torch.Generator) -> Tensor:
    """Queries [batch, heads, n, d] with exactly n / 2 on each side of every round's rotation, at a
    margin: two buckets of n / 2 in every round, so that every bucket is exactly one chunk."""
    r = rotations[:, :, 0]  # (d, rounds)
    dual = torch.linalg.pinv(r)  # (rounds, d): dual @ r = I
    x = torch.randn(batch, HEADS, n, D_HEAD, generator=generator)
    x = x - (x @ r) @ dual  # no component along any rotation
    sides = torch.stack(
        [torch.randperm(n, generator=generator) < n // 2 for _ in range(batch * HEADS * r.size(1))]
    )
    sides = sides.view(batch, HEADS, r.size(1), n).float() * 2 - 1  # ±1: the bucket of each round
    margins = sides * (0.5 + torch.rand(batch, HEADS, r.size(1), n, generator=generator))
    return x + margins.transpose(-2, -1) @ dual


def _first_in_every_round(hashes: Tensor) -> Tensor:
    """[B, H, n] True where a position comes first in its bucket in every round (hashes [B, H, R, n])."""
    n = hashes.size(-1)
    same = hashes[..., :, None] == hashes[..., None, :]  # (B, H, R, n, n)
    earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)
    return ~(same & earlier).any(-1).any(2)


def _compare_lsh(ours_out: Tensor, theirs_out: Tensor, keep: Tensor) -> None:
    """Equal outputs at the positions ``keep`` (the leading dimensions of ``ours_out``), most of them."""
    assert keep.float().mean() > 0.7
    torch.testing.assert_close(ours_out[keep], theirs_out.view_as(ours_out)[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_core_with_buckets_of_one_chunk(causal):
    needs("reformer-pytorch", "reformer_pytorch")
    chunk, rounds = 8, 2
    cfg = AttentionConfig(buckets=2, rounds=rounds, chunk_length=chunk)
    ours = our_mechanism("lsh", cfg, D_HEAD, causal, 2 * chunk)
    theirs = reference_core("lsh", cfg, D_HEAD, causal)
    rotations = _rotations(rounds)
    ours.rotations.copy_(rotations)
    g = torch.Generator().manual_seed(0)
    q = _balanced_queries(rotations, 2, 2 * chunk, g)
    v = torch.randn(2, HEADS, 2 * chunk, D_HEAD, generator=g)
    hashes = ours.hash(q, None)
    assert (hashes == 1).sum(-1).eq(chunk).all()  # every bucket is one chunk
    # Their hash is ours: the same buckets (theirs offset by 2 per round) from the same rotations.
    torch.manual_seed(SEED)
    their_hashes = theirs.lsh.hash_vectors(2, q.flatten(0, 1)).view(2, HEADS, rounds, 2 * chunk)
    assert torch.equal(their_hashes - 2 * torch.arange(rounds)[:, None], hashes)
    torch.manual_seed(SEED)
    theirs_out = theirs(q, q, v)
    keep = ~_first_in_every_round(hashes) if causal else torch.ones(hashes[:, :, 0].shape, dtype=torch.bool)
    _compare_lsh(ours(q, q, v, None, causal)[0], theirs_out, keep)


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_layer_with_buckets_of_one_chunk(causal):
    needs("reformer-pytorch", "reformer_pytorch")
    chunk, rounds, n = 8, 2, 16
    cfg = AttentionConfig(buckets=2, rounds=rounds, chunk_length=chunk)
    ours = our_layer("lsh", cfg, D_MODEL, HEADS, causal, n).eval()
    theirs = reference_layer("lsh", cfg, D_MODEL, HEADS, causal, n).eval()
    load_projections(
        ours, torch.cat([theirs.toqk.weight, theirs.toqk.weight, theirs.tov.weight]), None, theirs.to_out
    )
    rotations = _rotations(rounds)
    ours.mechanism.rotations.copy_(rotations)
    q = _balanced_queries(rotations, 2, n, torch.Generator().manual_seed(1))  # the projected queries wanted
    q_flat = q.transpose(1, 2).reshape(2, n, D_MODEL)  # (B, n, H·d)
    x = torch.linalg.solve(theirs.toqk.weight.double(), q_flat.double().mT).mT.float()  # toqk(x) = q_flat
    torch.manual_seed(SEED)
    theirs_out = theirs(x)
    hashes = ours.mechanism.hash(q, None)
    keep = ~_first_in_every_round(hashes).any(1) if causal else torch.ones(2, n, dtype=torch.bool)  # (B, n)
    _compare_lsh(ours(x)[0], theirs_out, keep)


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_full_shared_qk_layer(causal):
    """Their full shared-QK attention: ours with one bucket, one round and one chunk over the sequence."""
    needs("reformer-pytorch", "reformer_pytorch")
    n = 12
    cfg = AttentionConfig(buckets=1, rounds=1, chunk_length=n)
    ours = our_layer("lsh", cfg, D_MODEL, HEADS, causal, n).eval()
    theirs = reference_layer("lsh", cfg, D_MODEL, HEADS, causal, n).eval()  # n <= bucket_size: full attention
    load_projections(
        ours, torch.cat([theirs.toqk.weight, theirs.toqk.weight, theirs.tov.weight]), None, theirs.to_out
    )
    x = torch.randn(2, n, D_MODEL)
    close(ours(x)[0], theirs(x))


# ---------------------------------------------------------------------------------- the script


@pytest.mark.slow  # the bench tier: the script end to end
def test_attention_reference_smoke(tmp_path):
    for pair in PAIRS:
        from bench.lucidrains import PACKAGES

        needs(*PACKAGES[pair])
    out, png = tmp_path / "reference.json", tmp_path / "reference.png"
    args = ["--lengths", "128", "--d-model", "32", "--heads", "2", "--timeout", "60", "--threads", "1"]
    args += ["--repeats", "1", "--json", str(out), "--plot", str(png)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    def run(*extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "attention_reference.py"), *args, *extra],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    stdout = run("--roles", "encoder", "--scopes", "layer")
    assert "## layer, encoder" in stdout
    results = json.loads(out.read_text())["results"]
    assert sorted((r["pair"], r["impl"]) for r in results) == sorted(
        (p, i) for p in PAIRS for i in ("ours", "theirs")
    )
    assert all(r["status"] == "ok" and r["seconds"] > 0 for r in results), results
    # Every pair that both ran was timed once more, in turn in one child: its ratio is kept with ours.
    for r in results:
        assert ("in_turn" in r) == (r["impl"] == "ours"), r
    in_turn = [r["in_turn"] for r in results if r["impl"] == "ours"]
    assert all(t["status"] == "ok" and t["speed"] > 0 and t["pairs"] >= 1 for t in in_turn), in_turn
    for pair in PAIRS:
        assert f"| {pair} " in stdout
    assert png.stat().st_size > 0
    # The causal core: the pairs both have (not linformer, nystrom); an impossible length is refused.
    stdout = run(
        "--roles", "decoder", "--scopes", "core", "--pairs", "local", "lsh", "nystrom", "--lengths", "96"
    )
    results = json.loads(out.read_text())["results"]
    assert sorted((r["pair"], r["impl"], r["status"]) for r in results) == [
        ("local", "ours", "ok"),
        ("local", "theirs", "ok"),
        ("lsh", "ours", "ok"),
        ("lsh", "theirs", "refused"),
    ]
    assert [r["pair"] for r in results if "in_turn" in r] == ["local"]  # not where theirs refused


def test_repeated_runs_are_reported_by_their_medians():
    """``--from-json ... --median``: one result per configuration, its median over the runs that
    ran it, with each run's time kept for the per-run ratios; one that never ran keeps its status."""
    from bench.attention_reference import _run_speeds, merge_runs

    def result(impl, seconds, status="ok", length=256):
        return dict(scope="layer", role="encoder", pair="lsh", impl=impl, length=length,
                    status=status, seconds=seconds, peak_mib=10.0 * seconds)  # fmt: skip

    runs = [
        [result("ours", 1.0), result("theirs", 2.0), result("ours", 0.0, "timeout", 512)],
        [result("ours", 3.0), result("theirs", 2.5), result("ours", 0.0, "timeout", 512)],
        [result("ours", 2.0), result("theirs", 0.0, "OOM")],
    ]
    merged = {(r["impl"], r["length"]): r for r in merge_runs(runs)}
    assert len(merged) == 3
    ours, theirs = merged["ours", 256], merged["theirs", 256]
    assert (ours["seconds"], ours["peak_mib"], ours["runs"]) == (2.0, 20.0, 3)
    assert (theirs["seconds"], theirs["runs"]) == (2.25, 2)
    assert merged["ours", 512]["status"] == "timeout"
    assert _run_speeds(ours, theirs) == "0.83-2.00 (2)"  # runs 0 and 1: 2/1 and 2.5/3


def test_the_in_turn_ratio_is_the_verdicts_speed_and_its_median_over_runs():
    """Where ours and theirs were timed in turn, that ratio is the speed (not the two children's
    times); repeated runs report its median and each run's."""
    from bench.attention_reference import _run_speeds, merge_runs, speed_ratio

    def result(impl, seconds, in_turn=None):
        r = dict(scope="layer", role="encoder", pair="nystrom", impl=impl, length=256,
                 status="ok", seconds=seconds, peak_mib=1.0)  # fmt: skip
        if in_turn is not None:
            r["in_turn"] = {"status": "ok", "speed": in_turn, "pairs": 3}
        return r

    assert speed_ratio(result("ours", 2.0), result("theirs", 1.0)) == 0.5
    assert speed_ratio(result("ours", 2.0, in_turn=1.1), result("theirs", 1.0)) == 1.1
    failed = {**result("ours", 2.0), "in_turn": {"status": "timeout"}}
    assert speed_ratio(failed, result("theirs", 1.0)) == 0.5
    runs = [[result("ours", 1.0, s), result("theirs", 1.0)] for s in (0.9, 1.2, 1.05)]
    merged = {r["impl"]: r for r in merge_runs(runs)}
    assert merged["ours"]["in_turn"]["speed"] == 1.05
    assert speed_ratio(merged["ours"], merged["theirs"]) == 1.05
    assert _run_speeds(merged["ours"], merged["theirs"]) == "0.90-1.20 (3)"


def test_the_tables_show_the_in_turn_times_and_their_medians_over_runs():
    """The ms columns are those of the calls timed in turn (the speed ratio's), not the separate
    children's (slowed by the exact memory measure); without an in-turn timing, the children's."""
    from bench.attention_reference import merge_runs, shown_seconds

    def result(impl, seconds, in_turn=None):
        r = dict(scope="layer", role="encoder", pair="local", impl=impl, length=256,
                 status="ok", seconds=seconds, peak_mib=1.0)  # fmt: skip
        if in_turn is not None:
            r["in_turn"] = {"status": "ok", "speed": in_turn[1] / in_turn[0], "pairs": 3,
                            "ours_seconds": in_turn[0], "theirs_seconds": in_turn[1]}  # fmt: skip
        return r

    assert shown_seconds(result("ours", 5.0, (1.0, 2.0)), result("theirs", 6.0)) == (1.0, 2.0)
    assert shown_seconds(result("ours", 5.0), result("theirs", 6.0)) == (5.0, 6.0)
    assert shown_seconds(result("ours", 5.0), {**result("theirs", 0.0), "status": "OOM"}) == (5.0, None)
    runs = [[result("ours", 9.0, t), result("theirs", 9.0)] for t in ((1.0, 2.0), (3.0, 2.5), (2.0, 7.0))]
    merged = {r["impl"]: r for r in merge_runs(runs)}
    assert shown_seconds(merged["ours"], merged["theirs"]) == (2.0, 2.5)


def test_a_child_gets_the_exact_memory_environment(tmp_path):
    """``run_config(..., env=EXACT_MEMORY_ENV)`` starts the child with glibc's settings that return
    freed memory at once; without it, the child has none of them (the in-turn child's allocator
    is the default one)."""
    from bench.attention_runs import EXACT_MEMORY_ENV, run_config

    script = tmp_path / "child.py"
    keys = sorted(EXACT_MEMORY_ENV)
    script.write_text(f"import json, os\nprint(json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))\n")
    spec = {"threads": 1, "timeout": 60}
    seen = run_config(spec, 0, script, EXACT_MEMORY_ENV)
    assert {k: seen[k] for k in keys} == EXACT_MEMORY_ENV
    if not any(k in os.environ for k in keys):
        assert all(run_config(spec, 0, script)[k] is None for k in keys)
