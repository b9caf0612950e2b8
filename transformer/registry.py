"""The attention mechanisms' registry: each mechanism's module declares itself here.

At the bottom of its module, a mechanism registers its name, its settings (``model.attention``
keys, each with its default and its meaning), the roles it refuses and why, what it lacks (no
attention weights to drop out) and how it is built::

    register(Mechanism(
        "linear",
        build=lambda cfg, d_head, dropout: LinearAttention(EluFeatureMap()),
        has_weights=False,
    ))

``mechanisms.py`` collects the registrations into ``AttentionConfig`` and ``build_attention``;
no list of names is kept anywhere else. What differs between mechanisms at run time is a method
of ``attention.AttentionMechanism`` that the built module overrides (its source summary, its
decoding state), so ``MultiHeadAttention`` never asks which one it holds; a mechanism that needs
projections of its own (LSH, Linformer) registers the whole attention layer that makes them
(``layer``, a subclass of ``attention.MultiHeadAttention``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

ROLES = ("encoder_self", "decoder_self", "cross")


@dataclass(frozen=True)
class Setting:
    """A ``model.attention`` key that a mechanism reads.

    Attributes:
        name: the key (shared by the mechanisms that read it: one value for all of them).
        default: its value when the config does not give one (its type is the setting's).
        note: what it means, one line.
        minimum: the smallest value allowed (None: no bound).
    """

    name: str
    default: Any
    note: str
    minimum: int | None = None


@dataclass(frozen=True)
class Mechanism:
    """A registered attention mechanism.

    Attributes:
        name: what ``model.attention.<role>`` names it by.
        build: ``build(cfg, d_head, dropout) -> nn.Module``, the mechanism for heads of width
            ``d_head`` (``cfg``: the ``AttentionConfig``; ``dropout`` on the attention weights).
        settings: the ``model.attention`` keys it reads.
        refuses: role -> why it cannot do that role (refused when the config is read).
        has_weights: False where there are no attention weights for ``attention_dropout``.
        check: ``check(cfg)`` raising ValueError, naming the setting, for what ``minimum``
            cannot say (run for every config, as the settings' bounds are).
        layer: the attention layer that holds it, a subclass of ``attention.MultiHeadAttention``
            with its own projections; None: ``MultiHeadAttention`` itself.
    """

    name: str
    build: Callable[[Any, int, float], nn.Module]
    settings: tuple[Setting, ...] = ()
    refuses: Mapping[str, str] = field(default_factory=dict)
    has_weights: bool = True
    check: Callable[[Any], None] | None = None
    layer: type[nn.Module] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.refuses) - set(ROLES)
        if unknown:
            raise ValueError(f"mechanism {self.name}: refuses unknown role(s) {', '.join(sorted(unknown))}")


MECHANISMS: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    """Adds ``mechanism``; a name registered twice, or a setting declared two ways, is an error."""
    if mechanism.name in MECHANISMS:
        raise ValueError(f"attention mechanism {mechanism.name!r} is registered twice")
    known = {s.name: s for m in MECHANISMS.values() for s in m.settings}
    for setting in mechanism.settings:
        if setting.name in ROLES:
            raise ValueError(f"mechanism {mechanism.name}: a setting may not be named after a role")
        if setting.name in known and known[setting.name] != setting:
            raise ValueError(f"attention.{setting.name} is declared differently by two mechanisms")
    MECHANISMS[mechanism.name] = mechanism
    return mechanism


def settings() -> list[Setting]:
    """Every registered setting once, in the order of registration."""
    seen: dict[str, Setting] = {}
    for mechanism in MECHANISMS.values():
        for setting in mechanism.settings:
            seen.setdefault(setting.name, setting)
    return list(seen.values())
