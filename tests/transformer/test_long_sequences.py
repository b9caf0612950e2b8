"""Sub-quadratic by construction: no mechanism but softmax makes an n × n tensor, and long inputs run."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from decoding.state import CachedDecoder
from tests.transformer.helpers import random_tokens
from tests.transformer.test_mechanisms import MECHANISMS
from transformer import Transformer, TransformerConfig
from transformer.mechanisms import REFUSED, AttentionConfig, build_mechanism

REFUSED_CAUSAL = [name for name, refused in REFUSED.items() if "decoder_self" in refused]


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operator returns."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


SETTINGS = dict(window=16, dilation=2, stride=32, features=32, projected_length=32, max_length=2048)
SETTINGS.update(landmarks=32, buckets=8, rounds=2, chunk_length=32)


@pytest.mark.parametrize(
    "name", ["softmax", "linear", "performer", "local", "atrous", "sparse", "linformer", "nystrom", "lsh"]
)
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "causal"])
def test_no_mechanism_but_softmax_builds_an_n_by_n_tensor(name, causal):
    n, d = 2048, 8
    role = "decoder_self" if causal else "encoder_self"
    if causal and name in REFUSED_CAUSAL:
        pytest.skip(f"{name} is not causal")
    mechanism = build_mechanism(role, AttentionConfig(**{role: name}, **SETTINGS), d, 0.0)
    q, k, v = (torch.randn(1, 1, n, d, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 1, 1, n, dtype=torch.bool)
    with LargestTensor() as largest:
        # Softmax's weights written out: the n × n tensor the check must be able to see.
        out, _ = mechanism(q, k, v, None if causal else mask, causal, need_weights=name == "softmax")
        out.sum().backward()
    if name == "softmax":
        assert largest.numel >= n * n  # the check can see one
    else:
        assert largest.numel <= n * n // 8, largest.numel


@pytest.mark.parametrize("n", [4096, 16384])
@pytest.mark.parametrize("name", list(MECHANISMS))
def test_long_sequences_train_and_decode(name, n):
    """A tiny model on n-token sources and targets: a bf16 training step, and decoding steps."""
    # Settings for long inputs (a stride near √n, projections as long as n).
    # Softmax's cross-attention would be n²: linear where the mechanism does not do cross itself.
    attention = {"cross": "linear", **MECHANISMS[name], "window": 16, "stride": 128, "features": 32}
    attention.update(projected_length=32, max_length=n)
    cfg = TransformerConfig(
        src_vocab_size=37, tgt_vocab_size=41, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
        d_ff=32, max_positions=n + 1, attention=attention,
    )  # fmt: skip
    model = Transformer(cfg)
    src, tgt = random_tokens(1, n, 37), random_tokens(1, n, 41)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    logits.float().logsumexp(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        decoder = CachedDecoder(model)
        state = decoder.start(src, max_steps=n)
        for t in range(64):
            step = model.logits(decoder.step(tgt[:, t], state))
        full, _ = model.decode(tgt[:, :64], *model.encode(src))
    torch.testing.assert_close(step, full[:, -1], atol=1e-4, rtol=1e-4)
