"""What the recipe fit chose: the settings, as config keys, and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Choice:
    """The recipe for a budget.

    Attributes:
        shape: the model shape (a ``conf/model`` name), or None where the run's stands.
        settings: the config keys it sets, by dotted name (``model.d_model``, ``model.dropout``,
            ``data.max_tokens``, ``lr.peak``, ``lr.schedule``, ``lr.warmup_steps``, ...).
        kept: the keys given on the command line, which it leaves as they are.
        why: one sentence for the log and ``results.json``.
        forecasts: per candidate, what the budget held (for ``results.json``).
    """

    shape: str | None
    settings: dict[str, Any]
    kept: tuple[str, ...] = ()
    why: str = ""
    forecasts: list[dict[str, Any]] = field(default_factory=list)

    def as_results(self) -> dict[str, Any]:
        """What ``results.json`` records under ``recipe``."""
        return {
            "shape": self.shape,
            "settings": dict(self.settings),
            "kept": list(self.kept),
            "why": self.why,
            "forecasts": list(self.forecasts),
        }
