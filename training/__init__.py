"""What ``train.py`` runs: the Lightning module, the Hydra-driven pipeline and what they write.

* ``training.module``: ``TranslationModule`` (loss, optimisation, validation BLEU, test search).
* ``training.pipeline``: ``train(cfg)``, what ``python train.py`` does with the composed config.
* ``training.selection``: the validation metric (of which validation set) that chooses the best
  checkpoint and drives early stopping.
* ``training.schedule``: the inverse-square-root learning-rate schedule.
* ``training.averaging``: averaging the last epoch checkpoints.
* ``training.plots``: ``learning_curve.png``.

Translating a checkpoint is the ``translation`` package's work. Neither package imports the other:
what both need (the checkpoint's inference fields, the metrics, the attention heatmaps) is in
``common``.
"""
