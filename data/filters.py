"""Cleaning a training corpus where it is read (``data.filters``): the pairs no model should learn.

Crawled and back-translated corpora hold pairs that teach nothing or harm: a side far longer than
the other (misaligned), one seen before (duplicates weigh it twice), a source copied as its target
(the model learns to copy), a side that is nothing once normalised (control and format
characters, spaces), a side in another language or script than its corpus's, a pair that is also
in a test set (the score then measures memory). Every toolkit ships such filters as scripts
beside it (Moses' ``clean-corpus-n.perl``, fairseq's and Marian's examples, OpusFilter); here they
are settings, each counted per corpus in the log and ``results.json``, and the ones applied where
a training corpus is read are part of the corpus cache's key. Validation and test are never
filtered: they are scored line by line.

When each runs, and in what unit:

* where each training corpus is read (:func:`data.arrow_pairs.write_pairs`, :class:`PairFilter`),
  before SentencePiece is trained on it: ``empty``, ``copies``, ``eval_overlap`` (against the
  validation and test sets, read first), ``cross_duplicates`` (against the corpora before it),
  ``duplicates``, ``script``, ``language``, and the lengths where ``length_unit`` is ``words``
  (spaces; the default, as before units existed) or ``characters`` (those that are no space: a
  Chinese or Japanese sentence is one "word");
* with ``length_unit: pieces``, ``min_len``, ``max_len`` and ``length_ratio`` count the
  SentencePiece pieces of the run's model (tags and BOS/EOS not counted), so they can only run once
  every split is tokenized (:mod:`data.piece_lengths`): the model is trained on the pairs before
  them, as it is on those ``data.max_len`` drops; they are cheap, and changing them prepares nothing
  afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from data.overlap import OVERLAP_MODES, PriorPairs, normalise, pair_hash, text_hash, union
from data.scripts import LANGUAGE_SCRIPTS, script_share, scripts_of

# The reasons a pair is dropped, in the order they are checked (a pair counts under its first);
# the piece lengths (length_unit: pieces) are checked after all of these, on what they kept.
REASONS = (
    "empty",
    "min_len",
    "max_len",
    "length_ratio",
    "copies",
    "eval_overlap",
    "cross_duplicates",
    "duplicates",
    "script",
    "language",
)
LENGTH_UNITS = ("words", "characters", "pieces")
LENGTHS = ("min_len", "max_len", "length_ratio")
__all__ = ["LENGTH_UNITS", "REASONS", "PairFilter", "PairFilters", "normalise"]


@dataclass(frozen=True)
class PairFilters:
    """Which training pairs are dropped (``data.filters``); each ``None`` / ``False`` is off.

    Attributes:
        empty: drop a pair with a side that is empty once normalised (:func:`normalise`).
        min_len: drop a pair with a side of fewer ``length_unit``.
        max_len: drop a pair with a side of more ``length_unit``.
        length_ratio: drop a pair whose longer side has more than this many times the
            ``length_unit`` of the shorter (Moses' ``clean-corpus-n.perl`` uses 9 words; 3 is usual
            for web crawls).
        length_unit: what the three lengths count: ``"words"`` (spaces), ``"characters"`` (those
            that are no space) or ``"pieces"`` (the run's SentencePiece pieces, after tokenization).
        copies: drop a pair whose source and target are equal once normalised.
        eval_overlap: drop a pair whose normalised ``"source"``, or whole ``"pair"``, is also in a
            validation or test set.
        cross_duplicates: drop a pair that an earlier corpus of ``data.corpora`` holds (normalised).
        duplicates: drop a pair whose normalised source and target came before in its corpus (the
            first stays).
        script: drop a pair with a side of which less than this share of the letters is in its
            language's script (:mod:`data.scripts`).
        language: drop a pair with a side whose most likely language (:mod:`data.language_id`) is
            not its corpus's, or is with a probability under this.
    """

    empty: bool = False
    min_len: int | None = None
    max_len: int | None = None
    length_ratio: float | None = None
    length_unit: str = "words"
    copies: bool = False
    eval_overlap: str | None = None
    cross_duplicates: bool = False
    duplicates: bool = False
    script: float | None = None
    language: float | None = None

    def __post_init__(self) -> None:
        for name in ("min_len", "max_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"data.filters.{name} must be null or at least 1, not {value}")
        if self.length_ratio is not None and self.length_ratio < 1:
            raise ValueError(f"data.filters.length_ratio must be null or at least 1, not {self.length_ratio}")
        if self.length_unit not in LENGTH_UNITS:
            raise ValueError(
                f"data.filters.length_unit must be one of {', '.join(LENGTH_UNITS)}, not {self.length_unit!r}"
            )
        if self.eval_overlap is not None and self.eval_overlap not in OVERLAP_MODES:
            modes = " or ".join(OVERLAP_MODES)
            raise ValueError(f"data.filters.eval_overlap must be null, {modes}, not {self.eval_overlap!r}")
        if self.script is not None and not 0 < self.script <= 1:
            raise ValueError(f"data.filters.script must be null or a share in (0, 1], not {self.script}")
        if self.language is not None and not 0 <= self.language <= 1:
            raise ValueError(
                f"data.filters.language must be null or a probability in [0, 1], not {self.language}"
            )

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
        """Any filter is on (``length_unit`` alone is none)."""
        return bool(self.key())

    @property
    def in_pieces(self) -> bool:
        """Lengths are filtered in pieces, after tokenization (:mod:`data.piece_lengths`)."""
        return self.length_unit == "pieces" and any(getattr(self, name) is not None for name in LENGTHS)

    def where_read(self) -> PairFilters:
        """The filters applied where a training corpus is read: all but the piece lengths."""
        if self.length_unit != "pieces":
            return self
        return replace(self, min_len=None, max_len=None, length_ratio=None, length_unit="words")

    def key(self) -> dict[str, Any]:
        """What the corpus cache keys on: the settings that are on (``length_unit`` where not words,
        the identifier's version with ``language``), so that a config without the newer settings
        keeps its entries."""
        key = {k: v for k, v in asdict(self).items() if v not in (None, False) and k != "length_unit"}
        if self.length_unit != "words" and any(k in key for k in LENGTHS):
            key["length_unit"] = self.length_unit
        if self.language is not None:
            from data.language_id import identifier_version

            key["language_id"] = identifier_version()
        return key

    def check_languages(self, languages: Iterable[str]) -> None:
        """Refuses, when the config is read, a language that ``script`` or ``language`` cannot judge.

        Args:
            languages: the source and target languages of every training corpus.

        Raises:
            ValueError: naming the key, the language and what is known (or what to install).
        """
        languages = list(dict.fromkeys(languages))
        if self.script is not None:
            for lang in languages:
                if scripts_of(lang) is None:
                    raise ValueError(
                        f"data.filters.script: no script is known for the language {lang!r} "
                        f"(data/scripts.py knows {', '.join(sorted(LANGUAGE_SCRIPTS))})"
                    )
        if self.language is not None:
            from data.language_id import check_languages

            check_languages(languages)


class PairFilter:
    """The filters applied to one training corpus where it is read, block by block, with their counts.

    Args:
        filters: the settings (:meth:`PairFilters.where_read`: no piece lengths).
        src_lang: the corpus's source language, for ``script`` and ``language``.
        tgt_lang: its target language.
        prior: what ``eval_overlap`` and ``cross_duplicates`` compare with; hashed here.

    Raises:
        ValueError: lengths in pieces, or ``eval_overlap`` / ``cross_duplicates`` without ``prior``.
    """

    def __init__(
        self, filters: PairFilters, src_lang: str = "", tgt_lang: str = "", prior: PriorPairs | None = None
    ) -> None:
        if filters.in_pieces:
            raise ValueError("lengths in pieces are filtered after tokenization (data.piece_lengths)")
        if filters.eval_overlap and prior is None:
            raise ValueError("data.filters.eval_overlap needs the validation and test sets (prior)")
        self.filters = filters
        self.counts = dict.fromkeys(REASONS, 0)
        self._seen: set[int] = set()
        prior = prior or PriorPairs()
        self._evaluation = union(prior.evaluation)
        self._earlier = union(prior.earlier)
        self._langs = (src_lang, tgt_lang)
        self._scripts = (scripts_of(src_lang), scripts_of(tgt_lang)) if filters.script is not None else None
        if filters.language is not None:
            from data.language_id import LanguageCheck

            self._language = LanguageCheck(filters.language)
        f = filters
        self._normalised = f.empty or f.copies or f.duplicates or f.cross_duplicates or bool(f.eval_overlap)
        self._lengths = any(getattr(f, name) is not None for name in LENGTHS)

    def keep(self, sources: Sequence[str], targets: Sequence[str]) -> np.ndarray:
        """``[n]`` bool: which pairs of a block stay; the others are counted by their reason."""
        keep = np.ones(len(sources), dtype=bool)
        for i, (src, tgt) in enumerate(zip(sources, targets, strict=True)):
            reason = self._reason(src, tgt)
            if reason is not None:
                keep[i] = False
                self.counts[reason] += 1
        return keep

    def _reason(self, src: str, tgt: str) -> str | None:
        """The first reason to drop a pair, in :data:`REASONS`' order; None to keep it."""
        f = self.filters
        s, t = (normalise(src), normalise(tgt)) if self._normalised else (src, tgt)
        if f.empty and (not s or not t):
            return "empty"
        if self._lengths:
            reason = self._length_reason(self._length(src), self._length(tgt))
            if reason is not None:
                return reason
        if f.copies and s == t:
            return "copies"
        if (
            f.eval_overlap
            and (text_hash(s) if f.eval_overlap == "source" else pair_hash(s, t)) in self._evaluation
        ):
            return "eval_overlap"
        pair = pair_hash(s, t) if f.duplicates or f.cross_duplicates else 0
        if f.cross_duplicates and pair in self._earlier:
            return "cross_duplicates"
        if f.duplicates:
            if pair in self._seen:
                return "duplicates"
            self._seen.add(pair)
        if self._scripts is not None:
            for text, scripts in zip((src, tgt), self._scripts, strict=True):
                share = script_share(text, scripts)
                if share is not None and share < f.script:
                    return "script"
        if f.language is not None:
            if not all(
                self._language.is_in(text, lang) for text, lang in zip((src, tgt), self._langs, strict=True)
            ):
                return "language"
        return None

    def _length(self, text: str) -> int:
        """A side's length in words, or in the characters that are no space."""
        return len(text.split()) if self.filters.length_unit == "words" else len("".join(text.split()))

    def _length_reason(self, ns: int, nt: int) -> str | None:
        f = self.filters
        if f.min_len is not None and min(ns, nt) < f.min_len:
            return "min_len"
        if f.max_len is not None and max(ns, nt) > f.max_len:
            return "max_len"
        if f.length_ratio is not None and max(ns, nt) > f.length_ratio * max(min(ns, nt), 1):
            return "length_ratio"
        return None

    def summary(self) -> str:
        """``"12 empty, 3 duplicates"``: the reasons that dropped pairs; "" where none did."""
        return ", ".join(f"{n:,} {reason}" for reason, n in self.counts.items() if n)
