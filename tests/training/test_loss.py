"""The training loss: its reference is F.cross_entropy over the logits, and what the trainer
computes (token_cross_entropy: the block loss, or compiled on a GPU the two-call form) equals it."""

from __future__ import annotations

import pytest
import torch

from tests.fastpaths.test_loss import PAD, _grads, _inputs
from training.loss import cross_entropy, token_cross_entropy


@pytest.mark.parametrize("bias", [False, True])
def test_the_block_loss_equals_the_reference(bias) -> None:
    hidden, weight, b, target, upstream = _inputs(bias=bias)
    reference = _grads(
        lambda h, w, bb, t, eps: cross_entropy(h, w, bb, t, PAD, eps),
        hidden,
        weight,
        b,
        target,
        upstream,
        0.1,
    )
    blocks = _grads(
        lambda h, w, bb, t, eps: token_cross_entropy(h, w, bb, t, PAD, eps, block_rows=4),
        hidden,
        weight,
        b,
        target,
        upstream,
        0.1,
    )
    torch.testing.assert_close(blocks[0], reference[0], rtol=1e-5, atol=1e-5)
    for a, e in zip(blocks[1], reference[1], strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert bool((reference[0][target == PAD] == 0).all())


def test_training_loss_compiled_by_inductor_equals_the_eager_block_loss_under_bf16(monkeypatch) -> None:
    """``token_cross_entropy``: compiled on a GPU it is the two-call form (inductor's fused kernels;
    here the CPU is taken for one), eager the block loss; the two agree, losses and gradients,
    under bf16 autocast."""
    import training.loss as loss_mod

    monkeypatch.setattr(loss_mod, "EAGER_LOSS_DEVICES", frozenset())

    hidden, weight, b, target, upstream = _inputs(bias=True)

    def loss(h, w, bias, t, eps):  # noqa: ANN001, ANN202
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return token_cross_entropy(h, w, bias, t, PAD, eps, block_rows=4)

    torch._dynamo.reset()
    compiled = _grads(torch.compile(loss), hidden, weight, b, target, upstream, 0.1)
    torch._dynamo.reset()
    eager = _grads(loss, hidden, weight, b, target, upstream, 0.1)
    torch.testing.assert_close(compiled[0], eager[0], rtol=2e-2, atol=2e-2)
    for a, e in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)
