"""How to decode: one config object for greedy search, beam search and sampling.

:class:`SearchSettings` holds the settings every search has (beam size, length penalty, length
limits, constraints), with the project's defaults, written here only: the search functions'
keyword defaults, the training module's validation and test decoding (``training.module.
EvalDecoding``), ``translate.py``'s options and ``conf/train.yaml``'s ``decoding`` group all take
them from it (``tests/training/test_config.py`` checks ``conf/``). :class:`DecodingConfig` adds
what to search with (greedy, beam or sampling) and how many outputs to return: it is what
:class:`decoding.service.Searcher` takes, from validation, the test stage and ``translate.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchSettings:
    """The settings of every search; the field defaults are the project's.

    Attributes:
        beam_size: hypotheses kept per sentence by beam search (1 finds greedy search's output).
        alpha: GNMT length penalty exponent: scores are log P / ((5 + |y|) / 6) ** alpha, |y|
            counting EOS; 0 ranks by raw log-probability.
        max_len_a, max_len_b: at most ``max_len_a * source_length + max_len_b`` output tokens
            (EOS excluded).
        min_len: EOS is forbidden before this many output tokens (the length limit still wins).
        no_repeat_ngram: no n-gram of this size occurs twice in an output; 0 allows repeats.
    """

    beam_size: int = 5
    alpha: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10
    min_len: int = 0
    no_repeat_ngram: int = 0

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, not {self.beam_size}")
        if self.min_len < 0:
            raise ValueError(f"min_len must be at least 0, not {self.min_len}")
        if self.no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be at least 0, not {self.no_repeat_ngram}")


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample (``decoding/sampling.py``).

    Attributes:
        topk: draw from the k most likely tokens only; 0 (default): from all.
        topp: draw from the fewest most likely tokens whose probability reaches p; 1.0
            (default): from all.
        temperature: divides the log-probabilities before the draw: below 1 sharper, above 1
            flatter; 1.0 (default) samples the model's distribution.
        seed: with the sentence and the sample number, what decides a sample (default 0).
    """

    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.topk < 0:
            raise ValueError(f"topk must be at least 0 (0: no limit), not {self.topk}")
        if not 0.0 < self.topp <= 1.0:
            raise ValueError(f"topp must be in (0, 1], not {self.topp}")
        if not self.temperature > 0.0:
            raise ValueError(f"temperature must be positive, not {self.temperature}")


# How lexical constraints must occur in an output: in any order, or in the order given.
CONSTRAINT_ORDERS = ("unordered", "ordered")


@dataclass(frozen=True)
class DecodingConfig(SearchSettings):
    """What to search with and how: :class:`SearchSettings`, and these.

    Attributes:
        nbest: hypotheses returned per sentence, best first (at most ``beam_size``); with
            ``sampling``, the number of samples per sentence (any number).
        greedy: greedy search instead of beam search (no scores: they are NaN).
        sampling: draw each output from the model's distribution instead of searching (see
            ``decoding/sampling.py``), reshaped by ``topk``, ``topp`` and ``temperature``; a
            sentence's samples depend on ``seed`` and the sentence only, never on its batch.
        topk, topp, temperature, seed: :class:`SamplingConfig`'s (0, 1.0, 1.0, 0).
        constraints_order: how the lexical constraints given with the sources must occur
            (``decoding/lexical_constraints.py``): ``"unordered"`` (default), in any order, or
            ``"ordered"``, in the order given; beam search only.
    """

    nbest: int = 1
    greedy: bool = False
    sampling: bool = False
    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    constraints_order: str = "unordered"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.constraints_order not in CONSTRAINT_ORDERS:
            raise ValueError(
                f"constraints_order={self.constraints_order!r} must be one of {', '.join(CONSTRAINT_ORDERS)}"
            )
        _ = self.sampling_config  # SamplingConfig checks topk, topp and temperature
        if self.greedy and self.sampling:
            raise ValueError("greedy and sampling exclude each other: choose one")
        if self.sampling:
            if self.nbest < 1:
                raise ValueError(f"nbest={self.nbest}: the samples per sentence must be at least 1")
        elif not 1 <= self.nbest <= (1 if self.greedy else self.beam_size):
            raise ValueError(f"nbest={self.nbest} must be between 1 and the beam size")

    @property
    def search(self) -> str:
        """``"greedy"``, ``"beam"`` or ``"sampling"``."""
        return "sampling" if self.sampling else "greedy" if self.greedy else "beam"

    @property
    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(self.topk, self.topp, self.temperature, self.seed)

    @property
    def hypotheses(self) -> int:
        """Rows of decoder state per sentence: the beam, the samples, or 1 for greedy search."""
        if self.sampling:
            return self.nbest
        return 1 if self.greedy else self.beam_size
