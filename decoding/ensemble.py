"""Several models searched as one: the weighted mean of their next-token log-probabilities.

An ensemble of M models with weights w_1..w_M (summing to 1) scores a next token y as

    log p(y | x, y_<t) = sum_m w_m log p_m(y | x, y_<t)

at every step, each model with its own encoder output and decoder caches: a log-linear
combination, as Marian's and OpenNMT-py's default (fairseq, and Sockeye by default, average the
probabilities instead). The members may differ in size and attention mechanism; they
must share the target vocabulary and the special ids, which :class:`Ensemble` checks. The search
(``search.py``, ``sampling.py``) and forced scoring (``scoring.py``) take an ``Ensemble`` wherever
they take one ``Transformer``. Cost: M times one model's, and M sets of caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from transformer import Transformer, TransformerConfig


class Ensemble(nn.Module):
    """Models with one target vocabulary, searched together.

    Args:
        models: two or more Transformers (one is allowed: it searches as itself).
        weights: one non-negative weight per model, normalised to sum to 1; default equal.

    Raises:
        ValueError: no models, weights that do not fit, or members whose target vocabulary
            size, pad id or source vocabulary size differ.
    """

    def __init__(self, models: Sequence[Transformer], weights: Sequence[float] | None = None) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        weights = [1.0] * len(models) if weights is None else [float(w) for w in weights]
        if len(weights) != len(models):
            raise ValueError(f"{len(weights)} weights for {len(models)} models")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"ensemble weights must be non-negative with a positive sum, not {weights}")
        first = models[0].cfg
        for i, model in enumerate(models[1:], start=2):
            for key in ("src_vocab_size", "tgt_vocab_size", "pad_id"):
                if getattr(model.cfg, key) != getattr(first, key):
                    raise ValueError(
                        f"model {i} has {key}={getattr(model.cfg, key)}, model 1 {getattr(first, key)}: "
                        "an ensemble's models must share their vocabularies"
                    )
        self.members = nn.ModuleList(models)
        total = sum(weights)
        self.weights = [w / total for w in weights]

    @property
    def cfg(self) -> TransformerConfig:
        """The first member's config, with the smallest ``max_positions`` of all members."""
        return replace(self.members[0].cfg, max_positions=min(m.cfg.max_positions for m in self.members))

    def num_parameters(self, trainable_only: bool = True) -> int:
        return sum(m.num_parameters(trainable_only) for m in self.members)


def members_of(model: Transformer | Ensemble) -> tuple[list[Transformer], list[float]]:
    """The models a search runs and their weights: an ensemble's, or ``model`` alone with weight 1.

    Anything a search can step (``state.Stepwise``: ``start``, ``step``, ``logits``, ``cfg``)
    counts as one model.
    """
    if isinstance(model, Ensemble):
        return list(model.members), list(model.weights)
    return [model], [1.0]


def combined_log_probs(
    models: Sequence[Transformer],
    weights: Sequence[float],
    hidden: Sequence[Tensor],
    eos_banned: bool,
    eos_id: int,
) -> Tensor:
    """The ensemble's next-token log-probabilities of a block of rows.

    Args:
        models, weights: from :func:`members_of` (each model, or what steps it: ``logits`` is used).
        hidden: per model, its decoder output of the rows: [rows, d_model_m].
        eos_banned: EOS is not a possible outcome (the minimum length is not reached): each model's
            distribution is renormalised without it, as one model's search does.
        eos_id: the EOS id.

    Returns:
        [rows, V] fp32: ``sum_m w_m log_softmax(logits_m)``.
    """
    total: Tensor | None = None
    for model, weight, h in zip(models, weights, hidden, strict=True):
        logits = model.logits(h).float()  # (rows, V)
        if eos_banned:
            logits[:, eos_id] = float("-inf")
        log_probs = torch.log_softmax(logits, dim=-1)
        if len(models) > 1:
            log_probs = log_probs.mul_(weight)
        total = log_probs if total is None else total.add_(log_probs)
    assert total is not None
    if eos_banned:  # -inf * weight and sums of -inf stay -inf; a 0 weight must not make NaN
        total[:, eos_id] = float("-inf")
    return total
