"""The data layer: parallel corpora, SentencePiece subwords, token-budget batches.

Modules, one concept each:

* ``data.corpus``: a parallel corpus (hub id or local ``{split}.{lang}[.gz]`` files) as a
  ``datasets.DatasetDict`` with ``train`` / ``validation`` / ``test`` splits of ``id, src, tgt``.
* ``data.tokenizer``: the special ids (``PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3``),
  ``SubwordTokenizer``, SentencePiece training cached by content, cached tokenization.
* ``data.batching``: ``TokenBucketBatchSampler`` (token budget, length buckets, ranks,
  resumable) and ``collate_batch``.
* ``data.datamodule``: ``TranslationDataModule``, all of the above behind Lightning.

Nothing is imported here, so ``import data.tokenizer`` does not pull in Lightning.
"""
