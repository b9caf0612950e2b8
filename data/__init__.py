"""The data layer: parallel corpora, SentencePiece subwords, token-budget batches.

Modules, one concept each:

* ``data.lines``: text split on ``\\n`` only, in a strict mode (corpora; also streamed in blocks,
  ``iter_line_blocks``) and a lossless mode (translation input), and ``one_line``.
* ``data.atomic``: ``atomic_write``, a file written whole or not at all (checkpoints, averages,
  caches).
* ``data.cache``: cache entries complete or absent, prepared by one process at a time.
* ``data.arrow_pairs``: sentence pairs streamed into Arrow block by block, blank pairs dropped.
* ``data.corpus``: where a parallel corpus is (``CorpusLocation``: languages, hub id or local
  ``{split}.{lang}[.gz]`` files, split names), which source is read, its errors, and local files
  read block by block as ``train`` / ``validation`` / ``test`` splits of ``id, src, tgt``.
* ``data.hub``: a hub dataset's splits read as pairs, block by block.
* ``data.prepared``: ``prepare_corpus``, a corpus streamed into Arrow once, blank training pairs
  dropped, cached and memory-mapped; ``drop_long_pairs``.
* ``data.corpora``: the corpora of a run (``RunCorpora``): the main corpus, the training corpora
  mixed by weight, the validation sets, the tags on their sources.
* ``data.filters``, ``data.mixing``: the training pairs dropped where read; the corpora's weights.
  The filters' parts: ``data.scripts`` (each language's script), ``data.language_id`` (py3langid,
  optional), ``data.overlap`` (the evaluation sets and earlier corpora compared with),
  ``data.piece_lengths`` (lengths in SentencePiece pieces, after tokenization).
* ``data.tokenizer``: the special ids (``PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3``) and
  ``SubwordTokenizer``, which every user encodes with; a run's copies of its models.
* ``data.spm_training``: one SentencePiece model trained, cached by its training text and settings.
* ``data.subword_models``: a run's models (``TokenizerSettings``): given by path, or trained.
* ``data.tokenized``: ``tokenize_split``, whole splits tokenized into memory-mapped Arrow, cached
  by content; ``data.tokenized_pairs``: ``TokenizedPairs``, whole batches gathered from it.
* ``data.sampling``: subword regularisation, training batches segmented afresh.
* ``data.batching``: ``token_budget_batches`` (the one token-budget rule, also the translator's
  through ``longest_first_batches``), ``TokenBucketBatchSampler`` (length buckets, ranks,
  resumable) and the collate functions; ``data.length_buckets``: batches of a few shapes.
* ``data.settings``: the ``data:`` config keys read into those values (``DataSettings``).
* ``data.loading``: ``load_data``, the set-up's steps: read, subwords, tokenize, cut, mix.
* ``data.datamodule``: ``TranslationDataModule``, all of the above behind Lightning, serving batches.

``data.lines`` and ``data.atomic`` are also what ``translation`` and ``training`` read input lines
and write checkpoints with. Nothing is imported here, so ``import data.tokenizer`` does not pull in Lightning.
"""
