"""The rule that turns a budget's forecasts into a recipe, written from the map's figures.

The map (BENCHMARKS.md, "The recipe fitted to a budget"; ``bench/budget_map.py``) trained the
Multi30k de->en recipe for budgets from 5 minutes to 2 hours, for three model shapes and the
settings around them, and measured test BLEU. :data:`MAP` holds, for each shape, the BLEU its best
runs reached against the epochs they trained (``(epochs, BLEU)``, fewest first), and the settings
those runs had. The rule:

1. each candidate shape's BLEU at the epochs the budget holds for it is read off its curve (linear
   between the map's points in log epochs; past the last point, the last point's BLEU: nothing is
   extrapolated upwards);
2. the shape with the highest is chosen (on a tie, the first: the smaller);
3. its settings are the map's for that many epochs (:func:`settings_for`).

A key given on the command line is never changed (:class:`~training.recipe.choice.Choice` keeps
it); the others fit around it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from training.recipe.choice import Choice
from training.recipe.forecast import Forecast


@dataclass(frozen=True)
class Regime:
    """The settings the map found best up to some number of epochs.

    Attributes:
        until_epochs: this regime holds for forecasts of fewer epochs than this.
        dropout: ``model.dropout``.
        max_tokens: ``data.max_tokens``.
        peak: ``lr.peak``.
        schedule: ``lr.schedule`` (``linear``: decaying to 0 at the budget's end, fitted by
            ``budget.fit``; ``inverse_sqrt``: the paper's, kept where the budget holds it).
        warmup_steps: ``lr.warmup_steps`` (``budget.fit`` shortens it to a share of the forecast).
    """

    until_epochs: float
    dropout: float
    max_tokens: int
    peak: float
    schedule: str
    warmup_steps: int


@dataclass(frozen=True)
class ShapeMap:
    """What the map measured of one shape.

    Attributes:
        curve: ``(epochs, test BLEU)`` of its best run at each budget, fewest epochs first.
        regimes: its best settings by epochs, fewest first; the last holds for any more.
    """

    curve: tuple[tuple[float, float], ...]
    regimes: tuple[Regime, ...]


def predicted_bleu(curve: tuple[tuple[float, float], ...], epochs: float) -> float:
    """The BLEU ``curve`` gives at ``epochs``: linear in log epochs between its points, its first
    point's below them (scaled down to 0 at no epochs), its last's beyond them."""
    if epochs <= 0:
        return 0.0
    xs = [math.log(e) for e, _ in curve]
    x = math.log(epochs)
    if x <= xs[0]:
        return curve[0][1] * epochs / curve[0][0]
    if x >= xs[-1]:
        return curve[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = (xs[i - 1], curve[i - 1][1]), (xs[i], curve[i][1])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def settings_for(shape_map: ShapeMap, epochs: float) -> Regime:
    """The settings of the first regime that holds for ``epochs``."""
    for regime in shape_map.regimes:
        if epochs < regime.until_epochs:
            return regime
    return shape_map.regimes[-1]


def cannot_win(name: str, timed: list[Forecast], recipe_map: dict[str, ShapeMap]) -> str | None:
    """Why candidate ``name`` need not be timed, or None where it might win.

    The candidates are timed smallest first, so ``name`` trains no more epochs than the fastest
    timed so far (``timed``): where its curve at those epochs is no higher than the best timed
    candidate's forecast, it cannot be chosen, and timing it would only take from the budget.
    """
    scored = [
        (predicted_bleu(recipe_map[f.shape].curve, f.epochs), f.shape) for f in timed if f.shape in recipe_map
    ]
    if name not in recipe_map or not scored:
        return None
    best, leader = max(scored)
    most = max(f.epochs for f in timed)
    ceiling = predicted_bleu(recipe_map[name].curve, most)
    if ceiling > best:
        return None
    return (
        f"{name} not timed: even at the {most:.1f} epochs of the fastest candidate the map gives it "
        f"~{ceiling:.1f} BLEU, against {leader}'s ~{best:.1f}"
    )


def choose(
    forecasts: list[Forecast],
    shapes: dict[str, dict[str, Any]],
    given: frozenset[str],
    recipe_map: dict[str, ShapeMap],
) -> Choice:
    """The recipe for the forecasts of the timed shapes.

    Args:
        forecasts: what the budget holds for each timed shape (at the batch size it was timed at).
        shapes: each shape's model keys (``model.d_model``, ...), from its ``conf/model`` file.
        given: the keys the command line set, which stay.
        recipe_map: the map (:data:`MAP`, or a test's).

    Returns:
        The :class:`Choice`: the chosen shape's keys and its regime's settings, less the given keys.
    """
    scored = [
        (predicted_bleu(recipe_map[f.shape].curve, f.epochs), -i, f)
        for i, f in enumerate(forecasts)
        if f.shape in recipe_map
    ]
    if not scored:
        raise ValueError(
            f"recipe.shapes: none of {[f.shape for f in forecasts]} is on the map ({sorted(recipe_map)})"
        )
    bleu, _, best = max(scored)
    regime = settings_for(recipe_map[best.shape], best.epochs)
    settings: dict[str, Any] = {**shapes[best.shape]}
    settings.update(
        {
            "model.dropout": regime.dropout,
            "data.max_tokens": regime.max_tokens,
            "lr.peak": regime.peak,
            "lr.schedule": regime.schedule,
            "lr.warmup_steps": regime.warmup_steps,
        }
    )
    kept = tuple(sorted(k for k in settings if k in given))
    others = "; ".join(
        f"{f.shape} ~{predicted_bleu(recipe_map[f.shape].curve, f.epochs):.1f}"
        for f in forecasts
        if f is not best and f.shape in recipe_map
    )
    why = (
        f"the budget holds {best.epochs:.1f} epochs of {best.shape}, where the map's {best.shape} reaches "
        f"~{bleu:.1f} BLEU" + (f" (against {others})" if others else "")
    )
    held = [
        {
            "shape": f.shape,
            "max_tokens": f.max_tokens,
            "seconds_per_update": f.seconds_per_update,
            "updates": f.updates,
            "epochs": f.epochs,
            "ended_by": f.ended_by,
        }
        for f in forecasts
    ]
    return Choice(best.shape, {k: v for k, v in settings.items() if k not in given}, kept, why, held)


# The map (BENCHMARKS.md, "The recipe fitted to a budget"): each shape's best settings, and the test
# BLEU its runs reached with them against the epochs they trained. Measured on a 2-core AMD EPYC
# Zen 3 (family 25 model 1, AVX2, fp32), 2026-11-29, one run each, `python bench/budget_map.py run
# MINUTES NAME -- OVERRIDES` at 563c4c3 (the small model's 30 minutes: the README's main job at
# 99ded36), and on a Zen 5 (family 26, AVX512-BF16, bf16 autocast), 2026-12-06, the README's main
# job and dc2bd7b's at 5, 20 and 30 minutes (57c3919); test_2016_flickr, beam 5.
MAP: dict[str, ShapeMap] = {
    # d192, 2+2 layers, 1,024-token batches, peak 2e-3 decaying linearly to 0 at the budget's end:
    # 36.07 in 5 minutes (3.0 epochs) and 38.38 in 10 (5.29) with dropout 0; 40.47 in 20 (11.5) and
    # 40.54 in 30 (17.2: the README's main job at 29e50ce, which chose it) with dropout 0.1, where
    # dropout 0 reached 38.15 in 20 (its validation loss lowest after epoch 6, 1.766,
    # and rising to 1.956; at 0.1 still falling at epoch 9, 1.574). At 5 minutes each choice against
    # the next best: dropout 0 against 0.1, 29.37 against 27.94 (2,048 tokens, peak 1e-3); peak 2e-3
    # against 1e-3, 34.76 against 29.37 (4e-3: 34.52, no better); 1,024 tokens against 2,048, 36.07
    # against 34.76 (at 1e-3: 33.04 against 29.37). Dropout changes at 6 epochs, where dropout 0's
    # validation loss turned (0.1 from 5 to 11 epochs is not measured). The Zen 5: 39.03 in 6.65
    # epochs (5 minutes, 2026-12-07, 55f1520); at 20 minutes 40.77 in 24.0 with dropout 0.1 (57c3919),
    # its validation loss lowest at epoch 15 and rising after (1.634 to 1.682), and 41.24 in 26.6 with
    # 0.2 (2026-12-07, df90136, `trainer.max_time=00:00:20:00 model=compact model.dropout=0.2`), its
    # validation loss still falling at 25 (1.555): dropout 0.2 from 15 epochs, where 0.1's turned.
    # Its 14 minutes there (625c1e4, the rule's pick: 0.2): 40.52 at length penalty 0.6 in 17.2 epochs,
    # on the Zen 3's 40.54 at 0.1. 2,048-token batches from 15 epochs: a Zen 5's bf16 updates of
    # compact train 1.18x the target tokens a second of 1,024's (16,900 against 14,400 side by side,
    # `python3 bench/recipe_speed.py --batches 24`, 2026-12-07, 4da77a8), a run 1.3x the epochs (the
    # per-update costs outside the model weigh more on small batches): its 14 minutes (2026-12-07,
    # 48b9af2, `trainer.max_time=00:00:14:00 model=compact data.max_tokens=2048 model.dropout=0.2`)
    # 22.4 epochs (5,463 updates) to 42.23 at length penalty 2.5 against 1,024's 40.97 in 17.2, and
    # the README's 14 minutes with this rule (d1eafe6) 41.82 in 23.0 (41.01 at 0.6; the curve keeps
    # the 1,024 points). The larger batch loses nothing at equal epochs either, where a Zen 3's fp32
    # steps (as fast a token at either size: 3.0 epochs in 5 minutes) put it: 17.4 epochs of it in
    # half the updates (4,236, 2026-12-07, 4da77a8, `trainer.max_time=00:00:10:30 model=compact
    # data.max_tokens=2048 model.dropout=0.2`) 41.52 at 2.5 (40.63 at 0.6) against 1,024's 40.97
    # (40.52) in 17.2. The README's 20 minutes (4da77a8, the rule's pick where small was timed at
    # 0.44 s an update): 42.01 in 32.3 (41.26 at 0.6), against small's 41.99 there (095abf6).
    # The Zen 3's 30 minutes with this rule (2026-12-07, f789de0, the README's main job): 19.2 epochs at
    # 2,048 tokens, 42.22 at 2.5 (41.61 at 0.6, 1,024's 40.54 in 17.2); its fp32 steps train 1.02x the
    # tokens a second of 1,024's (`python3 bench/recipe_speed.py --batches 24`), a run 1.12x the epochs.
    "compact": ShapeMap(
        curve=((3.0, 36.07), (5.29, 38.38), (6.65, 39.03), (11.5, 40.47), (17.2, 40.54), (26.6, 41.24)),
        regimes=(
            Regime(6.0, 0.0, 1024, 2e-3, "linear", 600),
            Regime(15.0, 0.1, 1024, 2e-3, "linear", 600),
            Regime(float("inf"), 0.2, 2048, 2e-3, "linear", 600),
        ),
    ),
    # d256, 3+3 layers: the recipe as tuned for ~4,000 updates (dropout 0.2, 4,096 tokens, peak 1e-3,
    # 600 warmup updates, inverse square root, fitted by budget.fit where the budget does not hold
    # it): 6.08 in 5 minutes (1.56 epochs), 17.90 in 10 (3.05), 36.93 in 30 (10.0), 40.11 in 60 (18.9:
    # the README's main job with trainer.max_time=00:01:00:00 at a197204, which chose it). The same
    # recipe's 30 minutes on faster CPUs (BENCHMARKS.md, "Quality"; the issue that asked for this
    # map): 39.68 in 17.2 epochs on a Zen 4 (dc2bd7b), 41.84 in 32.6 on a Zen 5 (416f7cd); the Zen 3's
    # fp32 point lies within 0.1 BLEU of the line between those bf16 ones: by epochs, the CPUs agree.
    # At 5 minutes it loses to compact at equal settings (2,048 tokens, dropout 0.1, peak 1e-3): 17.78
    # in 1.48 epochs against 27.94 in 3.0. The Zen 5 of 2026-12-06: 41.54 in 23.0 epochs (20 minutes;
    # compact there, 24.0 epochs: 40.77), and 41.45 in 33.0 (30 minutes, early stopping: the same
    # run, validation identical to epoch 22; 41.84 in 32.6 the repeat on another host). Not better at
    # 30 minutes (2026-12-07, 1efce37): dropout 0.3, 40.78 in 33.9 (validation loss lower, 1.497 against
    # 1.51); subword regularisation (data.spm_sampling_alpha=0.1 data.spm_sampling_nbest=64), 41.00 in
    # 27.4 (a tenth more pieces a batch: fewer epochs, its validation loss still falling, 1.581).
    # The 20 minutes again with seed=1 data.seed=1 (07d1c51): 40.40 in 23.6, a seed's spread of ~1 BLEU.
    # dc2bd7b's 14 minutes on the Zen 5 (2026-12-07): 39.72 in 15.7 epochs. Label smoothing 0.2 at 20
    # minutes (625c1e4): 41.32 at 0.6 in 23.3 epochs, against 41.54; not a setting of the rule.
    "small": ShapeMap(
        curve=(
            (1.56, 6.08),
            (3.05, 17.90),
            (10.0, 36.93),
            (17.2, 39.68),
            (18.9, 40.11),
            (23.0, 41.54),
            (32.6, 41.84),
        ),
        regimes=(Regime(float("inf"), 0.2, 4096, 1e-3, "inverse_sqrt", 600),),
    ),
    # d384, 4+4 layers (19.6M parameters): 6.27 in 5 minutes (0.74 epochs; Zen 3, 2,048 tokens, dropout
    # 0, a197204); on the Zen 5, 2026-12-07, `python3 train.py experiment=multi30k_de_en recipe.fit=none
    # model=medium model.dropout=0.3 lr.schedule=linear`: 38.93 in 16.6 (30 minutes, df90136, against
    # small's 41.45) and 41.32 in 65.6 (8,068 updates, with trainer.max_time=00:02:00:00
    # trainer.max_epochs=200, f2ce210), its validation loss lowest at epoch 27 (1.505) and rising to
    # 1.667 by 64 even at dropout 0.3: no better than small's 30 minutes at any budget measured, so not
    # a default candidate (recipe.shapes).
    "medium": ShapeMap(
        curve=((0.74, 6.27), (16.6, 38.93), (65.6, 41.32)),
        regimes=(
            Regime(6.0, 0.0, 2048, 1e-3, "linear", 600),
            Regime(float("inf"), 0.3, 4096, 1e-3, "linear", 600),
        ),
    ),
}
