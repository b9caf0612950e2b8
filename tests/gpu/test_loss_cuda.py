"""On CUDA the block loss takes its device's default blocks (few, large) and still equals
``F.linear`` then ``F.cross_entropy``, forward and backward, in fp32 and under bf16 autocast; compiled,
the training loss (the two-call form) equals it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import training.loss as loss_mod

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PAD = 0


def _run(fn, bf16: bool):  # noqa: ANN001, ANN202
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(6, 300, 64, device="cuda", generator=g, requires_grad=True)
    weight = (torch.randn(3_000, 64, device="cuda", generator=g) * 0.2).requires_grad_()
    target = torch.randint(1, 3_000, (6, 300), device="cuda", generator=g)
    target[:, 250:] = PAD
    upstream = torch.rand(6, 300, device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        losses = fn(hidden, weight, target)
    (losses * upstream).sum().backward()
    return losses.detach(), hidden.grad, weight.grad


def _reference(hidden, weight, target):  # noqa: ANN001, ANN202
    logits = F.linear(hidden, weight).float().flatten(0, 1)
    return F.cross_entropy(
        logits, target.flatten(), ignore_index=PAD, label_smoothing=0.1, reduction="none"
    ).view_as(target)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("cap", [None, 2**20])  # the default (one block here); 349-row blocks
def test_cuda_block_loss_equals_linear_then_cross_entropy(bf16: bool, cap: int | None, monkeypatch) -> None:
    if cap is not None:
        monkeypatch.setattr(loss_mod, "ACCELERATOR_BLOCK_ELEMENTS", cap)
        monkeypatch.setattr(loss_mod, "BLOCK_ROWS", 64)
    ours = _run(lambda h, w, t: loss_mod.projected_cross_entropy(h, w, None, t, PAD, 0.1), bf16)
    ref = _run(_reference, bf16)
    tol = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-4, "atol": 1e-5}
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("bf16", [False, True])
def test_cuda_compiled_training_loss_equals_the_eager_block_loss(bf16: bool) -> None:
    """Compiled by inductor, ``token_cross_entropy`` is the two-call form; eager, the block loss."""
    torch._dynamo.reset()
    fn = torch.compile(lambda h, w, t: loss_mod.token_cross_entropy(h, w, None, t, PAD, 0.1))
    compiled = _run(fn, bf16)
    eager = _run(lambda h, w, t: loss_mod.token_cross_entropy(h, w, None, t, PAD, 0.1), bf16)
    torch._dynamo.reset()
    tol = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-4, "atol": 1e-5}
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, **tol)
