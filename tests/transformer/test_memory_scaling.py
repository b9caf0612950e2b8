"""Sub-quadratic in memory, measured: peak tensor storage of forward + backward grows at most 5x
when the length grows 4x (n = 2,048 -> 8,192), for every mechanism but softmax.

Linear memory gives 4x, quadratic 16x; the bound leaves room for the O(n log n) sort of LSH and
the constant terms, but not for an n²/32 tensor (which a bound on the largest tensor alone, as in
``test_long_sequences.py``, lets through). Storage is counted exactly, operator by operator
(``bench/storage_meter.py``), so the figure does not depend on the allocator or the machine.
"""

import pytest
import torch

from bench.storage_meter import StorageMeter
from transformer.attention import scaled_dot_product_attention
from transformer.mechanisms import REFUSED, AttentionConfig, build_mechanism

SETTINGS = dict(window=16, dilation=2, stride=32, features=32, projected_length=32, max_length=8192)
SETTINGS.update(landmarks=32, buckets=8, rounds=2, chunk_length=32)
CASES = [
    pytest.param(name, role, id=f"{name}-{role}")
    for name in REFUSED
    if name != "softmax"
    for role in ("encoder_self", "decoder_self")
    if role not in REFUSED[name]
]


def peak_bytes(attend, n: int, d: int = 8, heads: int = 2) -> int:
    """Peak bytes of tensor storage made by ``attend(q, k, v)`` and its backward, inputs [1, heads, n, d]."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, d, requires_grad=True) for _ in range(3))
    g = torch.randn(1, heads, n, d)
    with StorageMeter() as meter:
        out = attend(q, k, v)
        (out * g).sum().backward()
        del out
    return meter.peak_bytes


@pytest.mark.parametrize(("name", "role"), CASES)
def test_peak_memory_of_forward_and_backward_is_at_most_5x_at_4x_the_length(name, role):
    causal = role == "decoder_self"
    mechanism = build_mechanism(role, AttentionConfig(**{role: name}, **SETTINGS), 8, 0.0)
    mask = torch.ones(1, 1, 1, 8192, dtype=torch.bool)

    def attend(q, k, v):
        return mechanism(q, k, v, None if causal else mask[..., : q.size(2)], causal)[0]

    small, large = peak_bytes(attend, 2048), peak_bytes(attend, 8192)
    assert large <= 5 * small, (small, large, large / small)


def test_the_measure_sees_quadratic_memory():
    """Softmax written out (its n × n weights kept for backward): the same measure gives ~16x."""

    def attend(q, k, v):
        return scaled_dot_product_attention(q, k, v)[0]

    small, large = peak_bytes(attend, 1024), peak_bytes(attend, 4096)
    assert large > 12 * small, (small, large)
