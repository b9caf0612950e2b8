"""The learning rate: one object that alone sets the optimizer's rate.

* :mod:`training.lr.rate`: :class:`LearningRate`, its parts (shape, continued offset, plateau,
  budget-fitted segments) and its one ``state_dict``; :class:`RateSettings`, the ``lr`` config group.
* :mod:`training.lr.shapes`: the shapes (inverse square root, cosine, linear, constant, plateau).
* :mod:`training.lr.fitted`: segments fitted to a time budget's forecast end.
* :mod:`training.lr.plateau`: the scale lowered where validation stalls.
* :mod:`training.lr.scheduler`: how the trainer drives it, once per update and once per validation.
"""

from training.lr.rate import LearningRate, RateSettings
from training.lr.scheduler import RateOnValidation, RateScheduler

__all__ = ["LearningRate", "RateOnValidation", "RateScheduler", "RateSettings"]
