"""``data.filters``' lengths in SentencePiece pieces (``length_unit: pieces``), once every split is tokenized.

Whitespace words miscount every language written without spaces (a Chinese or Japanese sentence
is one "word", so a length ratio copied from a German-English recipe drops nearly every en-zh
pair), and characters count a script's letters differently from another's. The pieces of the run's
joint SentencePiece model are what the model reads, and a sentence and its translation have about
as many of them in any pair of languages. They exist only once the model is trained on the
training split, so these filters run after tokenization, on its lengths, beside ``data.max_len``
(:func:`data.loading.load_data`), after every filter applied where the corpora were read
(:mod:`data.filters`). A side's pieces are its tokenized length without EOS (and BOS) and
without its tags' pieces (:func:`tag_pieces`), so that a tagged corpus counts as an untagged one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from data.filters import LENGTHS, PairFilters
from data.tokenizer import SubwordTokenizer


def tag_pieces(prefixes: Sequence[str], tokenizer: SubwordTokenizer) -> np.ndarray:
    """``[corpora]`` how many pieces each corpus's source prefix (its tags and a space) adds.

    A reserved tag is one piece, and the word boundary before it another (``"<BT> hund"`` is
    ``▁ <BT> ▁hund``), which the prefix alone encodes to as well.
    """
    return np.array([len(tokenizer.encode([p])[0]) if p else 0 for p in prefixes], dtype=np.int64)


def dropped_in_pieces(filters: PairFilters, src: np.ndarray, tgt: np.ndarray) -> dict[str, np.ndarray]:
    """Which pairs each length filter drops, each pair under its first reason (min_len, max_len,
    length_ratio).

    Args:
        filters: the settings (their ``min_len``, ``max_len``, ``length_ratio``).
        src: ``[N]`` source pieces.
        tgt: ``[N]`` target pieces.

    Returns:
        Per reason that is on, ``[N]`` bool: dropped for it.
    """
    longer, shorter = np.maximum(src, tgt), np.minimum(src, tgt)
    hits = {
        "min_len": None if filters.min_len is None else shorter < filters.min_len,
        "max_len": None if filters.max_len is None else longer > filters.max_len,
        "length_ratio": (
            None if filters.length_ratio is None else longer > filters.length_ratio * np.maximum(shorter, 1)
        ),
    }
    left = np.ones(len(src), dtype=bool)
    dropped = {}
    for reason in LENGTHS:
        if hits[reason] is not None:
            dropped[reason] = hits[reason] & left
            left &= ~hits[reason]
    return dropped


def filter_in_pieces(
    filters: PairFilters,
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    corpus_of: np.ndarray,
    tags: np.ndarray,
) -> tuple[np.ndarray, list[dict[str, int]]]:
    """The training pairs the piece lengths keep, and what they dropped of each corpus.

    Args:
        filters: the settings, with ``length_unit: pieces``.
        src_len: ``[N]`` tokenized source widths (pieces, tags and EOS).
        tgt_len: ``[N]`` tokenized target widths (pieces and BOS or EOS).
        corpus_of: ``[N]`` the training corpus of each pair.
        tags: ``[corpora]`` the pieces of each corpus's source tags (:func:`tag_pieces`).

    Returns:
        ``[N]`` bool, kept; per training corpus, its dropped pairs by reason (only those > 0).
    """
    src = src_len - 1 - tags[corpus_of]
    tgt = tgt_len - 1
    dropped = dropped_in_pieces(filters, src, tgt)
    keep = np.ones(len(src_len), dtype=bool)
    counts: list[dict[str, int]] = [{} for _ in tags]
    for reason, hit in dropped.items():
        keep &= ~hit
        for corpus, n in enumerate(np.bincount(corpus_of[hit], minlength=len(tags)).tolist()):
            if n:
                counts[corpus][reason] = n
    return keep, counts
