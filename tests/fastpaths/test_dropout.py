"""The CPU's dropout masks: the rate, the expectation, the backward's mask, torch.compile."""

import pytest
import torch

from fastpaths import dropout as cpu_dropout

pytestmark = pytest.mark.cpu_dependent


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_keeps_the_rate_and_the_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(200_003)  # not a multiple of four: the last draw is cut
    y = cpu_dropout.Dropout(p).train()(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005
    # What is kept is scaled by the inverse of the (rounded) keep rate: the mean stays 1.
    assert torch.allclose(y[kept], torch.full_like(y[kept], 65536 / (65536 - round(p * 65536))))
    assert abs(y.mean().item() - 1.0) < 0.01


def test_dropout_lanes_are_independent_and_uniform():
    """Each of a draw's four 16-bit lanes drops at the same rate (no lane with a fixed bit)."""
    torch.manual_seed(1)
    keep, _ = cpu_dropout.keep_mask(torch.Size([4 * 50_000]), 0.5, torch.device("cpu"))
    rates = keep.view(-1, 4).float().mean(0)
    assert torch.all((rates - 0.5).abs() < 0.01), rates


def test_dropout_backward_uses_the_forward_mask_and_seed_reproduces_it():
    x = torch.randn(64, 33, requires_grad=True)
    layer = cpu_dropout.Dropout(0.2).train()
    torch.manual_seed(3)
    y = layer(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad != 0, y != 0)
    torch.manual_seed(3)
    assert torch.equal(layer(x), y)  # the global generator draws the bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_dropout_mask_in_the_dtype_is_the_bool_mask(dtype):
    """The mask made in a dtype keeps what the bool mask of the same draws keeps, and the layer
    gives, forward and backward, exactly x * bool mask * scale whatever mask it keeps."""
    shape = torch.Size([37, 3, 7])  # not a multiple of four elements
    torch.manual_seed(5)
    keep, scale = cpu_dropout.keep_mask(shape, 0.3, torch.device("cpu"))
    torch.manual_seed(5)
    mask, same_scale = cpu_dropout.keep_mask(shape, 0.3, torch.device("cpu"), dtype)
    assert mask.dtype == dtype and same_scale == scale
    assert torch.equal(mask, keep.to(dtype))
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    g = torch.randn(shape, dtype=dtype)
    torch.manual_seed(5)
    y = cpu_dropout.Dropout(0.3).train()(x)
    # What the backward pass keeps: the mask in bf16's own dtype, a bool (1 byte) beside fp32.
    (saved,) = y.grad_fn.saved_tensors
    assert saved.dtype == (dtype if dtype == torch.bfloat16 else torch.bool)
    y.backward(g)
    assert y.dtype == dtype
    assert torch.equal(y, x.detach().mul(keep).mul_(scale))
    assert torch.equal(x.grad, g.mul(keep).mul_(scale))


def test_dropout_is_nn_dropout_in_eval_and_in_bfloat16_keeps_its_dtype():
    x = torch.randn(8, 16)
    assert torch.equal(cpu_dropout.Dropout(0.1).eval()(x), x)
    y = cpu_dropout.Dropout(0.1).train()(x.bfloat16())
    assert y.dtype == torch.bfloat16


def test_dropout_leaves_torch_compile_one_graph():
    """Under torch.compile the masks are the compiled code's own: no graph break at each dropout
    (the in-place random_ of keep_mask breaks a graph), and the rate is still the rate."""
    layer = torch.nn.Sequential(torch.nn.Linear(16, 16), cpu_dropout.Dropout(0.25), torch.nn.ReLU())
    layer.train()
    explained = torch._dynamo.explain(layer)(torch.randn(4, 16))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(cpu_dropout.Dropout(0.25).train(), backend="aot_eager")(torch.ones(200_000))
    torch._dynamo.reset()
    assert abs(float((out == 0).float().mean()) - 0.25) < 0.01
    assert torch.allclose(out[out != 0], torch.tensor(1 / 0.75))
