"""What a translator reads of its model's attention: the cross-attention of a translation, the
encoder's self-attention, and the word alignments read from them (:meth:`AttentionReading.align`).

Mixed into :class:`translation.translator.Translator`; reads its ``model``, ``first_model``,
``device``, tokenizers, ids and ``src_prefix``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from data.lines import one_line
from decoding.alignment import DEFAULT_LAYER, check_layers, forced_attention
from decoding.budget import default_max_tokens
from translation.alignment import encoded_words, hard_alignment, output_words
from translation.results import Translation


class AttentionReading:
    """The attention methods of :class:`~translation.translator.Translator`."""

    model: Any
    first_model: Any
    device: torch.device
    src_tokenizer: Any
    tgt_tokenizer: Any
    src_prefix: str
    pad_id: int
    bos_id: int
    eos_id: int
    max_source_tokens: int

    @torch.no_grad()
    def cross_attention(self, source: list[int], output: list[int]) -> list[Tensor]:
        """Cross-attention of the decoder while it produced ``output`` for ``source``.

        Args:
            source: source ids without EOS (as from :meth:`encode_sources`).
            output: output ids without BOS and EOS (``Translation.tokens``).

        Returns:
            Per decoder layer, [heads, len(output) + 1, len(source) + 1] on the CPU: row ``t`` is
            the attention while predicting output token ``t`` (the last row: ``</s>``), column
            ``s`` is source token ``s`` (the last column: ``</s>``).
        """
        src = torch.tensor([source + [self.eos_id]], device=self.device)  # (1, S)
        tgt_in = torch.tensor([[self.bos_id] + output], device=self.device)  # (1, T)
        return [w[0].float().cpu() for w in self.first_model.cross_attention_weights(src, tgt_in)]

    def check_alignment_layer(self, layer: int) -> None:
        """Refuses a decoder layer (from 1; negative from the end) that the model, or a member of
        the ensemble, does not have: ValueError naming how many it has."""
        check_layers(self.model, [layer])

    def align(
        self,
        texts: Sequence[str],
        results: Sequence[Sequence[Translation]],
        layer: int = DEFAULT_LAYER,
        max_tokens: int | None = None,
    ) -> list[list[Translation]]:
        """The translations of ``results`` with their word alignments (``Translation.alignment``).

        Read from decoder layer ``layer``'s cross-attention, heads averaged, in one forced pass
        over the translations (``decoding/alignment.py``; an ensemble's members averaged), and
        turned into links between words (``translation/alignment.py``). The search is not run
        again, so the translations are the same.

        Args:
            texts: the ``n`` sentences that were translated, as given to :meth:`encode_sources`.
            results: their translations (:meth:`translate_ids`), any number per sentence.
            layer: the decoder layer, from 1 (negative: from the end; default the one that
                aligned best, BENCHMARKS.md, "Word alignment").
            max_tokens: budget per batch of translations * (source + output + 2) subwords;
                None: the device's.

        Raises:
            ValueError: ``texts`` and ``results`` of different lengths, or a layer the decoder
                (an ensemble member's) does not have.
        """
        if len(texts) != len(results):
            raise ValueError(f"{len(texts)} texts for {len(results)} lists of translations")
        self.check_alignment_layer(layer)
        sources, words = [], []
        for text in texts:
            start = len(self.src_prefix) if text.strip() else 0
            encoded = self.src_prefix + one_line(text) if text.strip() else text
            ids, line_words = encoded_words(self.src_tokenizer, encoded, start, self.max_source_tokens)
            sources.append(ids)
            words.append(line_words)
        pairs = [(sources[i], h.tokens) for i, hyps in enumerate(results) for h in hyps]
        budget = default_max_tokens(self.device) if max_tokens is None else max_tokens
        attention = iter(forced_attention(self.model, pairs, self.bos_id, self.eos_id, [layer], budget))
        skipped = frozenset({self.pad_id, self.bos_id, self.eos_id})
        aligned = []
        for line_words, hyps in zip(words, results, strict=True):
            found = []
            for hyp in hyps:
                rows = next(attention)[0, :-1]  # (T, S+1): predicting each output subword, EOS's row dropped
                links = hard_alignment(
                    rows, line_words, output_words(self.tgt_tokenizer, hyp.tokens, skipped)
                )
                found.append(replace(hyp, alignment=links))
            aligned.append(found)
        return aligned

    @torch.no_grad()
    def encoder_attention(self, source: list[int]) -> list[Tensor]:
        """The encoder's self-attention on ``source`` (ids without EOS), as its mechanism implies it.

        Returns:
            Per encoder layer, [heads, len(source) + 1, len(source) + 1] on the CPU (the last row
            and column: ``</s>``).
        """
        src = torch.tensor([source + [self.eos_id]], device=self.device)  # (1, S)
        return [w[0].float().cpu() for w in self.first_model.encoder_attention_weights(src)]
