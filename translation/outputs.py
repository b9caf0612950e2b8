"""What ``translate.py`` writes: its output files and their line formats.

Every file gets UTF-8, ``\\n``-ended lines whatever the locale, flushed a part at a time:

* the translations (``--output`` or stdout): one line per input line, the best translation, or
  with sampling the first sample (:func:`best_lines`);
* ``--nbest-output``: ``line_number<TAB>rank<TAB>score<TAB>translation`` rows (:func:`nbest_rows`),
  and ``<TAB>alignment`` after them with ``--alignment-output``;
* ``--alignment-output``: one line per input line, the word alignment of its output line, ``i-j``
  links (:func:`alignment_lines`; "" for an empty line);
* ``--score-references``' scores: ``sum<TAB>tokens<TAB>mean`` (:func:`score_rows`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from translation.alignment import format_alignment
from translation.results import Score, Translation
from translation.usage import UsageError


@contextmanager
def open_output(path: str | None, append: bool = False) -> Iterator[BinaryIO]:
    """Where lines go: stdout's bytes, or ``path`` opened for writing (appending: ``--resume``)."""
    if path is None:
        yield sys.stdout.buffer
        return
    try:
        f = open(path, "ab" if append else "wb")  # noqa: SIM115 (closed below)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror or err}") from None
    with f:
        yield f


def write_lines(lines: list[str], out: BinaryIO) -> None:
    """UTF-8, '\\n'-ended, whatever the locale, flushed."""
    out.write("".join(line + "\n" for line in lines).encode("utf-8"))
    out.flush()


def first_sample(hyps: list[Translation]) -> Translation:
    """A sampled line's first sample (``Translation.sample`` 0), whatever its score."""
    return min(hyps, key=lambda h: h.sample if h.sample is not None else 0)


def best_lines(results: list[list[Translation]], sampling: bool) -> list[str]:
    """One output line per input line: its best translation ("" for an empty line).

    With sampling, a line's output is its first sample (every sample is a fair draw; the
    likeliest of several is not), and the n-best file keeps them all.
    """
    return [(first_sample(hyps) if sampling else hyps[0]).text if hyps else "" for hyps in results]


def nbest_rows(results: list[list[Translation]], first: int = 1) -> list[str]:
    """The n-best rows of input lines ``first, first + 1, ...``; empty lines have none. A
    translation with its alignment has it in a fifth column."""
    return [
        f"{number}\t{rank}\t{hyp.score:.6f}\t{hyp.text.replace(chr(9), ' ')}"
        + ("" if hyp.alignment is None else "\t" + format_alignment(hyp.alignment))
        for number, hyps in enumerate(results, start=first)
        for rank, hyp in enumerate(hyps, start=1)
    ]


def printed(results: list[list[Translation]], sampling: bool) -> list[list[Translation]]:
    """Per input line, the translation its output line holds (:func:`best_lines`), alone in its
    list; none for an empty line."""
    return [[first_sample(hyps) if sampling else hyps[0]] if hyps else [] for hyps in results]


def alignment_lines(results: list[list[Translation]], sampling: bool) -> list[str]:
    """One line per input line: the alignment of its output line's translation, ``i-j`` links
    ("" for an empty line, or an output with no words)."""
    return [format_alignment(hyps[0].alignment or []) if hyps else "" for hyps in printed(results, sampling)]


def score_rows(scores: list[Score]) -> list[str]:
    """One ``sum<TAB>tokens<TAB>mean`` row per scored pair."""
    return [f"{s.log_prob:.6f}\t{s.tokens}\t{s.mean:.6f}" for s in scores]
