"""Terminology: lexical constraints given with the input lines, and the lines they could not be met in.

``translate.py --constraints`` reads each input line as fairseq-interactive's ``--constraints``
does: ``source<TAB>constraint<TAB>constraint...``. Each constraint is target text that every
translation of the line must contain (``decoding/lexical_constraints.py``); fields that are empty
or whitespace are ignored, and a line without a tab has none.

A constraint is encoded by the target SentencePiece model as a line of its own
(:meth:`translation.translator.Translator.encode_constraints`). SentencePiece marks the start of
every word, the first one of a line included, with ``▁``, and never joins pieces across spaces, so
"Hund" becomes ``▁Hund``: the pieces the word has inside a sentence after a space or at its start.
It is met by the word, not by a word that merely begins with it ("Hunde" is ``▁Hunde`` or
``▁Hund e``: the latter does contain ``▁Hund``, the search cannot tell them apart).

A line whose constraints no hypothesis met within its length limit (``max_len_a`` * source length
+ ``max_len_b``) gets an empty output line, and an error on stderr naming the line and its
constraints (:func:`report_unmet`); the other lines are translated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from decoding import DecodingConfig
from decoding.step import max_output_lengths
from translation.results import Translation

if TYPE_CHECKING:
    from translation.translator import Translator

logger = logging.getLogger(__name__)


def split_constraints(lines: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Each line's source (before its first tab) and its constraints (the other fields, stripped;
    empty ones dropped)."""
    sources, constraints = [], []
    for line in lines:
        source, *fields = line.split("\t")
        sources.append(source)
        constraints.append([f.strip() for f in fields if f.strip()])
    return sources, constraints


def length_limit(source_length: int, options: DecodingConfig, cap: int) -> int:
    """The most output subwords the search gives a source of ``source_length`` subwords (EOS
    excluded), as ``decoding.step.max_output_lengths`` computes it; ``cap``: the model's."""
    src = torch.ones(1, source_length + 1, dtype=torch.long)  # the source and its EOS, no padding
    return int(max_output_lengths(src, 0, options.max_len_a, options.max_len_b, cap)[0])


def _subwords(n: int) -> str:
    return f"{n} subword{'' if n == 1 else 's'}"


def unmet_message(texts: list[str], subwords: list[int], limit: int) -> str:
    """What could not be met: a constraint longer than the limit, or the constraints together."""
    named = [f"'{t}' ({_subwords(n)})" for t, n in zip(texts, subwords, strict=True)]
    too_long = [name for name, n in zip(named, subwords, strict=True) if n > limit]
    if too_long:
        return f"constraint {', '.join(too_long)} is longer than its length limit of {_subwords(limit)}"
    return (
        f"constraints {', '.join(named)} could not all be met within its length limit of {_subwords(limit)}"
    )


def report_unmet(
    translator: Translator,
    sources: Sequence[list[int]],
    constraints: Sequence[list[list[int]]],
    texts: Sequence[list[str]],
    results: Sequence[list[Translation]],
    options: DecodingConfig,
    name: str = "<input>",
    first_line: int = 1,
) -> int:
    """Logs an error for each line whose constraints were not met, and a warning for each empty
    line that has constraints; returns how many lines' constraints were not met.

    Args:
        translator: what translated the lines.
        sources, constraints: per line its source ids and constraint ids, as translated.
        texts: per line its constraints as given (of which ``constraints`` are the non-empty ones).
        results: per line its translations (none: an empty source, or constraints not met).
        options: the search settings (for the length limit).
        name, first_line: the input's name and the number of the first line, for messages.
    """
    cap = translator.model.cfg.max_positions - 1
    unmet = 0
    for number, source, wanted, given, found in zip(
        range(first_line, first_line + len(sources)), sources, constraints, texts, results, strict=True
    ):
        if not wanted or found:
            continue
        if not source:
            logger.warning("%s line %d: no source text: its constraints are not translated", name, number)
            continue
        kept = [
            t
            for t, ids in zip(given, translator.encode_constraints([[t] for t in given]), strict=True)
            if ids
        ]
        what = unmet_message(kept, [len(ids) for ids in wanted], length_limit(len(source), options, cap))
        logger.error(
            "%s line %d: %s (--max-len-a %g x %d source tokens, </s> included, + --max-len-b %d): "
            "its output line is empty",
            name,
            number,
            what,
            options.max_len_a,
            len(source) + 1,
            options.max_len_b,
        )
        unmet += 1
    return unmet
