"""What a search keeps between decoding steps, and the model as a search steps it.

:class:`CachedDecoder` runs a ``Transformer`` step by step: the encoder once, cross-attention's
keys and values once per source (``Transformer.sources``), and one token per hypothesis a step,
each decoder layer's self-attention reading its state of the earlier steps (a
``kv_cache.KVCache`` for softmax, the mechanism's own state otherwise). :class:`DecoderState`
holds those states and the sources; :meth:`DecoderState.select` reorders them for beam search
and drops finished sentences.

Rows of the decoder ("hypotheses") are grouped by source sentence: rows ``i*g .. i*g+g-1``
belong to source ``i`` (``g`` = 1 for greedy search, the beam size for beam search, the samples
per sentence for sampling). The sources are stored once per sentence, never copied per
hypothesis: :class:`SharedSource` lets a sentence's ``g`` hypotheses read one copy, as ``g``
times as many queries of that sentence (cross-attention's queries are independent of each
other, so this is the same attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from decoding.kv_cache import KVCache
from transformer import Transformer, TransformerConfig
from transformer.attention import AttentionMechanism, DecodingState, Source


class SharedSource(Source):
    """A cross-attention :class:`~transformer.attention.Source` of ``n_src`` sentences, read by
    ``g`` consecutive hypotheses of each: their ``g`` rows of queries [n_src * g, heads, T, d]
    become ``g * T`` queries of their sentence [n_src, heads, g * T, d], so its keys and values
    (or summary) are never copied per hypothesis."""

    @classmethod
    def of(cls, source: Source) -> SharedSource:
        return cls(source.tensors, source.summarised)

    def attend(
        self, mechanism: AttentionMechanism, q: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """As ``Source.attend``, for q [n_src * g, heads, T, d_head] (mask [n_src, 1, 1, src_len])."""
        n_src = self.tensors[0].size(0)
        rows, heads, t, d = q.shape
        if rows % n_src:
            raise ValueError(f"{rows} decoder rows do not split evenly over {n_src} sources")
        g = rows // n_src
        if g > 1:  # (n*g, H, T, Dh) -> (n, H, g*T, Dh): hypotheses of one source become more queries
            q = q.view(n_src, g, heads, t, d).transpose(1, 2).reshape(n_src, heads, g * t, d)
        out, weights = super().attend(mechanism, q, mask, need_weights)
        if g > 1:
            out = out.view(n_src, heads, g, t, -1).transpose(1, 2).reshape(rows, heads, t, -1)
            if weights is not None:
                weights = weights.view(n_src, heads, g, t, -1).transpose(1, 2).reshape(rows, heads, t, -1)
        return out, weights

    def select(self, sources: Tensor) -> None:
        """Keeps sentences ``sources`` ([n] indices), in that order."""
        self.tensors = tuple(x.index_select(0, sources) for x in self.tensors)


def new_state(mechanism: AttentionMechanism, max_steps: int) -> DecodingState:
    """An empty self-attention state for at most ``max_steps`` steps: a K/V cache for a mechanism
    whose state is its keys and values (softmax's; room for ``KVCache.GROWTH`` steps at first,
    since most outputs end long before the limit), else the mechanism's own."""
    if mechanism.caches_keys_values:
        return KVCache(min(max_steps, KVCache.GROWTH))
    return mechanism.new_state(max_steps)


@dataclass
class DecoderState:
    """What incremental decoding keeps between steps.

    Attributes:
        states: per decoder layer, its self-attention's state of the steps so far, [rows, ...]
            (softmax: keys and values [rows, heads, steps, d_head], growing by a step a step).
        sources: per decoder layer, what its cross-attention reads of the sources, [n_src, ...].
        src_mask: bool [n_src, 1, 1, src_len], True at real source tokens.
        step: target tokens fed so far (the next token's position).
    """

    states: list[DecodingState]
    sources: list[SharedSource]
    src_mask: Tensor
    step: int = 0

    @property
    def n_src(self) -> int:
        return self.src_mask.size(0)

    def select(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Reorders/shrinks the states in place.

        Args:
            rows: [new_rows] indices of the hypotheses to keep, in their new order; each must
                stay with its source (beam search reorders within a sentence's beams).
            sources: [new_n_src] indices of the source sentences still active (finished
                sentences dropped), or None to keep all.
        """
        for state in self.states:
            state.select(rows)
        if sources is not None:
            for source in self.sources:
                source.select(sources)
            self.src_mask = self.src_mask.index_select(0, sources)


class Stepwise(Protocol):
    """What a search steps: :class:`CachedDecoder` (a model with its states), or anything that
    decodes the same way (``bench/uncached.py`` recomputes every step, the caches' baseline)."""

    cfg: TransformerConfig

    def start(self, src: Tensor, max_steps: int) -> object:
        """The state before the first step of sources ``src`` [n, src_len]; it has ``select``."""
        ...

    def step(self, tokens: Tensor, state: object) -> Tensor:
        """Feeds ``tokens`` [rows]: the decoder output at them, [rows, d_model]."""
        ...

    def logits(self, hidden: Tensor) -> Tensor:
        """[..., d_model] -> [..., tgt_vocab]."""
        ...


class CachedDecoder:
    """A ``Transformer`` as a search steps it, with its caches (module docstring)."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.cfg = model.cfg

    def start(self, src: Tensor, max_steps: int) -> DecoderState:
        """Encodes ``src`` [n, src_len] and makes empty self-attention states for at most
        ``max_steps`` steps and every layer's cross-attention source."""
        return self.begin(*self.model.encode(src), max_steps)

    def begin(self, memory: Tensor, src_mask: Tensor, max_steps: int) -> DecoderState:
        """:meth:`start` from an encoder output [n, src_len, d_model] and its mask [n, 1, 1, src_len]."""
        states = [new_state(layer.self_attn.mechanism, max_steps) for layer in self.model.decoder.layers]
        KVCache.share_spare(states)  # one spare storage for all layers' reorders, not one each
        sources = [SharedSource.of(s) for s in self.model.sources(memory, src_mask)]
        return DecoderState(states, sources, src_mask)

    def step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Feeds one token per hypothesis ([rows]; BOS at step 0): the decoder output [rows, d_model],
        for :meth:`logits` to project a few rows at a time ([rows, tgt_vocab] is a large tensor)."""
        y, _ = self.model.decode(
            tokens[:, None], state.sources, state.src_mask, state.states, state.step, project=False
        )  # (rows, 1, D)
        state.step += 1
        return y[:, -1]

    def logits(self, hidden: Tensor) -> Tensor:
        return self.model.logits(hidden)


def stepwise(models: Sequence[Transformer | Stepwise]) -> list[Stepwise]:
    """Each model as a search steps it: a ``Transformer`` with its caches, anything else as it is."""
    return [CachedDecoder(m) if isinstance(m, Transformer) else m for m in models]
