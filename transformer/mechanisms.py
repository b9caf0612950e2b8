"""Which attention mechanism each role uses: the settings, what each mechanism supports, and building one.

The model has three attention roles: ``encoder_self`` (non-causal, source padding),
``decoder_self`` (causal, decoded step by step with a state) and ``cross`` (decoder queries over
the encoder output). :class:`AttentionConfig` names a mechanism for each, with the mechanisms'
settings; it is part of ``TransformerConfig`` and so of every checkpoint. A combination a
mechanism cannot do is refused here, when the config is read, naming the role, the mechanism
and why (:data:`REFUSED`); nothing falls back to softmax.

Nothing here names a mechanism: each module registers its own (``registry.register`` at its
bottom: name, settings, refused roles, how to build it), and this module collects them: the
fields of :class:`AttentionConfig` are the roles and the registered settings, and
:func:`build_mechanism` calls the registered builder. Adding a mechanism touches its module,
its ``conf/model/base.yaml`` block and its tests.

Every mechanism is an ``attention.AttentionMechanism``, with one call and state signature::

    out, weights = mechanism(q, k, v, mask, causal, state, need_weights)
    state = mechanism.new_state(max_steps)   # decoder self-attention only (softmax's: a K/V cache)
    state.select(rows)                       # beam search reorders it

called by the ``attention.MultiHeadAttention`` that holds it with its q, k, v, and a source
summary where it keeps one (``summarise``, ``attend_source``: linear attention, the Performer,
Linformer). LSH (shared query-key) and Linformer (the sequence projected before W_K, W_V) project
differently: they register a ``MultiHeadAttention`` subclass of their own, which
:func:`build_attention` builds.

| name      | module                | computes                                             |
|-----------|-----------------------|------------------------------------------------------|
| softmax   | ``attention.py``      | softmax(QKᵀ/√d)V, O(n²)                              |
| linear    | ``linear_attention.py`` + ``feature_maps.py`` | φ(Q)(φ(K)ᵀV), φ = elu+1, O(n·d²) |
| performer | the same, φ = FAVOR+  | positive orthogonal random features, O(n·m·d)        |
| local     | ``local_attention.py``| softmax over a window of w positions, O(n·w·d)       |
| atrous    | the same              | the window's positions ``dilation`` apart, O(n·w·d)  |
| sparse    | the same              | the window plus every ``stride``-th position, O(n·(w + n/stride)·d) |
| linformer | ``linformer.py``      | softmax(Q(EK)ᵀ/√d)(FV), keys/values projected n → k, O(n·k·d) |
| nystrom   | ``nystrom.py``        | softmax(QK̃ᵀ)·softmax(Q̃K̃ᵀ)⁺·softmax(Q̃Kᵀ)V, m landmarks, O(n·m·d + m³) |
| lsh       | ``lsh_attention.py``  | shared-QK softmax within hash buckets, on sorted chunks, O(r·n·c·d) |
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, field, fields, make_dataclass
from typing import Any

from torch import nn

# Each of these modules registers its mechanisms when imported (``registry.register``, at its bottom).
from transformer import attention, linear_attention, linformer, local_attention, lsh_attention, nystrom  # noqa: F401
from transformer.attention import MultiHeadAttention
from transformer.registry import MECHANISMS, ROLES, settings


class _Refused(Mapping):
    """mechanism name -> {role: why it cannot do it}, read from the registry as it stands."""

    def __getitem__(self, name: str) -> dict[str, str]:
        return dict(MECHANISMS[name].refuses)

    def __iter__(self) -> Iterator[str]:
        return iter(list(MECHANISMS))

    def __len__(self) -> int:
        return len(MECHANISMS)


# What a mechanism cannot do, per role, and why (issue 22's table), as registered. A role absent
# here is supported.
REFUSED: Mapping[str, dict[str, str]] = _Refused()


class _AttentionConfig:
    """The mechanism of each attention role and the mechanisms' settings (``model.attention``).

    Its fields are ``encoder_self``, ``decoder_self`` and ``cross`` (each a registered name,
    default softmax) and every registered setting with its default. Settings belong to a
    mechanism, not a role: an encoder and a decoder that both use ``local`` use the same window.
    """

    def __post_init__(self) -> None:
        for role in ROLES:
            name = getattr(self, role)
            if name not in MECHANISMS:
                known = ", ".join(MECHANISMS)
                raise ValueError(f"attention.{role}: unknown mechanism {name!r}; known: {known}")
            why = MECHANISMS[name].refuses.get(role)
            if why:
                raise ValueError(f"attention.{role}={name} is not supported: {why}")
        for setting in settings():
            value = getattr(self, setting.name)
            if setting.minimum is not None and int(value) < setting.minimum:
                raise ValueError(f"attention.{setting.name} must be at least {setting.minimum}, not {value}")
        for mechanism in MECHANISMS.values():
            if mechanism.check is not None:
                mechanism.check(self)

    def check_dropout(self, attention_dropout: float) -> None:
        """Refuses attention dropout for a role whose mechanism has no weights to drop."""
        if attention_dropout > 0:
            for role in ROLES:
                if not MECHANISMS[getattr(self, role)].has_weights:
                    raise ValueError(
                        f"attention.{role}={getattr(self, role)} has no attention weights for "
                        f"attention_dropout={attention_dropout}; set it to 0"
                    )

    @property
    def is_softmax(self) -> bool:
        return all(getattr(self, role) == "softmax" for role in ROLES)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Any) -> AttentionConfig:
        """From a mapping (a plain dict, or Hydra's DictConfig at the edge); unknown keys refused."""
        if isinstance(values, cls):
            return values
        values = dict(values or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"attention: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return cls(**values)


AttentionConfig = make_dataclass(
    "AttentionConfig",
    [(role, str, field(default="softmax")) for role in ROLES]
    + [(s.name, type(s.default), field(default=s.default)) for s in settings()],
    bases=(_AttentionConfig,),
)
AttentionConfig.__module__ = __name__
AttentionConfig.__doc__ = (
    _AttentionConfig.__doc__
    + "\n    Settings:\n"
    + "".join(f"        {s.name} ({s.default!r}): {s.note}\n" for s in settings())
)


def build_mechanism(role: str, cfg: AttentionConfig, d_head: int, dropout: float) -> nn.Module:
    """The mechanism ``cfg`` names for ``role``, for heads of width ``d_head``, by its registered builder.

    ``dropout``: on the attention weights, for the mechanisms that have them.
    """
    return MECHANISMS[getattr(cfg, role)].build(cfg, d_head, dropout)


def build_attention(role: str, cfg: AttentionConfig, d_model: int, n_heads: int, dropout: float) -> nn.Module:
    """The multi-head attention layer of ``role`` (``encoder_self``, ``decoder_self``, ``cross``):
    the layer its mechanism registered (``MultiHeadAttention`` unless it has its own), holding the
    mechanism ``cfg`` names, causal for ``decoder_self``. ``dropout``: on the attention weights."""
    mechanism = MECHANISMS[getattr(cfg, role)]
    layer = mechanism.layer or MultiHeadAttention
    built = mechanism.build(cfg, d_model // n_heads, dropout)
    return layer(d_model, n_heads, dropout, built, causal=role == "decoder_self")
