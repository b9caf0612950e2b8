"""The training loss: its reference is F.cross_entropy over the logits (``training.loss``), and the
faster ones ``fastpaths.optimize`` gives a device equal it (the block loss: ``tests/fastpaths/
test_loss.py``; compiled on each device: ``tests/gpu/test_loss_devices.py``)."""

from __future__ import annotations

import pytest
import torch

from fastpaths.optimize import optimize
from tests.fastpaths.test_loss import PAD, _grads, _inputs
from training.loss import cross_entropy


@pytest.mark.parametrize("device", ["cpu", "cuda", "mps"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_devices_training_loss_equals_the_reference(device, bias) -> None:
    loss = optimize(torch.nn.Module(), device, "train").loss or cross_entropy
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
    fast = _grads(
        lambda h, w, bb, t, eps: loss(h, w, bb, t, PAD, eps), hidden, weight, b, target, upstream, 0.1
    )
    torch.testing.assert_close(fast[0], reference[0], rtol=1e-5, atol=1e-5)
    for a, e in zip(fast[1], reference[1], strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert bool((reference[0][target == PAD] == 0).all())


def test_the_plain_loss_ignores_the_positions_the_host_knows() -> None:
    hidden, weight, b, target, _ = _inputs(bias=True)
    positions = (target != PAD).flatten().nonzero().squeeze(1)
    torch.testing.assert_close(
        cross_entropy(hidden, weight, b, target, PAD, 0.1, positions=positions),
        cross_entropy(hidden, weight, b, target, PAD, 0.1),
    )
