"""Subword regularisation: training batches encoded afresh with SentencePiece's sampling.

Kudo (2018), "Subword Regularization": each time a sentence is trained on, its segmentation is
drawn from the unigram model, P(segmentation) proportional to P_unigram(segmentation) ** alpha,
over all segmentations (``nbest_size = -1``) or the ``nbest_size`` best; with a BPE model,
``alpha`` is BPE-dropout's probability of dropping a merge (Provilkov et al., 2020). It is
SentencePiece's own ``encode(enable_sampling=True, alpha=..., nbest_size=...)``.

Only the training split is sampled; validation, test and translate.py encode deterministically.
The tokenized cache (:mod:`data.tokenized`) is still what the batches are planned from: its
lengths sort and cut the batches (so an epoch's batch count stays fixed, as Lightning needs), and
the sampled segmentation of each batch's raw text is what the batch holds. A sampled segmentation
is mostly longer than the best one, so a batch can exceed ``max_tokens`` by that much; a sentence
whose sample would exceed ``max_len`` keeps its deterministic segmentation, within it.

Each batch's draw is seeded by the data seed, its epoch and its examples, and SentencePiece encodes
it on one thread (its threads would share out the draws in whatever order they run): the same
batch is segmented the same way wherever and however often it is fetched, so a resumed run trains
on what the run never stopped would have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from data.tokenized_pairs import PairColumns, TokenizedPairs
from data.tokenizer import EOS_ID, SubwordTokenizer

if TYPE_CHECKING:
    import datasets


def _flat(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Lists of ids as (concatenated values, lengths)."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    values = np.fromiter((i for row in ids for i in row), dtype=np.int64, count=int(lengths.sum()))
    return values, lengths


class SampledPairs(TokenizedPairs):
    """The training split's raw text, each batch encoded with a fresh sampled segmentation.

    Served in place of :class:`~data.tokenized_pairs.TokenizedPairs` (same rows, same
    :class:`~data.tokenized_pairs.PairColumns`): the indices come from the token-bucket sampler,
    planned from the deterministic lengths.

    Args:
        dataset: the raw split (columns ``id``, ``src``, ``tgt``), row for row the tokenized one.
        rows: positions of the rows served (those within ``max_len``); ``None``: all.
        src_tokenizer, tgt_tokenizer: the subword models (may be the same object).
        alpha: unigram: the smoothing exponent of the sampling distribution (0.1 to 0.5 are
            usual; smaller is flatter); BPE: the probability of dropping each merge.
        nbest_size: unigram: sample among all segmentations (-1) or the ``nbest_size`` best.
        seed: the data seed; a batch's draw is seeded by it, its epoch and its examples.
        max_len: the longest sequence (EOS included) a sample may give; a sentence whose sample is
            longer keeps its deterministic segmentation.

    Raises:
        ValueError: an ``alpha`` or ``nbest_size`` that would not sample, naming the setting.
    """

    COLUMNS = ("id", "src", "tgt")

    def __init__(
        self,
        dataset: datasets.Dataset,
        rows: np.ndarray | None,
        src_tokenizer: SubwordTokenizer,
        tgt_tokenizer: SubwordTokenizer,
        alpha: float,
        nbest_size: int = -1,
        seed: int = 0,
        max_len: int = 250,
    ) -> None:
        if not alpha > 0:
            raise ValueError(f"data.spm_sampling_alpha must be above 0 (null: no sampling), not {alpha}")
        if nbest_size in (0, 1):
            raise ValueError(
                f"data.spm_sampling_nbest={nbest_size} gives one segmentation, no sampling: "
                "-1 (all segmentations) or at least 2"
            )
        super().__init__(dataset, rows)
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.alpha, self.nbest_size, self.seed, self.max_len = alpha, nbest_size, seed, max_len

    def batch_seeds(self, indices: list[int]) -> tuple[int, int]:
        """The seeds of a batch's source and target draws: from the data seed, the batch's epoch
        and its examples.

        The epoch comes with the indices (:class:`~data.batching.BatchIndices`); plain indices
        count as epoch 0. An epoch's batches are disjoint, so its first example and size name it.
        """
        epoch = getattr(indices, "epoch", 0)
        first = int(indices[0]) if len(indices) else 0
        src, tgt = np.random.SeedSequence([self.seed, epoch, first, len(indices)]).generate_state(2)
        return int(src), int(tgt)

    def _encode(self, tokenizer: SubwordTokenizer, texts: list[str], seed: int, room: int) -> list[list[int]]:
        """Sampled segmentations of ``texts``; a sample longer than ``room`` ids, the best one."""
        sampled = tokenizer.sample_encode(texts, self.alpha, self.nbest_size, seed)
        too_long = [i for i, ids in enumerate(sampled) if len(ids) > room]
        if too_long:
            for i, ids in zip(too_long, tokenizer.encode([texts[i] for i in too_long]), strict=True):
                sampled[i] = ids
        return sampled

    def __getitems__(self, indices: list[int]) -> PairColumns:
        batch = self._rows(indices)
        src_seed, tgt_seed = self.batch_seeds(indices)
        # Within max_len with EOS (source) or BOS/EOS (target), as the filter counted them.
        room = self.max_len - 1
        src = self._encode(self.src_tokenizer, batch.column("src").to_pylist(), src_seed, room)
        tgt = self._encode(self.tgt_tokenizer, batch.column("tgt").to_pylist(), tgt_seed, room)
        src_values, src_lengths = _flat([ids + [EOS_ID] for ids in src])
        tgt_values, tgt_lengths = _flat(tgt)
        ids = batch.column("id").to_numpy()
        return PairColumns(ids, src_values, src_lengths, tgt_values, tgt_lengths)
