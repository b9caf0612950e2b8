"""Which training examples an epoch holds when several corpora are mixed by weight.

A corpus of ``n`` pairs with weight ``w`` contributes ``floor(w) * n + round(frac(w) * n)``
examples to every epoch: ``floor(w)`` copies of each pair (upsampling a small clean corpus,
fairseq's ``--upsample-primary``), plus a random ``frac(w)`` share of its pairs, drawn afresh for
every epoch (a large back-translated corpus at 0.5 gives half of its pairs, a different half each
epoch).

The share is a fresh random sample every epoch in which every pair of a corpus is equally likely,
whatever its length (the property that matters: a rare long pair is drawn as often as a common
short one). It is drawn in two stages, so that the epoch's size stays fixed: pairs are grouped by
``(corpus, length key)``; a group of ``s`` pairs gets ``floor(s * frac(w))`` of them for sure and
one more with probability equal to the remainder (systematic sampling over the groups in a random
order, so the corpus's total is exact); then which pairs of a group fill its count is a uniform
draw. The number of batches per epoch stays the same too (Lightning reads it once): the
token-bucket sampler cuts every epoch at the same positions, planned with the longest key each
position can hold in any draw (:meth:`CorpusMix.widest_order`), so no batch exceeds the token
budget whatever the draw. The draw depends on the generator it is given alone (the sampler's
``(seed, epoch)``), so a resumed run draws what the straight run drew.

``corpus_weights`` turns a temperature into weights (``data.corpora_temperature``): corpus ``c``
of ``n_c`` pairs gets a share of each epoch proportional to ``n_c ** (1 / T)`` (fairseq's and
mBART's temperature sampling over languages), an epoch holding as many examples as the corpora
have pairs.
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
        self.group_corpus = group_corpus
        self.group_keys = keys[self.order][self.starts] if len(self.order) else np.zeros(0, np.int64)
        self.copies = np.array([int(self.weights[c]) for c in group_corpus], dtype=np.int64)
        # Per group: pairs drawn for sure, and the probability of one more (the remainder, scaled
        # within its corpus so that the corpus's extras add up to a whole number, `self.extras`).
        self.floors = np.zeros(len(self.starts), dtype=np.int64)
        self.chance = np.zeros(len(self.starts), dtype=np.float64)
        self.extras = np.zeros(len(self.weights), dtype=np.int64)
        self.fixed_drawn = np.zeros(len(self.starts), dtype=np.int64)  # the draw without a generator
        for c, w in enumerate(self.weights):
            groups = np.flatnonzero(group_corpus == c)
            shares = self.sizes[groups] * (w - int(w))
            self.floors[groups] = np.floor(shares).astype(np.int64)
            self.extras[c] = int(round(float(shares.sum()))) - int(self.floors[groups].sum())
            self.chance[groups] = _inclusion_chances(shares - self.floors[groups], int(self.extras[c]))
            self.fixed_drawn[groups] = _largest_remainders(shares)
        self.per_corpus = np.bincount(
            group_corpus, weights=self.copies * self.sizes + self.fixed_drawn, minlength=len(self.weights)
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
        if not self.fixed_drawn.any() and not self.chance.any():
            return whole
        if rng is None:
            drawn = self.fixed_drawn
        else:
            drawn = self.floors.copy()
            for c in range(len(self.weights)):
                groups = np.flatnonzero((self.group_corpus == c) & (self.chance > 0))
                drawn[groups] += _systematic(self.chance[groups], rng)
        # Rank each example within its group at random (or by position) and keep the first `drawn`.
        group = np.repeat(np.arange(len(self.starts)), self.sizes)
        noise = rng.random(len(self.order)) if rng is not None else np.arange(len(self.order), dtype=float)
        shuffled = np.lexsort((noise, group))  # positions in self.order, group by group, at random within
        rank = np.empty(len(self.order), dtype=np.int64)
        rank[shuffled] = np.arange(len(self.order)) - np.repeat(self.starts, self.sizes)
        taken = self.order[rank < np.repeat(drawn, self.sizes)]
        return np.concatenate([whole, taken])

    def widest_order(self) -> np.ndarray:
        """For each position of an epoch sorted by length key, an example with the longest key
        any draw can put there: batches cut on these keep the token budget in every epoch.

        Returns:
            ``[len(self)]`` example indices, keys ascending.
        """
        unique_keys, first = np.unique(self.group_keys, return_index=True)
        if len(unique_keys) == 0:
            return np.zeros(0, dtype=np.int64)
        at = np.searchsorted(unique_keys, self.group_keys)  # each group's place among the keys
        sure = np.bincount(at, weights=self.copies * self.sizes + self.floors, minlength=len(unique_keys))
        fewest = np.cumsum(sure)  # per key: the fewest examples any draw puts at this key or below
        for c in range(len(self.weights)):
            maybe = (self.group_corpus == c) & (self.chance > 0)
            above = int(maybe.sum()) - np.cumsum(np.bincount(at[maybe], minlength=len(unique_keys)))
            fewest = fewest + np.maximum(0, self.extras[c] - above)  # extras that cannot fall above
        positions = np.arange(len(self))
        widest = np.searchsorted(fewest, positions, side="right")
        return self.order[self.starts[first]][widest]


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


def _inclusion_chances(remainders: np.ndarray, total: int) -> np.ndarray:
    """Probabilities in [0, 1], proportional to ``remainders`` and adding up to ``total``.

    ``total`` is ``round(sum(remainders))``, so the scaling is within half a pair over a corpus;
    a chance scaled past 1 is held at 1 and the rest scaled to the remainder of the total.
    """
    chance = np.zeros(len(remainders), dtype=np.float64)
    free = remainders > 0
    left = float(total)
    while left > 0 and free.any():
        scaled = remainders[free] * left / remainders[free].sum()
        if (scaled <= 1).all():
            chance[free] = scaled
            break
        full = np.flatnonzero(free)[scaled > 1]
        chance[full] = 1.0
        free[full] = False
        left -= len(full)
    return chance


def _systematic(chance: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """0 or 1 per item, item ``i`` 1 with probability ``chance[i]``, exactly ``round(sum(chance))``
    ones: systematic sampling at a random offset over the items in a random order."""
    if len(chance) == 0:
        return np.zeros(0, dtype=np.int64)
    order = rng.permutation(len(chance))
    ends = np.cumsum(chance[order])
    ends[-1] = round(float(ends[-1]))  # the sum is a whole number; no rounding error at the end
    offset = rng.random()
    hits = np.floor(ends - offset) - np.floor(ends - chance[order] - offset)
    out = np.zeros(len(chance), dtype=np.int64)
    out[order] = np.clip(hits, 0, 1).astype(np.int64)
    return out


def corpus_weights(pairs: Sequence[int], temperature: float) -> list[float]:
    """Weights that give corpus ``c`` a share of every epoch proportional to ``pairs[c] ** (1/T)``.

    Args:
        pairs: pairs per corpus (each > 0).
        temperature: ``T >= 1``; 1 keeps the corpora's natural shares (every weight 1), larger
            values flatten them towards equal shares (fairseq's, mBART's ``T = 5``).

    Returns:
        Per corpus, the weight ``share_c * sum(pairs) / pairs[c]``: an epoch holds about as many
        examples as the corpora have pairs.

    Raises:
        ValueError: a temperature below 1, or an empty corpus.
    """
    if not temperature >= 1:
        raise ValueError(f"data.corpora_temperature must be at least 1, not {temperature}")
    sizes = np.asarray(pairs, dtype=np.float64)
    if (sizes <= 0).any():
        raise ValueError(f"data.corpora_temperature: corpus {int(np.argmin(sizes))} has no pairs")
    shares = sizes ** (1.0 / temperature)
    shares /= shares.sum()
    return [float(w) for w in shares * sizes.sum() / sizes]
