"""Cleaning a training corpus where it is read (``data.filters``): the pairs no model should learn.

Crawled and back-translated corpora hold pairs that teach nothing or harm: a side far longer than
the other (misaligned), one seen before (duplicates weigh it twice), a source copied as its target
(the model learns to copy), a side that is nothing once normalised (control and format
characters, spaces). Every toolkit ships these as scripts beside it (Moses' ``clean-corpus-n.perl``,
fairseq's and Marian's examples, OpusFilter); here they are settings, applied to each training
corpus as it is read (:func:`data.arrow_pairs.write_pairs`), before SentencePiece and batching,
each counted per corpus in the log and ``results.json``, and part of the corpus cache's key.
Validation and test are never filtered: they are scored line by line.

Lengths are in words (spaces) here, before subwords exist; ``data.max_len`` still drops pairs
longer than that many subwords later.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

# The reasons a pair is dropped, in the order they are checked (a pair counts under its first).
REASONS = ("empty", "min_len", "max_len", "length_ratio", "copies", "duplicates")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class PairFilters:
    """Which training pairs are dropped (``data.filters``); each ``None`` / ``False`` is off.

    Attributes:
        empty: drop a pair with a side that is empty once normalised (:func:`normalise`).
        min_len: drop a pair with a side of fewer words.
        max_len: drop a pair with a side of more words.
        length_ratio: drop a pair whose longer side has more than this many times the words of
            the shorter (Moses' ``clean-corpus-n.perl`` uses 9; 3 is usual for web crawls).
        copies: drop a pair whose source and target are equal once normalised.
        duplicates: drop a pair whose normalised source and target came before (the first stays).
    """

    empty: bool = False
    min_len: int | None = None
    max_len: int | None = None
    length_ratio: float | None = None
    copies: bool = False
    duplicates: bool = False

    def __post_init__(self) -> None:
        for name in ("min_len", "max_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"data.filters.{name} must be null or at least 1, not {value}")
        if self.length_ratio is not None and self.length_ratio < 1:
            raise ValueError(f"data.filters.length_ratio must be null or at least 1, not {self.length_ratio}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> PairFilters:
        """From ``data.filters`` (None: none); an unknown key is refused, naming it."""
        values = dict(values or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(
                f"data.filters: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
        return cls(**values)

    @property
    def active(self) -> bool:
        return any(v not in (None, False) for v in asdict(self).values())

    def key(self) -> dict[str, Any]:
        """What the corpus cache keys on (the settings that are on)."""
        return {k: v for k, v in asdict(self).items() if v not in (None, False)}


def normalise(text: str) -> str:
    """NFKC, format and control characters removed, spaces collapsed, stripped, lowercased:
    what makes two sides "the same" for the copy and duplicate filters."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c)[0] != "C" or c in "\t\n")
    return _SPACES.sub(" ", text).strip().lower()


class PairFilter:
    """The filters applied to one training corpus, block by block, with their counts.

    Args:
        filters: the settings.
    """

    def __init__(self, filters: PairFilters) -> None:
        self.filters = filters
        self.counts = dict.fromkeys(REASONS, 0)
        self._seen: set[int] = set()

    def keep(self, sources: Sequence[str], targets: Sequence[str]) -> np.ndarray:
        """``[n]`` bool: which pairs of a block stay; the others are counted by their reason."""
        f = self.filters
        keep = np.ones(len(sources), dtype=bool)
        for i, (src, tgt) in enumerate(zip(sources, targets, strict=True)):
            reason = None
            s, t = (normalise(src), normalise(tgt)) if f.empty or f.copies or f.duplicates else (src, tgt)
            if f.empty and (not s or not t):
                reason = "empty"
            else:
                ns, nt = len(src.split()), len(tgt.split())
                if f.min_len is not None and min(ns, nt) < f.min_len:
                    reason = "min_len"
                elif f.max_len is not None and max(ns, nt) > f.max_len:
                    reason = "max_len"
                elif f.length_ratio is not None and max(ns, nt) > f.length_ratio * max(min(ns, nt), 1):
                    reason = "length_ratio"
                elif f.copies and s == t:
                    reason = "copies"
                elif f.duplicates:
                    digest = hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=8).digest()
                    value = int.from_bytes(digest, "little")
                    if value in self._seen:
                        reason = "duplicates"
                    else:
                        self._seen.add(value)
            if reason is not None:
                keep[i] = False
                self.counts[reason] += 1
        return keep

    def summary(self) -> str:
        """``"12 empty, 3 duplicates"``: the reasons that dropped pairs; "" where none did."""
        return ", ".join(f"{n:,} {reason}" for reason, n in self.counts.items() if n)
