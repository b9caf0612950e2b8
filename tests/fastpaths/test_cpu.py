"""The CPU's module swaps keep the plain model: its parameters, its outputs, its graph."""

import copy

import pytest
import torch
from torch import nn

from fastpaths.attention import CpuScaledDotProduct
from fastpaths.cpu import for_cpu_inference, for_cpu_training
from fastpaths.dropout import Dropout
from fastpaths.packed import PackedLinear, PackedProjection
from tests.transformer.helpers import random_tokens, tiny_model
from transformer.attention import ScaledDotProduct


def _kinds(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules()}


def test_the_swaps_keep_parameters_keys_and_ties():
    torch.manual_seed(0)
    plain = tiny_model(share_embeddings=True, src_vocab_size=41)
    swapped = for_cpu_training(copy.deepcopy(plain))
    assert list(swapped.state_dict()) == list(plain.state_dict())
    for (name, a), b in zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert swapped.output.weight is swapped.tgt_embed.weight is swapped.src_embed.weight
    assert swapped.num_parameters() == plain.num_parameters()
    kinds = _kinds(swapped)
    assert {PackedLinear, PackedProjection, CpuScaledDotProduct, Dropout} <= kinds
    assert not {nn.Linear, ScaledDotProduct, nn.Dropout, nn.ReLU} & kinds  # each swapped
    assert all(m.relu for m in swapped.modules() if isinstance(m, PackedLinear) and m.out_features == 64)


def test_the_swaps_are_made_once_and_leave_plain_modules_alone():
    model = for_cpu_inference(tiny_model())
    before = [(name, type(m)) for name, m in model.named_modules()]
    for_cpu_inference(model)
    assert [(name, type(m)) for name, m in model.named_modules()] == before
    assert nn.Dropout in _kinds(model)  # inference leaves dropout plain
    gelu = for_cpu_inference(tiny_model(activation="gelu"))
    ffn = gelu.encoder.layers[0].ffn
    assert isinstance(ffn.activation, nn.GELU) and not ffn.linear1.relu  # only ReLU is fused


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_training_swaps_compute_the_plain_models_training_step(activation):
    """Without dropout the swapped model's training loss and gradients are the plain one's."""
    torch.manual_seed(0)
    plain = tiny_model(activation=activation, dropout=0.0).train()
    swapped = for_cpu_training(copy.deepcopy(plain))
    src, tgt = random_tokens(3, 6, 37), random_tokens(3, 5, 41)
    grads = []
    for model in (plain, swapped):
        model(src, tgt).logsumexp(-1).mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_training_step_of_the_swapped_model_has_no_graph_break(dtype):
    """What training compiles on the CPU (the model's forward and backward, dropout on, under
    autocast in bf16) is one graph: no swapped module breaks it."""
    torch.manual_seed(0)
    model = for_cpu_training(tiny_model()).train()
    src, tgt = random_tokens(3, 6, 37), random_tokens(3, 5, 41)

    def step(src, tgt):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            return model(src, tgt, project=False).float().square().mean()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)(src, tgt)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
