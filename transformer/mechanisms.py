"""Which attention mechanism each role uses: the settings, what each mechanism supports, and building one.

The model has three attention roles: ``encoder_self`` (non-causal, source padding),
``decoder_self`` (causal, decoded step by step with a state) and ``cross`` (decoder queries over
the encoder output). :class:`AttentionConfig` names a mechanism for each, with the mechanisms'
settings; it is part of ``TransformerConfig`` and so of every checkpoint. A combination a
mechanism cannot do is refused here, when the config is read, naming the role, the mechanism
and why (:data:`REFUSED`); nothing falls back to softmax.

Every mechanism is an ``nn.Module`` with one call signature (see ``attention.SoftmaxAttention``)::

    out, weights = mechanism(q, k, v, mask, causal, state, need_weights)
    state = mechanism.new_state(max_steps)   # decoder self-attention only

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

from dataclasses import asdict, dataclass, fields
from typing import Any

from torch import nn

from transformer.attention import SoftmaxAttention
from transformer.feature_maps import EluFeatureMap, FavorFeatureMap
from transformer.linear_attention import LinearAttention
from transformer.linformer import LinformerAttention
from transformer.local_attention import LocalAttention
from transformer.lsh_attention import WINDOWS as LSH_WINDOWS
from transformer.lsh_attention import LSHAttention
from transformer.nystrom import NystromAttention

ROLES = ("encoder_self", "decoder_self", "cross")

# What a mechanism cannot do, per role, and why (issue 22's table). A role absent here is supported.
REFUSED: dict[str, dict[str, str]] = {
    "softmax": {},
    "linear": {},
    "performer": {},
    "local": {"cross": "a window of nearby positions means nothing between a target and its source"},
    "atrous": {"cross": "a dilated window of positions means nothing between a target and its source"},
    "sparse": {"cross": "its local + strided pattern is defined over one sequence's positions"},
    "nystrom": {
        "decoder_self": "not causal: its landmarks average over all positions, later ones too",
        "cross": "its landmarks are segments of one sequence, queries and keys alike",
    },
    "lsh": {"cross": "its buckets hash one sequence's shared queries and keys; a source has no queries"},
    "linformer": {"decoder_self": "not causal: each projected key mixes all positions, later ones too"},
}

# Mechanisms without attention weights to drop out: attention_dropout would be silently ignored.
NO_WEIGHTS = ("linear", "performer")


@dataclass
class AttentionConfig:
    """The mechanism of each attention role and the mechanisms' settings (``model.attention``).

    Settings belong to a mechanism, not a role: an encoder and a decoder that both use ``local``
    use the same window.
    """

    encoder_self: str = "softmax"  # encoder self-attention
    decoder_self: str = "softmax"  # decoder (causal) self-attention
    cross: str = "softmax"  # decoder-encoder attention
    window: int = 32  # local/atrous/sparse: positions a query sees on each side, itself included
    dilation: int = 2  # atrous: distance between the window's positions
    stride: int = 32  # sparse: every stride-th position is a summary that all (later) queries see
    features: int = 256  # performer: random features m
    redraw_interval: int = 1000  # performer: training forward passes between redraws; 0 never
    projected_length: int = 64  # linformer: k, the keys and values are projected to
    max_length: int = 1024  # linformer: the longest sequence its projections cover; longer is refused
    landmarks: int = 64  # nystrom: m, segments whose means stand for the queries and keys
    buckets: int = 8  # lsh: hash buckets b, 1 or even
    rounds: int = 2  # lsh: hash rounds, each with its own random rotations
    chunk_length: int = 64  # lsh: sorted positions a query sees back (and forward unless causal)
    lsh_window: str = "sliding"  # lsh: "sliding" (chunk_length each way) or "chunks" (Reformer's; encoder)

    def __post_init__(self) -> None:
        for role in ROLES:
            name = getattr(self, role)
            if name not in REFUSED:
                known = ", ".join(REFUSED)
                raise ValueError(f"attention.{role}: unknown mechanism {name!r}; known: {known}")
            why = REFUSED[name].get(role)
            if why:
                raise ValueError(f"attention.{role}={name} is not supported: {why}")
        for name in (
            "window",
            "dilation",
            "stride",
            "features",
            "projected_length",
            "max_length",
            "landmarks",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"attention.{name} must be at least 1, not {getattr(self, name)}")
        if self.buckets > 1 and self.buckets % 2:
            raise ValueError(f"attention.buckets must be 1 or even, not {self.buckets}")
        if self.lsh_window not in LSH_WINDOWS:
            known = ", ".join(LSH_WINDOWS)
            raise ValueError(f"attention.lsh_window is one of {known}, not {self.lsh_window!r}")
        if self.lsh_window == "chunks" and self.decoder_self == "lsh":
            raise ValueError(
                "attention.lsh_window=chunks is for encoder_self: causal, a query's chunk would depend "
                "on later tokens' buckets; decoder_self=lsh needs lsh_window=sliding"
            )
        if self.redraw_interval < 0:
            raise ValueError(f"attention.redraw_interval must be 0 (never) or more: {self.redraw_interval}")

    def check_dropout(self, attention_dropout: float) -> None:
        """Refuses attention dropout for a role whose mechanism has no weights to drop."""
        if attention_dropout > 0:
            for role in ROLES:
                if getattr(self, role) in NO_WEIGHTS:
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
        if isinstance(values, AttentionConfig):
            return values
        values = dict(values or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"attention: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return cls(**values)


def build_mechanism(role: str, cfg: AttentionConfig, d_head: int, dropout: float) -> nn.Module:
    """The mechanism ``cfg`` names for ``role``, for heads of width ``d_head``.

    ``dropout``: on the attention weights, for the mechanisms that have them.
    """
    name = getattr(cfg, role)
    if name == "softmax":
        return SoftmaxAttention(dropout)
    if name == "linear":
        return LinearAttention(EluFeatureMap())
    if name == "performer":
        return LinearAttention(FavorFeatureMap(d_head, cfg.features, cfg.redraw_interval))
    if name == "local":
        return LocalAttention(cfg.window, dropout=dropout)
    if name == "atrous":
        return LocalAttention(cfg.window, dilation=cfg.dilation, dropout=dropout)
    if name == "sparse":
        return LocalAttention(cfg.window, stride=cfg.stride, dropout=dropout)
    if name == "linformer":
        return LinformerAttention(cfg.projected_length, cfg.max_length, dropout=dropout)
    if name == "nystrom":
        return NystromAttention(cfg.landmarks, dropout=dropout)
    if name == "lsh":
        return LSHAttention(
            d_head, cfg.buckets, cfg.rounds, cfg.chunk_length, dropout=dropout, window=cfg.lsh_window
        )
    raise ValueError(f"attention.{role}: unknown mechanism {name!r}")  # AttentionConfig refuses it first
