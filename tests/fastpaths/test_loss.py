"""The block loss (projected_cross_entropy) equals F.linear then F.cross_entropy, forward and
backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from data.batching import target_positions
from fastpaths.loss import projected_cross_entropy

PAD = 0


def _inputs(bias: bool, seed: int = 0, batch: int = 3, length: int = 7, d: int = 16, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, d, generator=g, requires_grad=True)
    weight = (torch.randn(vocab, d, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(vocab, generator=g) * 0.1).requires_grad_() if bias else None
    target = torch.randint(1, vocab, (batch, length), generator=g)
    target[0, 4:] = PAD  # right padding, as the batches have it
    target[2, 6:] = PAD
    upstream = torch.rand(batch, length, generator=g)  # a gradient that differs per position
    return hidden, weight, b, target, upstream


def _reference(hidden, weight, bias, target, eps):  # noqa: ANN001, ANN202
    logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(
        logits.float().flatten(0, 1),
        target.flatten(),
        ignore_index=PAD,
        label_smoothing=eps,
        reduction="none",
    ).view_as(target)


def _grads(fn, hidden, weight, bias, target, upstream, eps):  # noqa: ANN001, ANN202
    params = [hidden, weight] + ([bias] if bias is not None else [])
    for p in params:
        p.grad = None
    losses = fn(hidden, weight, bias, target, eps)
    (losses * upstream).sum().backward()
    return losses.detach(), [p.grad.clone() for p in params]


def _ours(block_rows: int):  # noqa: ANN202
    def fn(hidden, weight, bias, target, eps):  # noqa: ANN001, ANN202
        return projected_cross_entropy(hidden, weight, bias, target, PAD, eps, block_rows=block_rows)

    return fn


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("block_rows", [1, 4, 256])  # a block per row, ragged blocks, one block
def test_equals_linear_then_cross_entropy_fp32(bias: bool, eps: float, block_rows: int) -> None:
    hidden, weight, b, target, upstream = _inputs(bias)
    ref_loss, ref_grads = _grads(_reference, hidden, weight, b, target, upstream, eps)
    loss, grads = _grads(_ours(block_rows), hidden, weight, b, target, upstream, eps)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_the_hosts_target_positions_give_what_the_loss_finds_itself(autocast: bool) -> None:
    hidden, weight, b, target, upstream = _inputs(bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        want = _grads(_ours(4), hidden, weight, b, target, upstream, 0.1)

        def given(hidden, weight, bias, target, eps):  # noqa: ANN001, ANN202
            positions = target_positions(target)  # as the collate function makes them
            return projected_cross_entropy(hidden, weight, bias, target, PAD, eps, 4, positions)

        got = _grads(given, hidden, weight, b, target, upstream, 0.1)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_padding_has_zero_loss_and_no_gradient() -> None:
    hidden, weight, b, target, upstream = _inputs(bias=False)
    loss, (grad_hidden, _) = _grads(_ours(4), hidden, weight, b, target, upstream, 0.1)
    pad = target == PAD
    assert pad.any()
    assert (loss[pad] == 0).all() and (loss[~pad] > 0).all()
    assert (grad_hidden[pad] == 0).all() and (grad_hidden[~pad] != 0).any(dim=-1).all()


def test_bf16_autocast_matches_autocast_reference() -> None:
    """Under bf16 autocast the products run in bf16 as F.linear's would: same loss and gradients
    within bf16's rounding, and the gradients come back in the parameters' fp32."""
    hidden, weight, b, target, upstream = _inputs(bias=True, d=64, vocab=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, ref_grads = _grads(_reference, hidden, weight, b, target, upstream, 0.1)
        loss, grads = _grads(_ours(8), hidden, weight, b, target, upstream, 0.1)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=2e-2, atol=2e-2)
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-3)


def test_no_gradient_kept_without_autograd() -> None:
    """Validation's loss (no_grad) computes the same losses and keeps nothing for a backward pass."""
    hidden, weight, b, target, _ = _inputs(bias=False)
    with torch.no_grad():
        loss = projected_cross_entropy(hidden, weight, b, target, PAD, 0.1, block_rows=4)
        ref = _reference(hidden, weight, b, target, 0.1)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_fp32_mean_loss_gradients_made_early_equal_the_reference(bias: bool) -> None:
    """A mean over tokens (every row's loss the same gradient, as training's) takes the fp32 path
    whose gradients are made in the forward pass: the same gradients as the two-call form."""
    hidden, weight, b, target, _ = _inputs(bias)
    uniform = torch.full(target.shape, 1.0 / int((target != PAD).sum()))
    ref_loss, ref_grads = _grads(_reference, hidden, weight, b, target, uniform, 0.1)
    loss, grads = _grads(_ours(4), hidden, weight, b, target, uniform, 0.1)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_fp32_keeps_no_vocabulary_sized_gradient() -> None:
    """In fp32 nothing of [tokens, vocabulary] outlives the forward pass; in bf16 the gradient
    with respect to the logits does (bf16, tokens x vocabulary x 2 bytes)."""
    from bench.storage_meter import StorageMeter

    hidden, weight, b, target, _ = _inputs(bias=False, batch=8, length=32, d=8, vocab=2000)
    real = int((target != PAD).sum())
    kept = {}
    for dtype in (torch.float32, torch.bfloat16):
        with (
            StorageMeter() as meter,
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype != torch.float32),
        ):
            losses = projected_cross_entropy(hidden, weight, b, target, PAD, 0.1, block_rows=16)
            kept[dtype] = meter.live_bytes
        del losses
    assert kept[torch.float32] < real * 2000 * 2 / 4  # the gradients: rows x d and vocabulary x d
    assert kept[torch.bfloat16] >= real * 2000 * 2  # the bf16 gradient of the logits


def _logit_products(rows: int, vocab: int) -> int:
    """How many block products of logits one forward pass with the default block size makes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if func in (torch.ops.aten.mm.out, torch.ops.aten.addmm.out):
                Count.n += 1
            return func(*args, **(kwargs or {}))

    hidden = torch.zeros(1, rows, 4)
    target = torch.ones(1, rows, dtype=torch.long)
    with Count():
        projected_cross_entropy(hidden, torch.zeros(vocab, 4), None, target, PAD, 0.1)
    return Count.n


def test_default_blocks_are_small_on_the_cpu_and_few_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastpaths.loss as loss_mod

    assert _logit_products(2_000, 100) == -(-2_000 // loss_mod.BLOCK_ROWS)  # 4 blocks of 512 rows
    # Elsewhere (a GPU): blocks of up to 2^27 logits, 512 rows at least.
    rows = loss_mod.default_block_rows(torch.device("cuda"), 32_000)
    assert rows * 32_000 <= loss_mod.ACCELERATOR_BLOCK_ELEMENTS < (rows + 1) * 32_000
    assert 25_000 // rows < 25_000 // loss_mod.BLOCK_ROWS
    assert loss_mod.default_block_rows(torch.device("cuda"), 10**9) == loss_mod.BLOCK_ROWS
    # The loss asks for its device's default.
    asked = []
    monkeypatch.setattr(loss_mod, "default_block_rows", lambda device, vocab: asked.append(device) or 300)
    assert _logit_products(2_000, 100) == 7 and asked == [torch.device("cpu")]
