"""The ``budget`` config group: how a time-limited run (``trainer.max_time``) fits itself to it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# budget.fit's values: none keeps the configured schedule; budget fits it to the forecast updates.
FITS = ("none", "budget")
# budget.early_stopping's values: after_decay holds early stopping until a fitted decay has ended;
# patience lets it stop at any validation, as configured.
STOPPING = ("after_decay", "patience")


@dataclass(frozen=True)
class BudgetSettings:
    """The ``budget`` settings (conf/train.yaml).

    Attributes:
        fit: ``none`` (the configured schedule, warned where the budget is too short for it) or
            ``budget`` (the rate, the averaged weights and validation fitted to the forecast).
        warmup_fraction: the fitted warmup's most, as a fraction of the forecast updates.
        average_fraction: the averaged weights come from this last fraction of them.
        refits: forecasts after the first validation's, where the speed drifted, at most (-1: as
            often as it drifts).
        drift: how far a new forecast must differ (a fraction) to fit again.
        validation_share: the share of the time validation may take.
        early_stopping: ``patience`` (early stopping stops whenever its patience runs out, as before
            the key existed) or ``after_decay`` (it does not cut a decay fitted to the budget:
            :mod:`training.stopping`).
    """

    fit: str = "none"
    warmup_fraction: float = 0.4
    average_fraction: float = 0.2
    refits: int = -1
    drift: float = 0.03
    validation_share: float = 0.1
    early_stopping: str = "patience"

    def __post_init__(self) -> None:
        if self.fit not in FITS:
            raise ValueError(f"budget.fit={self.fit!r} is not one of {', '.join(FITS)}")
        if self.early_stopping not in STOPPING:
            raise ValueError(
                f"budget.early_stopping={self.early_stopping!r} is not one of {', '.join(STOPPING)}"
            )
        for name in ("warmup_fraction", "average_fraction", "drift", "validation_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"budget.{name} must be in (0, 1], not {getattr(self, name)}")
        if self.refits < -1:
            raise ValueError(f"budget.refits must be -1 (no limit) or at least 0, not {self.refits}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BudgetSettings:
        """From the ``budget`` config group (plain values); missing keys take their defaults.

        Raises:
            ValueError: a key that is not one of the group's, naming it, or a bad value.
        """
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"budget: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
        texts = ("fit", "early_stopping")
        typed = {
            k: (str(v) if k in texts else int(v) if k == "refits" else float(v)) for k, v in values.items()
        }
        return cls(**typed)
