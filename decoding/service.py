"""The one way a model is decoded: what validation, the test stage and ``translate.py`` call.

:class:`Searcher` holds a model (or an ensemble) in eval mode with its special ids and its
:class:`~decoding.step.SearchKernels`, and decodes subword sources with a
:class:`~decoding.config.DecodingConfig`: greedy search, beam search or sampling, chosen by the
config. :meth:`Searcher.search_ids` batches the sources longest first under the device's token
budget (``budget.py``), searches each batch (in this process or in worker processes), and
returns the hypotheses in input order; empty sources never reach the model. A fix or a speed-up
of the search reaches all three of its users at once, and validation decodes as fast as
``translate.py`` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from data.batching import longest_first_batches
from decoding.budget import default_max_tokens, hypothesis_widths
from decoding.config import DecodingConfig
from decoding.constrained_search import constrained_beam_search
from decoding.ensemble import Ensemble
from decoding.sampling import sample
from decoding.search import beam_search, greedy_search
from decoding.step import PLAIN, Hypothesis, SearchKernels
from transformer import Transformer

# One batch to search: src [batch, src_len] with EOS, right-padded; the config; BOS and EOS ids;
# per sentence its forced target prefix, or None; the kernels; per sentence its lexical
# constraints (target id sequences), or None: a batch of sentences with constraints is searched
# by ``constrained_search.py``.
SearchJob = tuple[
    Tensor, DecodingConfig, int, int, "list[list[int]] | None", SearchKernels, "list[list[list[int]]] | None"
]


def search_batch(model: Transformer | Ensemble, job: SearchJob) -> list[list[Hypothesis]]:
    """One batch's search, in this process or as a worker's job (``translation.workers``).

    Returns:
        Per sentence, up to ``config.nbest`` hypotheses, best first (NaN scores for greedy search).
    """
    src, config, bos_id, eos_id, prefixes, kernels, constraints = job
    common = dict(
        bos_id=bos_id,
        eos_id=eos_id,
        max_len_a=config.max_len_a,
        max_len_b=config.max_len_b,
        min_len=config.min_len,
        no_repeat_ngram=config.no_repeat_ngram,
        prefixes=prefixes,
    )
    # Inference mode, not only no_grad: no version counters or view tracking on the ~1,000 small
    # tensor operations of every decoding step; the same kernels, so the same outputs.
    with torch.inference_mode(), kernels.context():
        if constraints is not None:
            _check_constrained(config)
            return constrained_beam_search(
                model,
                src,
                constraints=constraints,
                ordered=config.constraints_order == "ordered",
                beam_size=config.beam_size,
                nbest=config.nbest,
                alpha=config.alpha,
                **common,
            )
        if config.search == "greedy":
            return [[Hypothesis(out, math.nan, math.nan)] for out in greedy_search(model, src, **common)]
        if config.search == "sampling":
            return sample(
                model, src, config=config.sampling_config, nsamples=config.nbest, alpha=config.alpha, **common
            )
        return beam_search(
            model,
            src,
            beam_size=config.beam_size,
            nbest=config.nbest,
            alpha=config.alpha,
            kernels=kernels,
            **common,
        )


def _check_constrained(config: DecodingConfig) -> None:
    """Lexical constraints are met by beam search only (``constrained_search.py``)."""
    if config.search != "beam":
        raise ValueError(f"lexical constraints need beam search: drop {config.search}=True")


class Pool(Protocol):
    """Processes that run jobs on their own copies of the model (``translation.workers.WorkerPool``)."""

    def imap_unordered(
        self, fn: Callable[[Any, SearchJob], list[list[Hypothesis]]], items: Iterable[SearchJob]
    ) -> Iterator[tuple[int, list[list[Hypothesis]]]]: ...


class Searcher:
    """A model searched as every user of it searches (module docstring).

    Args:
        model: a Transformer, or an :class:`~decoding.ensemble.Ensemble`, in eval mode on its device.
        bos_id, eos_id: target begin/end-of-sentence ids.
        kernels: the search's step kernels (``fastpaths.optimize`` gives the device's faster ones).
    """

    def __init__(
        self, model: Transformer | Ensemble, bos_id: int, eos_id: int, kernels: SearchKernels = PLAIN
    ) -> None:
        self.model = model
        self.bos_id, self.eos_id = bos_id, eos_id
        self.kernels = kernels

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def batch(self, sources: Sequence[list[int]]) -> Tensor:
        """Sources (ids without EOS) plus EOS, right-padded: [batch, longest + 1] on the device."""
        pad_id = self.model.cfg.pad_id
        width = max(len(s) for s in sources) + 1
        rows = [list(s) + [self.eos_id] + [pad_id] * (width - len(s) - 1) for s in sources]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def search(
        self, src: Tensor, config: DecodingConfig, prefixes: list[list[int]] | None = None
    ) -> list[list[Hypothesis]]:
        """One batch: ``src`` [batch, src_len] with EOS, right-padded -> per sentence its hypotheses."""
        return search_batch(self.model, (src, config, self.bos_id, self.eos_id, prefixes, self.kernels, None))

    def search_ids(
        self,
        sources: Sequence[list[int]],
        config: DecodingConfig,
        max_tokens: int | None = None,
        prefixes: Sequence[list[int]] | None = None,
        progress: Callable[[int], None] | None = None,
        pool: Pool | None = None,
        constraints: Sequence[list[list[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """Searches subword sources in batches of at most ``max_tokens`` padded hypothesis tokens.

        Args:
            sources: ``n`` id lists without EOS (each within the model's positions).
            config: how to search.
            max_tokens: budget per batch of sentences * hypotheses per sentence * longest source
                (EOS included); None: the device's (``budget.default_max_tokens``).
            prefixes: ``n`` target id lists each output starts with ([] forces nothing); None: none.
            progress: called with the number of sentences finished after each batch.
            pool: worker processes that search the batches; None searches here.
            constraints: per source, the target id sequences its outputs must contain, in
                ``config.constraints_order`` ([]: none; beam search only). The sources with
                constraints are batched apart from the others, which are searched as without any.

        Returns:
            ``n`` lists of up to ``config.nbest`` hypotheses, best first, in input order; an empty
            list for an empty source (the model never sees it) and for a source whose constraints
            were not all met within its length limit.
        """
        if prefixes is not None and len(prefixes) != len(sources):
            raise ValueError(f"{len(prefixes)} prefixes for {len(sources)} sources")
        if constraints is not None and len(constraints) != len(sources):
            raise ValueError(f"constraints for {len(constraints)} lines, but {len(sources)} sources")
        budget = default_max_tokens(self.device) if max_tokens is None else max_tokens
        results: list[list[Hypothesis]] = [[] for _ in sources]
        todo = [i for i, s in enumerate(sources) if s]
        constrained = [] if constraints is None else [i for i in todo if constraints[i]]
        if constrained:
            _check_constrained(config)
            todo = [i for i in todo if not constraints[i]]
        plain = self._batches(sources, todo, config, budget)
        batches = plain + self._batches(sources, constrained, config, budget)
        jobs = (
            (
                self.batch([sources[i] for i in indices]),
                config,
                self.bos_id,
                self.eos_id,
                None if prefixes is None else [list(prefixes[i]) for i in indices],
                self.kernels,
                None if b < len(plain) or constraints is None else [list(constraints[i]) for i in indices],
            )
            for b, indices in enumerate(batches)
        )
        if pool is None:
            found_per_batch = enumerate(search_batch(self.model, job) for job in jobs)
        else:
            found_per_batch = pool.imap_unordered(search_batch, list(jobs))
        for b, found in found_per_batch:
            for i, hyps in zip(batches[b], found, strict=True):
                results[i] = hyps
            if progress is not None:
                progress(len(batches[b]))
        return results

    @staticmethod
    def _batches(
        sources: Sequence[list[int]], indices: list[int], config: DecodingConfig, budget: int
    ) -> list[list[int]]:
        """The sources ``indices`` in batches, longest first, under ``budget`` hypothesis tokens."""
        widths = hypothesis_widths([len(sources[i]) for i in indices], config.hypotheses)
        return [[indices[j] for j in batch] for batch in longest_first_batches(widths, budget)]
