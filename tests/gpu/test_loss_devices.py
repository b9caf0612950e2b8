"""The block loss with its device's default blocks equals ``F.linear`` then ``F.cross_entropy``,
forward and backward, in fp32 and under bf16 autocast; the training loss ``fastpaths.optimize``
chooses for the device, compiled, equals it eagerly.

Each test runs on the CPU (in CI) and on CUDA (marked ``gpu``, where a GPU is lent): the code is
the same, so a change that breaks it fails on the CPU first.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastpaths.loss as block_loss
from fastpaths.optimize import optimize
from training.loss import cross_entropy

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
PAD = 0


def _run(fn, bf16: bool, device: str):  # noqa: ANN001, ANN202
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(6, 300, 64, device=device, generator=g, requires_grad=True)
    weight = (torch.randn(3_000, 64, device=device, generator=g) * 0.2).requires_grad_()
    target = torch.randint(1, 3_000, (6, 300), device=device, generator=g)
    target[:, 250:] = PAD
    upstream = torch.rand(6, 300, device=device, generator=g)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        losses = fn(hidden, weight, target)
    (losses * upstream).sum().backward()
    return losses.detach(), hidden.grad, weight.grad


def _reference(hidden, weight, target):  # noqa: ANN001, ANN202
    logits = F.linear(hidden, weight).float().flatten(0, 1)
    return F.cross_entropy(
        logits, target.flatten(), ignore_index=PAD, label_smoothing=0.1, reduction="none"
    ).view_as(target)


def test_accelerator_blocks_are_sized_by_their_elements() -> None:
    """A GPU's blocks hold up to ACCELERATOR_BLOCK_ELEMENTS logits (at least BLOCK_ROWS rows); the
    CPU's are BLOCK_ROWS rows (the rule, on any machine)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert block_loss.default_block_rows(cpu, 3_000) == block_loss.BLOCK_ROWS
    assert block_loss.default_block_rows(cuda, 3_000) == block_loss.ACCELERATOR_BLOCK_ELEMENTS // 3_000
    assert block_loss.default_block_rows(cuda, 10**9) == block_loss.BLOCK_ROWS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("cap", [None, 2**20])  # the default; on CUDA 349-row blocks, on the CPU 64 rows
def test_block_loss_equals_linear_then_cross_entropy(
    device: str, bf16: bool, cap: int | None, monkeypatch
) -> None:
    if cap is not None:
        monkeypatch.setattr(block_loss, "ACCELERATOR_BLOCK_ELEMENTS", cap)
        monkeypatch.setattr(block_loss, "BLOCK_ROWS", 64)
    ours = _run(lambda h, w, t: block_loss.projected_cross_entropy(h, w, None, t, PAD, 0.1), bf16, device)
    ref = _run(_reference, bf16, device)
    tol = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-4, "atol": 1e-5}
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16", [False, True])
def test_compiled_training_loss_equals_the_eager_block_loss(device: str, bf16: bool) -> None:
    """The device's losses from ``fastpaths.optimize``: compiled (the plain two-call loss on a GPU,
    inductor's; the block loss on the CPU, after the graph) and eager (the block loss)."""
    paths = optimize(torch.nn.Module(), device, "train")
    compiled_loss, eager_loss = paths.compiled_loss or cross_entropy, paths.loss or cross_entropy
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"  # inductor's C++ build is slow on the CPU
    fn = torch.compile(lambda h, w, t: compiled_loss(h, w, None, t, PAD, 0.1), backend=backend)
    compiled = _run(fn, bf16, device)
    eager = _run(lambda h, w, t: eager_loss(h, w, None, t, PAD, 0.1), bf16, device)
    torch._dynamo.reset()
    tol = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-4, "atol": 1e-5}
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, **tol)
