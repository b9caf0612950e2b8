"""Which training examples an epoch holds when several corpora are mixed by weight.

A corpus of ``n`` pairs with weight ``w`` contributes about ``w * n`` examples to every epoch:
``floor(w)`` copies of each pair (upsampling a small clean corpus, fairseq's
``--upsample-primary``), plus a random ``frac(w)`` share of its pairs, drawn again for every
epoch (a large back-translated corpus at 0.5 gives half of its pairs, a different half each
epoch).

The share is drawn within each group of pairs that have the same ``(corpus, length key)``, a fixed
number per group (largest remainders, so a corpus's groups add up to ``round(frac(w) * n)``).
Every epoch therefore holds the same lengths, in the same numbers: the token-bucket sampler's
batch boundaries, hence the number of batches per epoch, stay the same across epochs (Lightning
reads it once), and only which pairs fill them changes. The draw depends on the generator it is
given alone (the sampler's ``(seed, epoch)``), so a resumed run draws what the straight run drew.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class CorpusMix:
    """The examples of an epoch: each corpus's pairs repeated and sampled by its weight.

    Args:
        corpus_of: ``[N]`` index of the corpus each example comes from, ``0 <= c < len(weights)``.
        weights: per corpus, how many times its pairs count per epoch (> 0; 1: each once).
        keys: ``[N]`` int64 length key per example; examples with equal keys are interchangeable
            for batching (the sampler's ``(max, src, tgt)`` length key).

    Raises:
        ValueError: a weight that is not positive, or arrays of different lengths.
    """

    def __init__(self, corpus_of: np.ndarray, weights: Sequence[float], keys: np.ndarray) -> None:
        corpus_of = np.asarray(corpus_of, dtype=np.int64)
        keys = np.asarray(keys, dtype=np.int64)
        if corpus_of.shape != keys.shape:
            raise ValueError("corpus_of and keys differ in length")
        for c, w in enumerate(weights):
            if not w > 0:
                raise ValueError(f"corpus {c}: weight must be positive, not {w}")
        self.weights = [float(w) for w in weights]
        # Examples grouped by (corpus, key): `order` lists them group by group, `starts` and
        # `sizes` delimit each group within it.
        self.order = np.lexsort((keys, corpus_of))
        grouped = np.stack([corpus_of[self.order], keys[self.order]])
        new = np.ones(len(self.order), dtype=bool)
        new[1:] = np.any(grouped[:, 1:] != grouped[:, :-1], axis=0)
        self.starts = np.flatnonzero(new)
        self.sizes = np.diff(np.append(self.starts, len(self.order)))
        group_corpus = corpus_of[self.order][self.starts] if len(self.order) else np.zeros(0, np.int64)
        self.copies = np.array([int(self.weights[c]) for c in group_corpus], dtype=np.int64)
        self.drawn = np.zeros(len(self.starts), dtype=np.int64)  # per group, pairs drawn by chance
        for c, w in enumerate(self.weights):
            groups = np.flatnonzero(group_corpus == c)
            self.drawn[groups] = _largest_remainders(self.sizes[groups] * (w - int(w)))
        self.per_corpus = np.bincount(
            group_corpus, weights=self.copies * self.sizes + self.drawn, minlength=len(self.weights)
        ).astype(np.int64)

    def __len__(self) -> int:
        """Examples per epoch (the same every epoch)."""
        return int(self.per_corpus.sum())

    def examples(self, rng: np.random.Generator | None) -> np.ndarray:
        """This epoch's examples, each repeated or drawn by its corpus's weight.

        Args:
            rng: the epoch's generator; ``None``: the first pairs of each group (a fixed draw).

        Returns:
            ``[len(self)]`` example indices, grouped by ``(corpus, key)``; repeats included.
        """
        whole = np.repeat(self.order, np.repeat(self.copies, self.sizes))
        if not self.drawn.any():
            return whole
        # Rank each example within its group at random (or by position) and keep the first `drawn`.
        group = np.repeat(np.arange(len(self.starts)), self.sizes)
        noise = rng.random(len(self.order)) if rng is not None else np.arange(len(self.order), dtype=float)
        shuffled = np.lexsort((noise, group))  # positions in self.order, group by group, at random within
        rank = np.empty(len(self.order), dtype=np.int64)
        rank[shuffled] = np.arange(len(self.order)) - np.repeat(self.starts, self.sizes)
        taken = self.order[rank < np.repeat(self.drawn, self.sizes)]
        return np.concatenate([whole, taken])


def _largest_remainders(shares: np.ndarray) -> np.ndarray:
    """Integers that add up to ``round(sum(shares))``, each the floor of its share or one more.

    The shares with the largest fractional parts get the extra ones (ties by position), so the
    result is the same every time it is computed.
    """
    floors = np.floor(shares).astype(np.int64)
    extra = int(round(float(shares.sum()))) - int(floors.sum())
    if extra > 0:
        floors[np.argsort(-(shares - floors), kind="stable")[:extra]] += 1
    return floors
