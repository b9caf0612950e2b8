"""What ``train.py`` and ``translate.py`` both need, so that neither program's package imports the other's.

``training`` writes checkpoints, scores validation translations and draws attention while it
runs; ``translation`` reads those checkpoints, scores and draws the same way. What both use
lives here, each piece small and free of Lightning and Hydra:

* ``common.checkpoint_fields``: the checkpoint's ``"nmt"`` entry (languages, tokenizers, ids),
  written by training and read by ``translation.checkpoint``.
* ``common.metrics``: sacreBLEU and chrF with their signatures.
* ``common.attention_plot``: attention weights drawn as heatmaps (matplotlib, imported when used).

The decoding token budget both search under is ``data.batching.DECODING_TOKENS``, beside the
batching rule it feeds.
"""
