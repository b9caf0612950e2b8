"""What a translator returns: a sentence's translations (:class:`Translation`), or a given
target's log-probability (:class:`Score`, ``--score-references``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Translation:
    """One output of one sentence.

    Attributes:
        text: detokenized, on one line (no line-break characters).
        tokens: target ids without BOS and EOS.
        score: length-normalised log-probability (NaN for greedy search).
        log_prob: raw log-probability (NaN for greedy search).
        sample: with sampling, which sample of the sentence it is (0 the first drawn); else None.
        alignment: its word alignment, (source word, output word) links, 0-based over the
            whitespace-split source line and ``text``, sorted by output word; None unless asked
            for (``Translator.align``, ``translate.py --alignment-output``).
    """

    text: str
    tokens: list[int]
    score: float
    log_prob: float
    sample: int | None = None
    alignment: list[tuple[int, int]] | None = None


@dataclass
class Score:
    """A given target's log-probability under the model (forced decoding).

    Attributes:
        log_prob: the sum over the target's tokens, EOS included.
        tokens: how many: the target's subwords plus EOS.
    """

    log_prob: float
    tokens: int

    @property
    def mean(self) -> float:
        """Per token: minus the training NLL of the pair without label smoothing."""
        return self.log_prob / self.tokens
