"""What ``train.py`` runs: a recipe of named steps over three objects that own the run's changing state.

The three objects, a folder each:

* ``training.lr``: the learning rate. ``LearningRate`` holds its parts (the shape of ``lr.schedule``,
  a continued schedule's offset, the plateau's scale, a time budget's fitted segments) and its one
  state; ``RateScheduler`` alone writes the optimizer's rate, asked once per update, told once per
  validation (``RateOnValidation``).
* ``training.start``: where a run starts. ``start_point`` makes one ``StartPoint`` (fresh, resumed,
  initialised from a checkpoint's weights, or tested) from the one read of its checkpoint: the
  vocabulary, the model, what ``finetune.reset`` carries on, the state Lightning restores.
* ``training.budget``: a time-limited run. Its forecast of the updates ``trainer.max_time`` holds,
  and (``budget.fit: budget``) the rate, the averaged weights and validation fitted to them.

The recipe: ``training.pipeline.train(cfg)`` reads as its steps (settings, start, data, config,
module, trainer, fit, average, test); ``training.callbacks`` chooses the callbacks;
``training.module.TranslationModule`` is the Lightning module (loss and optimisation), with
validation and the test stage in ``training.evaluation``; ``training.average`` averages checkpoints
(also ``python3 -m training.average``); ``training.moved_keys`` refuses config keys under names
they no longer have.

Translating a checkpoint is the ``translation`` package's work. Neither package imports the other:
what both need (the checkpoint reader and inference fields, the metrics, the attention heatmaps) is
in ``common``.
"""
