"""Word alignments of translations: cross-attention between subwords read as links between words.

``decoding.alignment`` gives, for a translation, a decoder layer's cross-attention A (heads
averaged) while the decoder predicted each output subword: rows over output subwords, columns over
source subwords. Words are the whitespace-split words of the source line and of the output line,
and a link is written ``i-j`` (0-based: i a source word, j an output word), as fast_align and
fairseq write them, sorted by j:

1. **Subwords to words.** Each subword belongs to the words its characters lie in, by the
   character offsets SentencePiece reports (:func:`word_pieces`). A piece that carries only the
   space before a word ("▁" alone) belongs to that word; a target-language tag put before the
   source (``<2de>``) and EOS belong to none, so neither is ever a source word.
2. **Word attention.** W[j, i] = mean over output subwords t of word j of (sum over source
   subwords s of word i of A[t, s]). Summed over a source word's subwords: a row is a
   distribution over source subwords, and a word's share of it is the sum of its subwords'
   (averaged or maxed, a word cut into three pieces that share its attention would lose to a
   one-piece word with a third of it). Averaged over an output word's subwords: each of its rows
   is a distribution of its own, and their mean is one too, whatever the word's length.
3. **Links.** Each output word is linked to the source word it attends to most, argmax_i W[j, i]
   (:func:`hard_alignment`): one link per output word, as fairseq's ``extract_hard_alignment``
   links each output subword; a source word may have several links or none.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sentencepiece as spm
import torch
from torch import Tensor

from data.lines import one_line


class HasProcessor(Protocol):
    """A tokenizer with its SentencePiece processor (``data.tokenizer.SubwordTokenizer``)."""

    sp: spm.SentencePieceProcessor


@dataclass(frozen=True)
class Words:
    """The words of a text and the subwords that make each.

    Attributes:
        pieces: per word (in order), the positions of its subwords in the id sequence; empty for
            a word no subword reached (cropped away, or normalised to nothing).
    """

    pieces: list[list[int]]

    def __len__(self) -> int:
        return len(self.pieces)


def word_spans(text: str) -> list[tuple[int, int]]:
    """The character spans [start, end) of ``text.split()``'s words, in order."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, char in enumerate(text):
        if char.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    if start is not None:
        spans.append((start, len(text)))
    return spans


def word_pieces(pieces: Sequence[tuple[int, int, bool]], words: Sequence[tuple[int, int]]) -> Words:
    """Which subwords make each word.

    Args:
        pieces: per subword, its character span [start, end) in the text and whether its surface
            is blank (empty or whitespace only).
        words: the words' character spans, in order (:func:`word_spans`).

    Returns:
        Per word, the subwords whose span overlaps it, and the blank subwords just before it
        (the "▁" that marks its space); a subword elsewhere (a tag before the text) belongs to none.
    """
    starts = [start for start, _ in words]
    found: list[list[int]] = [[] for _ in words]
    for p, (start, end, blank) in enumerate(pieces):
        covered = []
        for i in range(
            max(bisect.bisect_right(starts, start) - 1, 0), len(words)
        ):  # from the word it starts in
            if words[i][0] >= end:
                break
            if start < words[i][1]:
                covered.append(i)
        if not covered and blank:
            after = bisect.bisect_left(starts, start)
            covered = [after] if after < len(words) else []
        for i in covered:
            found[i].append(p)
    return Words(found)


def _char_at_byte(text: str) -> list[int]:
    """Per byte offset of ``text`` in UTF-8 (and its end), the index of the character there."""
    chars = []
    for i, char in enumerate(text):
        chars.extend([i] * len(char.encode("utf-8")))
    chars.append(len(text))
    return chars


def _pieces_of(proto: Any, text: str) -> list[tuple[int, int, bool]]:
    """A SentencePiece text proto's pieces as (start, end, blank), in characters of ``text``
    (the proto's offsets are bytes of its UTF-8)."""
    chars = _char_at_byte(text)
    return [(chars[p.begin], chars[p.end], not p.surface.strip()) for p in proto.pieces]


def encoded_words(tokenizer: HasProcessor, text: str, line_start: int, limit: int) -> tuple[list[int], Words]:
    """The subword ids of an encoded source and which of them make each word of its line.

    Args:
        tokenizer: the source tokenizer.
        text: what the translator encodes (``Translator.encode_sources``): the line, after a
            target-language tag and a space for a model of several target languages.
        line_start: where the line starts in ``text`` (after the tag): words before it are not
            the line's.
        limit: the most subwords kept (the translator crops longer sources).

    Returns:
        The ids (at most ``limit``) and the line's words (``text[line_start:].split()``).
    """
    proto = tokenizer.sp.encode(text, out_type="proto")
    pieces = _pieces_of(proto, text)[:limit]
    ids = [p.id for p in proto.pieces][:limit]
    words = [span for span in word_spans(text) if span[0] >= line_start]
    return ids, word_pieces(pieces, words)


def output_words(tokenizer: HasProcessor, tokens: Sequence[int], skipped: frozenset[int]) -> Words:
    """Which of an output's subwords make each word of its text (``Translation.text.split()``).

    Args:
        tokenizer: the target tokenizer.
        tokens: the output's ids, without BOS and EOS.
        skipped: ids the detokenizer drops (pad, BOS, EOS): they belong to no word.
    """
    kept = [k for k, token in enumerate(tokens) if token not in skipped]
    proto = tokenizer.sp.decode([tokens[k] for k in kept], out_type="proto")
    text = one_line(proto.text)  # the translation's text, before its ends are stripped
    words = word_pieces(_pieces_of(proto, proto.text), word_spans(text))
    return Words([[kept[p] for p in pieces] for pieces in words.pieces])


def hard_alignment(attention: Tensor, source: Words, output: Words) -> list[tuple[int, int]]:
    """Each output word linked to the source word it attends to most (module docstring).

    Args:
        attention: [output subwords, source subwords (EOS may follow)]: row t is the attention
            that output subword t is read from.
        source: the source's words, by subword position (columns).
        output: the output's words, by subword position (rows).

    Returns:
        (i, j) links, one per output word that has a subword, sorted by j; none where no source
        word has a subword.
    """
    reached = [i for i, pieces in enumerate(source.pieces) if pieces]
    if not reached:
        return []
    columns = torch.zeros(attention.size(1), len(reached))  # (S, I): source subword -> its word
    for column, i in enumerate(reached):
        columns[source.pieces[i], column] = 1.0
    per_word = attention.float() @ columns  # (T, I): each output subword's attention to each word
    links = []
    for j, pieces in enumerate(output.pieces):
        if pieces:
            links.append((reached[int(per_word[pieces].mean(dim=0).argmax())], j))
    return links


def format_alignment(links: Sequence[tuple[int, int]]) -> str:
    """``[(0, 0), (2, 1)]`` -> ``"0-0 2-1"`` (fast_align's and fairseq's format)."""
    return " ".join(f"{i}-{j}" for i, j in links)
