"""In bf16, the fused attention (SDPA's flash and memory-efficient kernels on CUDA, its flash
kernel on the CPU) equals the written-out one within bf16 tolerance, forward and gradients. On
the CPU in CI, and on CUDA (marked ``gpu``) where a GPU is lent.

Both bf16 paths are measured against the written-out attention in fp32 on the same (bf16-valued)
inputs: the fused kernels must be as close to it as bf16 allows, i.e. within a small multiple of
the written-out bf16 path's own error (2x for the output, 4x for gradients), and within 2% of
the largest value of each other.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.attention import fused_attention, scaled_dot_product_attention

CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)),
        reason="needs a GPU with native bf16 (Ampere or newer): the fused bf16 kernels do not exist on "
        "T4, V100 or RTX 20xx",
    ),
]

B, H, D = 6, 8, 64
# (q_len, k_len, key padding mask, causal). The flash kernel takes no mask other than is_causal
# on equal lengths; the memory-efficient kernel takes every case.
CASES = {
    "encoder self": (37, 37, True, False),
    "decoder self": (29, 29, False, True),
    "decoder self, cached prefix": (5, 29, False, True),
    "cross": (29, 37, True, False),
    "cross, no mask": (29, 37, False, False),
}
FLASH_CASES = ["decoder self", "cross, no mask"]


def _inputs(
    tq: int, tk: int, masked: bool, seed: int, device: str
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, H, t, D, device=device, generator=g) for t in (tq, tk, tk))
    mask = None
    if masked:  # right padding: every row keeps at least 3 keys
        lengths = torch.randint(3, tk + 1, (B,), device=device, generator=g)
        lengths[0] = tk
        mask = (torch.arange(tk, device=device)[None, :] < lengths[:, None])[:, None, None, :]
    return [x.bfloat16() for x in (q, k, v)], mask


def _run(
    attention, qkv: list[torch.Tensor], dtype: torch.dtype, grad_out: torch.Tensor
) -> list[torch.Tensor]:
    """The output and the gradients of q, k, v, in fp32, for inputs cast to ``dtype``."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in qkv]
    out = attention(*leaves)
    out.backward(grad_out.to(dtype))
    return [out.detach().float()] + [x.grad.float() for x in leaves]


# The CPU has SDPA's flash kernel only, with every case; CUDA both, flash without masks.
PARAMS = [pytest.param("cpu", SDPBackend.FLASH_ATTENTION, case) for case in CASES]
PARAMS += [pytest.param("cuda", SDPBackend.EFFICIENT_ATTENTION, case, marks=CUDA) for case in CASES]
PARAMS += [pytest.param("cuda", SDPBackend.FLASH_ATTENTION, case, marks=CUDA) for case in FLASH_CASES]


@pytest.mark.parametrize(
    "device,backend,case", PARAMS, ids=lambda x: x.name.lower() if isinstance(x, SDPBackend) else x
)
def test_fused_attention_equals_written_out_in_bf16(device, backend, case):
    tq, tk, masked, causal = CASES[case]
    qkv, mask = _inputs(tq, tk, masked, seed=len(case), device=device)
    grad_out = torch.randn(B, H, tq, D, device=device, generator=torch.Generator(device).manual_seed(1))

    def written_out(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask, causal)[0]

    def fused(q, k, v):
        with sdpa_kernel([backend]):  # only this kernel: an error, not a silent fallback to math
            return fused_attention(q, k, v, mask, causal)

    reference = _run(written_out, qkv, torch.float32, grad_out)
    plain = _run(written_out, qkv, torch.bfloat16, grad_out)
    fast = _run(fused, qkv, torch.bfloat16, grad_out)
    for name, ref, p, f in zip(["out", "dq", "dk", "dv"], reference, plain, fast, strict=True):
        scale = ref.abs().max().item()
        plain_error = (p - ref).abs().max().item()
        fused_error = (f - ref).abs().max().item()
        factor = 2 if name == "out" else 4  # gradients round at more places, differently per kernel
        assert fused_error <= factor * plain_error + 1e-3 * scale, (name, fused_error, plain_error, scale)
        torch.testing.assert_close(f, p, atol=2e-2 * scale, rtol=2e-2, msg=name)
