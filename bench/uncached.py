"""The search without caches: the baseline that cached decoding is measured and tested against.

``Recomputing(model)`` is what the searches step (``decoding.state.Stepwise``: ``cfg``, ``start``,
``step``, ``logits``), as ``decoding.state.CachedDecoder`` is for the model with its caches, but
keeps only the token prefix between steps: every step runs the decoder, and projects the
cross-attention K/V, on the whole prefix again, and computes the last position only (all a search
step needs). The search code is the same for both, so any difference in outputs is the caches'.

Used by ``bench/decode_speed.py`` (cached vs uncached speed and FLOPs) and by the tests of
cache equivalence; it is not part of the product.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from decoding.state import SharedSource
from transformer import Transformer


class RecomputeState:
    """Stand-in for ``decoding.state.DecoderState``: the tokens fed so far and the encoder output.

    Attributes:
        memory: [n_src, src_len, d_model] encoder output of the live sources.
        src_mask: bool [n_src, 1, 1, src_len].
        prefix: [rows, steps] tokens fed so far (BOS first).
    """

    def __init__(self, memory: Tensor, src_mask: Tensor) -> None:
        self.memory, self.src_mask = memory, src_mask
        self.prefix: Tensor | None = None

    def select(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Keeps hypotheses ``rows`` (and sources ``sources``), as ``DecoderState.select`` does."""
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, rows)
        if sources is not None:
            self.memory = self.memory.index_select(0, sources)
            self.src_mask = self.src_mask.index_select(0, sources)


class Recomputing(nn.Module):
    """``model`` as the searches see it, decoding without caches (see the module docstring); a
    module, so that an ``Ensemble`` can hold it."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.cfg = model.cfg

    def start(self, src: Tensor, max_steps: int = 64) -> RecomputeState:
        """The state before the first step: the encoder output (nothing is pre-allocated)."""
        return RecomputeState(*self.model.encode(src))

    def step(self, tokens: Tensor, state: RecomputeState) -> Tensor:
        """tokens: [rows] -> the decoder output at them [rows, d_model], recomputed from the whole
        prefix (as ``CachedDecoder.step`` computes it from its caches)."""
        new = tokens[:, None]  # (rows, 1)
        state.prefix = new if state.prefix is None else torch.cat([state.prefix, new], dim=1)
        # Each sentence's hypotheses read one copy of its source, as the cached search's do.
        sources = [SharedSource.of(s) for s in self.model.sources(state.memory, state.src_mask)]
        return self.model.decode(state.prefix, sources, state.src_mask, last_only=True, project=False)[0][
            :, 0
        ]

    def logits(self, y: Tensor) -> Tensor:
        """The model's output projection: [..., d_model] -> [..., tgt_vocab]."""
        return self.model.logits(y)
