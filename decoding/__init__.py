"""Decoding: the searches over the model, between the model and its two users.

The model (``transformer/``) computes the decoder's output from a source, a target prefix and its
self-attention states; everything that turns that into translations lives here, as fairseq's
``sequence_generator.py`` sits beside its models and torchtune's ``generation/`` beside
``modules/``:

* ``config.py``: :class:`DecodingConfig`, the one config object (greedy, beam or sampling, the
  length penalty and limits, the constraints, n-best);
* ``service.py``: :class:`Searcher`, what validation, the test stage and ``translate.py`` call:
  sources batched under the device's token budget (``budget.py``), searched, returned in order;
* ``search.py`` (greedy and beam search), ``sampling.py``, ``step.py`` (one step's scores, a block
  of rows at a time, and the kernels a device may swap), ``constraints.py`` (minimum length,
  no repeated n-grams, forced prefixes), ``ensemble.py`` (several models searched as one),
  ``scoring.py`` (forced decoding), ``alignment.py`` (the cross-attention of given outputs, forced,
  for word alignments);
* ``lexical_constraints.py`` and ``constrained_search.py``: terminology, target subword sequences
  every output contains, met by lexically constrained beam search with dynamic beam allocation;
* ``state.py`` and ``kv_cache.py``: what a search keeps between steps, the model's caches with
  their storage, and the sources shared by a sentence's hypotheses.

Nothing here is device-specific beyond the budgets' sizes: faster kernels for a device come from
``fastpaths.optimize``, applied by the program that decodes.
"""

from decoding.config import DecodingConfig, SamplingConfig, SearchSettings
from decoding.service import Searcher
from decoding.step import PLAIN, Hypothesis, SearchKernels

__all__ = [
    "PLAIN",
    "DecodingConfig",
    "Hypothesis",
    "SamplingConfig",
    "SearchKernels",
    "SearchSettings",
    "Searcher",
]
