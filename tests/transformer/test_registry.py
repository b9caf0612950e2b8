"""The mechanisms' registry: each module declares its mechanism, mechanisms.py only collects."""

import re
from pathlib import Path

import pytest
import torch
import yaml

from transformer import mechanisms
from transformer.attention import MultiHeadAttention
from transformer.linformer import LinformerSelfAttention
from transformer.lsh_attention import SharedQKAttention
from transformer.mechanisms import REFUSED, AttentionConfig, build_attention, build_mechanism
from transformer.registry import MECHANISMS, ROLES, Mechanism, Setting, register, settings

ROOT = Path(__file__).resolve().parents[2]


class Uniform(torch.nn.Module):
    """The mean of the values: a mechanism with no parameters, for the registry's tests. It records
    what the layer hands it."""

    summarises = False

    def __init__(self) -> None:
        super().__init__()
        self.calls = []

    def forward(self, q, k, v, mask=None, causal=False, state=None, need_weights=False):
        self.calls.append((q, k, v, mask, causal, state))
        return v.mean(2, keepdim=True).expand_as(q), None

    def attend_source(self, q, source, mask, need_weights):
        return self(q, *source.tensors, mask, False, None, need_weights)


@pytest.fixture
def uniform():
    """'uniform' registered for the test, refusing decoder self-attention, then removed."""
    mechanism = register(
        Mechanism(
            "uniform", build=lambda cfg, d_head, dropout: Uniform(), refuses={"decoder_self": "not causal"}
        )
    )
    yield mechanism
    del MECHANISMS["uniform"]


def test_a_registered_mechanism_is_configured_built_and_refused_with_no_other_edit(uniform):
    cfg = AttentionConfig(encoder_self="uniform", cross="uniform")
    assert type(build_mechanism("encoder_self", cfg, 8, 0.0)) is Uniform
    assert REFUSED["uniform"] == {"decoder_self": "not causal"}
    with pytest.raises(ValueError, match=r"attention\.decoder_self=uniform is not supported: not causal"):
        AttentionConfig(decoder_self="uniform")


def test_the_layer_projects_and_hands_the_mechanism_q_k_v_the_mask_and_the_state(uniform):
    """MultiHeadAttention owns W_Q, W_K, W_V and W_O; the mechanism gets the heads it projected."""
    cfg = AttentionConfig(encoder_self="uniform", cross="uniform")
    layer = build_attention("encoder_self", cfg, 16, 4, 0.0)
    assert type(layer) is MultiHeadAttention and not layer.causal
    x, mask = torch.randn(2, 5, 16), torch.ones(2, 1, 1, 5, dtype=torch.bool)
    out, _ = layer(x, mask=mask, state="state")
    ((q, k, v, given_mask, causal, state),) = layer.mechanism.calls
    expected = layer.in_proj(x).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
    for got, want in zip((q, k, v), expected, strict=True):
        torch.testing.assert_close(got, want)
    assert given_mask is mask and causal is False and state == "state"
    torch.testing.assert_close(
        out, layer.out_proj(v.mean(2, keepdim=True).expand_as(q).transpose(1, 2).reshape(2, 5, 16))
    )
    memory = torch.randn(2, 7, 16)
    layer(x, memory)  # cross-attention: the queries of x, the keys and values of the memory
    q, k, v, *_ = layer.mechanism.calls[-1]
    assert q.shape == (2, 4, 5, 4) and k.shape == v.shape == (2, 4, 7, 4)
    assert build_attention("decoder_self", AttentionConfig(), 16, 4, 0.0).causal


def test_mechanisms_with_their_own_projections_get_their_own_layers():
    assert (
        type(build_attention("encoder_self", AttentionConfig(encoder_self="lsh"), 16, 4, 0.0))
        is SharedQKAttention
    )
    linformer = AttentionConfig(encoder_self="linformer")
    assert type(build_attention("encoder_self", linformer, 16, 4, 0.0)) is LinformerSelfAttention
    assert MECHANISMS["softmax"].layer is None  # MultiHeadAttention itself


def test_registering_a_name_twice_or_a_setting_two_ways_is_refused(uniform):
    with pytest.raises(ValueError, match="registered twice"):
        register(Mechanism("uniform", build=lambda cfg, d_head, dropout: Uniform()))
    clash = Setting("window", 7, "another default for the same key")
    with pytest.raises(ValueError, match="attention.window is declared differently"):
        register(Mechanism("other", build=lambda cfg, d_head, dropout: Uniform(), settings=(clash,)))
    with pytest.raises(ValueError, match="unknown role"):
        Mechanism("odd", build=lambda cfg, d_head, dropout: Uniform(), refuses={"encoder": "?"})
    assert "other" not in MECHANISMS


def test_the_collector_names_no_mechanism():
    """mechanisms.py has no list or if-chain of names: none but the default appears in its code."""
    source = Path(mechanisms.__file__).read_text()
    code = re.sub(r'""".*?"""', "", source, flags=re.S)  # docstrings describe them; code may not
    code = "\n".join(line.split("#")[0] for line in code.splitlines())
    named = [name for name in MECHANISMS if name != "softmax" and re.search(rf"[\"']{name}[\"']", code)]
    assert named == []


def test_every_setting_is_in_the_config_block_with_its_default():
    """conf/model/base.yaml's attention block lists every role and registered setting, at its default."""
    block = yaml.safe_load((ROOT / "conf" / "model" / "base.yaml").read_text())["attention"]
    expected = {role: "softmax" for role in ROLES} | {s.name: s.default for s in settings()}
    assert block == expected
    assert AttentionConfig.from_dict(block) == AttentionConfig()
