"""One step of a search: the models' next-token scores of every live hypothesis, a block at a time.

Greedy search, beam search and sampling (``search.py``, ``sampling.py``) share it: each step feeds
the hypotheses' latest tokens to every model (``state.CachedDecoder.step``), then reduces the
next-token scores, a block of rows at a time (``budget.logit_block_rows``), to the few numbers
per row the search needs: the argmax, the best 2k with their log-probabilities, one draw.

The plain reductions are the textbook ones (``log_softmax(-1).topk(n)``); :class:`SearchKernels`
carries them, and a program may swap in faster ones that compute the same values
(``fastpaths.optimize``: the CPU's block top-k and in-place normaliser, the GPU's attention
backends), as it swaps the model's modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import Tensor

from decoding.budget import logit_block_rows
from decoding.constraints import Constraints, prefix_tensor
from decoding.ensemble import Ensemble, combined_log_probs, members_of
from decoding.state import Stepwise, stepwise
from transformer import Transformer

R = TypeVar("R")


def top_log_probs(logits: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The ``n`` most likely next tokens of each row and their log-probabilities.

    logits: [rows, V] (fp32 or bf16) -> (log_probs fp32, tokens), each [rows, n], best first.
    A kernel may overwrite ``logits`` (the search no longer needs them).
    """
    return logits.float().log_softmax(dim=-1).topk(n, dim=-1)


@dataclass(frozen=True)
class SearchKernels:
    """What a search computes its steps with, where a faster equal exists on some device.

    Attributes:
        top_log_probs: ``(logits [rows, V], n) -> (log_probs fp32, tokens)``, each [rows, n],
            best first, as :func:`top_log_probs`; may overwrite the logits.
        context: made around a whole search (e.g. the attention backends a GPU decodes with).
        name: what they are, for logs.
    """

    top_log_probs: Callable[[Tensor, int], tuple[Tensor, Tensor]] = top_log_probs
    context: Callable[[], AbstractContextManager] = field(default=nullcontext)
    name: str = "plain"


PLAIN = SearchKernels()


@dataclass
class Hypothesis:
    """One output: token ids (no BOS/EOS), its length-normalised score and raw log-probability,
    and, drawn by sampling, which sample of its sentence it is (0 the first; None: searched)."""

    tokens: list[int]
    score: float
    log_prob: float
    sample: int | None = None


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016); 1 when alpha is 0."""
    return ((5.0 + length) / 6.0) ** alpha


def best_tokens(log_probs: Tensor, eos_id: int) -> Tensor:
    """[rows, V] -> [rows] each row's most likely token; EOS where every token is impossible."""
    best, tokens = log_probs.max(dim=-1)
    return tokens.masked_fill_(best == float("-inf"), eos_id)


def max_output_lengths(
    src: Tensor, pad_id: int, a: float, b: int, cap: int, at_least: Tensor | None = None
) -> Tensor:
    """Per sentence, the most tokens to generate: a * source_length + b, at most ``cap``.

    src: [batch, src_len] -> [batch] long; ``at_least``: [batch] lengths the limit must reach
    (a forced prefix's), still at most ``cap``.
    """
    src_len = (src != pad_id).sum(dim=1).float()
    limits = (a * src_len + b).floor().long()
    if at_least is not None:
        limits = torch.maximum(limits, at_least)
    return limits.clamp(min=1, max=cap)


def search_constraints(
    eos_id: int,
    min_len: int,
    no_repeat_ngram: int,
    prefixes: Sequence[Sequence[int]] | None,
    device: torch.device,
) -> Constraints:
    """The :class:`~decoding.constraints.Constraints` of a search's keyword arguments."""
    return Constraints(eos_id, min_len, no_repeat_ngram, prefix_tensor(prefixes, device))


class SearchStep:
    """A search's models with their decoder states, and the next-token scores of each step.

    One model whose search has no constraint that acts after the softmax takes the fast way: its
    logits, made a block of rows at a time, go to ``on_logits`` as they are. Otherwise (an
    ensemble, a prefix, no-repeat n-grams) each block's log-probabilities are combined over the
    models (:func:`~decoding.ensemble.combined_log_probs`), constrained
    (:class:`~decoding.constraints.Constraints`) and go to ``on_log_probs``.

    Args:
        model: a Transformer (or anything :class:`~decoding.state.Stepwise`) or an ``Ensemble``,
            in eval mode.
        src: [n, src_len] source ids, right-padded.
        max_steps: the most decoding steps.
        constraints: what the outputs may not be.
        need_log_probs: always the log-probabilities (sampling reshapes the whole distribution).
    """

    def __init__(
        self,
        model: Transformer | Ensemble | Stepwise,
        src: Tensor,
        max_steps: int,
        constraints: Constraints,
        need_log_probs: bool = False,
    ) -> None:
        models, self.weights = members_of(model)
        self.models = stepwise(models)
        self.states = [m.start(src, max_steps) for m in self.models]
        self.constraints = constraints
        self.fast = len(self.models) == 1 and not (need_log_probs or constraints.need_log_probs)
        self.vocab = self.models[0].cfg.tgt_vocab_size
        self.block = logit_block_rows(src.device, self.vocab)

    def decode(self, tokens: Tensor) -> list[Tensor]:
        """Feeds ``tokens`` [rows] to every model: per model, its decoder output [rows, d_model]."""
        return [m.step(tokens, s) for m, s in zip(self.models, self.states, strict=True)]

    def select(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Every model's ``DecoderState.select``."""
        for state in self.states:
            state.select(rows, sources)

    @property
    def wants_history(self) -> bool:
        """Whether :meth:`scores` needs the rows' outputs so far (no repeated n-grams)."""
        return self.constraints.no_repeat_ngram > 0

    @property
    def wants_sentences(self) -> bool:
        """Whether :meth:`scores` needs each row's sentence (forced prefixes)."""
        return self.constraints.prefixes is not None

    def scores(
        self,
        hidden: list[Tensor],
        t: int,
        on_logits: Callable[[Tensor, slice], R],
        on_log_probs: Callable[[Tensor, slice], R],
        history: Tensor | None = None,
        sentences: Tensor | None = None,
    ) -> list[R]:
        """The reductions of the next-token scores of each block of rows, in row order.

        Args:
            hidden: from :meth:`decode`.
            t: output tokens so far (EOS is banned while ``t < min_len``).
            on_logits: reduces a block's logits [block_rows, V] (fast way; overwritable) and
                its slice of the rows.
            on_log_probs: the same for a block's constrained fp32 log-probabilities.
            history: [rows, t] the rows' outputs so far, where :attr:`wants_history`.
            sentences: [rows] each row's sentence in the batch, where :attr:`wants_sentences`.
        """
        eos_id = self.constraints.eos_id
        banned = t < self.constraints.min_len
        results = []
        for start in range(0, hidden[0].size(0), self.block):
            parts = [h[start : start + self.block] for h in hidden]
            rows = slice(start, start + parts[0].size(0))
            if self.fast:
                logits = self.models[0].logits(parts[0])  # (block_rows, V), in the model's dtype
                if banned:
                    logits[:, eos_id] = float("-inf")
                results.append(on_logits(logits, rows))
                continue
            log_probs = combined_log_probs(self.models, self.weights, parts, banned, eos_id)
            self.constraints.apply(
                log_probs,
                t,
                history[rows] if history is not None else None,
                sentences[rows] if sentences is not None else None,
            )
            results.append(on_log_probs(log_probs, rows))
        return results
