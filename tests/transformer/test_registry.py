"""The mechanisms' registry: each module declares its mechanism, mechanisms.py only collects."""

import re
from pathlib import Path

import pytest
import torch
import yaml

from transformer import mechanisms
from transformer.mechanisms import REFUSED, AttentionConfig, build_mechanism
from transformer.registry import MECHANISMS, ROLES, Mechanism, Setting, register, settings

ROOT = Path(__file__).resolve().parents[2]


class Uniform(torch.nn.Module):
    """The mean of the values: a mechanism with no parameters, for the registry's tests."""

    def forward(self, q, k, v, mask=None, causal=False, state=None, need_weights=False):
        return v.mean(2, keepdim=True).expand_as(q), None


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
