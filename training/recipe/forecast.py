"""What a time budget holds for each candidate: updates and epochs, from its measured speed.

A candidate (a model shape at a batch size) trains ``tokens_per_second`` target tokens a second on
this machine (:mod:`training.recipe.timing`). The budget, less what the timing itself took and the
share validation will take (``budget.validation_share``), holds ``seconds / seconds_per_update``
updates; an epoch is the training set's updates at that batch size. Where ``trainer.max_epochs``
ends the run first, the forecast is its epochs: the rule reads the BLEU of the epochs the run makes.
(``trainer.max_steps`` is not applied here: its epochs depend on the batch the rule chooses; the
schedule fit, :mod:`training.budget.fit`, applies both once the batch is known.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Forecast:
    """What the budget holds for one candidate.

    Attributes:
        shape: the candidate's model shape (a ``conf/model`` name).
        max_tokens: its batch size, in padded tokens (``data.max_tokens``).
        seconds_per_update: its measured speed at that batch size.
        updates: the updates the budget holds.
        epochs: the same in passes over the training set.
        ended_by: what ends the run first: ``"trainer.max_time"`` (the budget) or
            ``"trainer.max_epochs=N"``.
    """

    shape: str
    max_tokens: int
    seconds_per_update: float
    updates: int
    epochs: float
    ended_by: str = "trainer.max_time"


def forecast(
    shape: str,
    max_tokens: int,
    seconds_per_update: float,
    train_seconds: float,
    updates_per_epoch: int,
    max_epochs: int | None = None,
) -> Forecast:
    """The updates and epochs ``train_seconds`` of training hold for a candidate.

    Args:
        shape: the candidate's shape name.
        max_tokens: its batch size.
        seconds_per_update: its speed at that batch size.
        train_seconds: the budget's seconds left for training (timing and validation taken out).
        updates_per_epoch: the training set's batches at that batch size.
        max_epochs: ``trainer.max_epochs`` (None, 0 or -1: no limit).
    """
    per_epoch = max(updates_per_epoch, 1)
    updates = max(int(train_seconds / max(seconds_per_update, 1e-9)), 0)
    if max_epochs is not None and 0 < max_epochs * per_epoch < updates:
        updates = max_epochs * per_epoch
        return Forecast(
            shape,
            max_tokens,
            seconds_per_update,
            updates,
            float(max_epochs),
            f"trainer.max_epochs={max_epochs}",
        )
    return Forecast(shape, max_tokens, seconds_per_update, updates, updates / per_epoch)
