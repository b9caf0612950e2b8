"""A time-limited run (``trainer.max_time``) and its budget: what it holds, and what is fitted to it.

* :mod:`training.budget.settings`: the ``budget`` config group.
* :mod:`training.budget.forecast`: the updates the budget holds at the measured speed, and the
  warning where they are too few for the configured schedule (``budget.fit: none``).
* :mod:`training.budget.fit`: ``budget.fit: budget``, the learning rate (a part of
  :class:`training.lr.LearningRate`), the averaged weights and validation fitted to the forecast.
* :mod:`training.budget.points`: the updates whose weights are averaged, written as files.
"""

from training.budget.settings import BudgetSettings

__all__ = ["BudgetSettings"]
