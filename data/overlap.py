"""What a training corpus is checked against where it is read: the evaluation sets and the earlier corpora.

``data.filters.eval_overlap`` drops a training pair whose source (``source``) or whole pair
(``pair``) is also in a validation or test set, so that no test sentence is trained on;
``data.filters.cross_duplicates`` drops a pair that an earlier corpus of ``data.corpora`` already
holds. Both compare texts as the duplicate filter does (:func:`normalise`: NFKC, format and
control characters removed, spaces collapsed, lowercased), by an 8-byte hash of the normalised
text. What they compare with are splits already prepared (:mod:`data.prepared`), hashed when a
training corpus is built and not before: where its cache entry exists, nothing is hashed. Their
digests are part of its cache key, so a changed test set or earlier corpus prepares it afresh.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

# What a set of evaluation texts holds: their sources, or their pairs.
OVERLAP_MODES = ("source", "pair")
_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    """NFKC, format and control characters removed, spaces collapsed, stripped, lowercased:
    what makes two sides "the same" for the copy, duplicate and overlap filters."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c)[0] != "C" or c in "\t\n")
    return _SPACES.sub(" ", text).strip().lower()


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def text_hash(normalised: str) -> int:
    """The hash of one normalised side."""
    return _hash(normalised)


def pair_hash(source: str, target: str) -> int:
    """The hash of a normalised pair."""
    return _hash(f"{source}\t{target}")


class HashedTexts:
    """The sources or the pairs of one prepared split, normalised and hashed when first asked.

    Args:
        split: a prepared split, columns ``src`` and ``tgt``.
        prefix: the tags put before its sources where it was read (``"<BT> "``), taken off again.
        digest: its content's digest (:class:`data.prepared.PreparedCorpus`): what names it in a key.
        what: ``"source"`` (its sources) or ``"pair"`` (its pairs).
    """

    def __init__(self, split: datasets.Dataset, prefix: str, digest: str, what: str) -> None:
        if what not in OVERLAP_MODES:
            raise ValueError(f"what must be one of {OVERLAP_MODES}, not {what!r}")
        self.split, self.prefix, self.digest, self.what = split, prefix, digest, what

    @property
    def key(self) -> str:
        """What a cache key names it by: the kind, the content's digest and the prefix."""
        return f"{self.what}:{self.digest}:{self.prefix}"

    @functools.cached_property
    def hashes(self) -> frozenset[int]:
        """The hashes of its normalised sources (or pairs), the prefix taken off each source."""
        from data.arrow_pairs import iter_record_batches  # lazy: arrow_pairs imports the filters

        cut = len(self.prefix)
        found: set[int] = set()
        for batch in iter_record_batches(self.split):
            sources = [s[cut:] if s.startswith(self.prefix) else s for s in batch.column("src").to_pylist()]
            if self.what == "source":
                found.update(text_hash(normalise(s)) for s in sources)
            else:
                targets = batch.column("tgt").to_pylist()
                found.update(
                    pair_hash(normalise(s), normalise(t)) for s, t in zip(sources, targets, strict=True)
                )
        return frozenset(found)


def union(texts: Iterable[HashedTexts]) -> frozenset[int]:
    """Every hash of several splits."""
    return frozenset().union(*(t.hashes for t in texts))


@dataclass(frozen=True)
class PriorPairs:
    """What one training corpus is checked against where it is read.

    Attributes:
        evaluation: the validation and test splits (``data.filters.eval_overlap``), hashed as it says.
        earlier: the training corpora before it in ``data.corpora``, as pairs
            (``data.filters.cross_duplicates``).
    """

    evaluation: tuple[HashedTexts, ...] = ()
    earlier: tuple[HashedTexts, ...] = ()

    def key(self) -> dict[str, list[str]]:
        """What the corpus cache keys on: the splits compared with, by digest; {} where none."""
        parts = {"evaluation": self.evaluation, "earlier": self.earlier}
        return {name: [t.key for t in texts] for name, texts in parts.items() if texts}
