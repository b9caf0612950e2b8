"""What ``translate.py`` runs: a trained checkpoint turned into translations, as a Python API.

    from fastpaths.optimize import optimize
    from translation import Translator
    translator = Translator.from_checkpoint("runs/x/checkpoints/averaged.ckpt", device="cpu")
    translator.use(optimize(translator.model, translator.device, "inference"))  # optional: faster
    translator.translate(["Ein Hund rennt über die Wiese."], beam_size=5)

Modules, one concept each:

* ``translation.checkpoint``: the checkpoint contract between training and inference (writing,
  reading, checking every part, one-line ``CheckpointError``).
* ``translation.translator``: ``Translator`` (encode, crop, search through ``decoding.Searcher``,
  decode, in input order), ``SearchOptions`` (``decoding.DecodingConfig``); what it returns
  (``Translation``, ``Score``) in ``translation.results``, the device it runs on checked by
  ``translation.device``, an ensemble's checkpoints by ``translation.ensemble_check``.
* ``translation.workers``: ``WorkerPool``, decoding in single-thread CPU processes.
* ``translation.parts``, ``translation.resume``, ``translation.shards``: a large ``--input`` in
  parts, ``--resume`` and ``--shard`` (and ``python3 -m translation.parts``, the shards merged).
* ``translation.options``, ``translation.usage``, ``translation.inputs``, ``translation.stream``,
  ``translation.pipeline``, ``translation.scoring``, ``translation.outputs``,
  ``translation.console``: what ``translate.py`` runs, one concept each (its options and their
  checks, where lines come from, translating part by part, scoring, the output formats, stderr).
* ``translation.terminology``: ``--constraints``, each line's lexical constraints after its tabs,
  and the lines they could not be met in.
* ``translation.metrics``: sacreBLEU and chrF with their signatures (``common.metrics``).
* ``translation.alignment``: word alignments of translations (``Translator.align``,
  ``--alignment-output``): subwords to words, the links, fast_align's ``i-j`` format.
* ``translation.attention_plot``: cross-attention heatmaps of chosen lines (matplotlib, imported
  when asked for).
* ``translation.export``: ``python3 -m translation.export``, a checkpoint as a CTranslate2 or Hugging
  Face folder (the optional extra ``.[export]``).

Input lines are read by ``data.lines`` in its lossless mode (every line gives exactly one output
line), the reader the corpora use in its strict mode.

Neither Lightning nor Hydra is imported here, nor ``training`` (what ``train.py`` runs), which
does not import this package either: what both need is in ``common``.
"""

from translation.checkpoint import CheckpointError
from translation.translator import SearchOptions, Translation, Translator

__all__ = ["CheckpointError", "SearchOptions", "Translation", "Translator"]
