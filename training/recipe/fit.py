"""The recipe fitted to a time budget (``recipe.fit: budget``): the shape, dropout, batch, rate and
schedule chosen for the updates this machine gets.

With ``trainer.max_time`` set, the run times each candidate model shape (``recipe.shapes``, the
``conf/model`` files) for a few updates on its first batches (:mod:`training.recipe.timing`, at
most ``recipe.timing_share`` of the budget), forecasts the updates and epochs each would get
(:mod:`training.recipe.forecast`), and applies what the rule written from the map gives for them
(:mod:`training.recipe.rule`). A key given on the command line is never changed: it stays, and the
rest fit around it (a ``model=...`` fixes the shape, ``model.dropout=...`` the dropout, and so on).
The choice is written into the config (``recipe.chosen``), so that ``config.yaml``, every
checkpoint and ``results.json`` hold it and a resumed run keeps it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

from omegaconf import DictConfig

from training.budget.forecast import max_time_seconds
from training.config import model_group, plain
from training.recipe import rule
from training.recipe.choice import Choice
from training.recipe.forecast import Forecast, forecast
from training.recipe.rule import ShapeMap, cannot_win, choose, settings_for
from training.recipe.timing import Timing, time_updates

logger = logging.getLogger(__name__)

# The model keys that make a shape (a conf/model file's sizes).
SHAPE_KEYS = (
    "model.d_model",
    "model.n_heads",
    "model.n_encoder_layers",
    "model.n_decoder_layers",
    "model.d_ff",
)
# The batches each candidate is timed on, twice: the first pass warms up, the second is timed.
TIMED_BATCHES = 4
# Every key the fit may set.
RECIPE_KEYS = (*SHAPE_KEYS, "model.dropout", "data.max_tokens", "lr.peak", "lr.warmup_steps", "lr.schedule")

# An override's key: ``model.dropout=0.1``, ``+lr.peak=...``, ``model=compact`` (a group).
_OVERRIDE = re.compile(r"^[+~]{0,2}([A-Za-z_][\w.]*)(@[\w.:]+)?=")


def given_keys(overrides: list[str]) -> frozenset[str]:
    """The recipe keys the command line sets (a ``model=`` group choice sets the shape's)."""
    given: set[str] = set()
    for override in overrides:
        match = _OVERRIDE.match(override)
        if match is None:
            continue
        key = match.group(1)
        if key == "model":
            given.update(SHAPE_KEYS)
        elif key in RECIPE_KEYS:
            given.add(key)
        elif key in ("lr", "data", "model"):  # a whole group replaced: every key of it given
            given.update(k for k in RECIPE_KEYS if k.startswith(key + "."))
    return frozenset(given)


class BatchesAt:
    """The run's first training batches, and the batches an epoch holds, as each batch size would
    cut them (``datamodule.train_loader_at``), each cut once."""

    def __init__(self, datamodule: Any) -> None:
        self._datamodule = datamodule
        self._cut: dict[int, tuple[list[Any], int]] = {}

    def _at(self, max_tokens: int) -> tuple[list[Any], int]:
        if max_tokens not in self._cut:
            loader = self._datamodule.train_loader_at(max_tokens)
            self._cut[max_tokens] = (list(islice(iter(loader), TIMED_BATCHES)), len(loader))
        return self._cut[max_tokens]

    def first(self, max_tokens: int) -> list[Any]:
        """The first ``TIMED_BATCHES`` training batches at ``max_tokens``."""
        return self._at(max_tokens)[0]

    def per_epoch(self, max_tokens: int) -> int:
        """The training set's batches at ``max_tokens``."""
        return self._at(max_tokens)[1]


def time_shape(model: dict[str, Any], batches: list[Any], precision: str, device: str) -> Timing:
    """One candidate's speed as the fit reads it: ``batches`` (``TIMED_BATCHES`` of the run's) twice
    over, the second pass timed (:func:`training.recipe.timing.time_updates`)."""
    return time_updates(model, batches * 2, precision, device, warmup=len(batches))


def time_candidates(
    names: list[str],
    timer: Callable[[str], Timing],
    allowed_s: float,
    clock: Callable[[], float] = time.perf_counter,
    skip: Callable[[str, dict[str, Timing]], str | None] = lambda name, timings: None,
) -> dict[str, Timing]:
    """Each candidate's speed, in the order given, while the timing stays within ``allowed_s``
    (the first candidate is always timed: the run's own shape, where the command line fixed it).

    Args:
        names: the candidates' names.
        timer: times updates of one candidate, given its name (:func:`training.recipe.timing.time_updates`
            on the run's batches).
        allowed_s: the seconds the timing may take.
        clock: seconds, monotonic.
        skip: given a later candidate's name and the timings so far, why it need not be timed
            (:func:`training.recipe.rule.cannot_win`), or None.
    """
    start, timings = clock(), {}
    for name in names:
        if timings and clock() - start > allowed_s * len(timings) / len(names):
            logger.warning("recipe fit: timing %s would pass recipe.timing_share; not a candidate", name)
            continue
        reason = skip(name, timings) if timings else None  # the first is always timed
        if reason is not None:
            logger.info("recipe fit: %s", reason)
            continue
        timings[name] = timer(name)
    return timings


def no_faster(model: dict[str, Any], timed: dict[str, Timing], models: dict[str, dict[str, Any]]) -> bool:
    """Whether ``model`` is at least as large as every timed candidate in each shape key (width,
    depth, feed-forward size): then it trains no more epochs than the fastest of them, which is what
    :func:`training.recipe.rule.cannot_win` reads; a smaller one listed later is always timed."""
    keys = [key.split(".", 1)[1] for key in SHAPE_KEYS]
    return all(model[key] >= models[name][key] for name in timed for key in keys)


def forecasts(
    timings: dict[str, Timing],
    sizes: dict[str, tuple[int, int]],
    train_seconds: float,
    max_epochs: int | None = None,
) -> list[Forecast]:
    """What ``train_seconds`` hold for each timed shape at the batch size it was timed at
    (``sizes``: name -> its ``data.max_tokens`` and the training set's batches at it), up to
    ``max_epochs`` (``trainer.max_epochs``; None: no limit)."""
    return [
        forecast(name, sizes[name][0], t.seconds_per_update, train_seconds, sizes[name][1], max_epochs)
        for name, t in timings.items()
    ]


def first_size(shape_map: ShapeMap | None, run_tokens: int, given: frozenset[str]) -> int:
    """The batch size to time a candidate at first: its map's first regime's (the fewest epochs'), or
    the run's (``data.max_tokens`` given on the command line, or a shape off the map).
    :func:`fit_recipe` times it again at the regime the forecast falls in, where that trains at
    another size (compact: 1,024 tokens, 2,048 from 15 epochs; a bf16 step at 2,048 trains more
    tokens a second, so the epochs it gets there are at least those forecast at 1,024)."""
    if shape_map is None or "data.max_tokens" in given:
        return run_tokens
    return shape_map.regimes[0].max_tokens


def shape_keys(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model`` config's shape, by dotted key (``model.d_model``, ...)."""
    return {key: model[key.split(".", 1)[1]] for key in SHAPE_KEYS}


def with_shape(model: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """``model`` (the run's model settings) with a candidate's shape keys (``model.d_model``, ...)."""
    return {**model, **{key.split(".", 1)[1]: value for key, value in keys.items()}}


def configured_shape(model: dict[str, Any], shapes: dict[str, dict[str, Any]]) -> str | None:
    """The name of the candidate whose shape keys ``model`` (the run's ``model`` config) has."""
    for name, keys in shapes.items():
        if all(model.get(key.split(".", 1)[1]) == value for key, value in keys.items()):
            return name
    return None


def fit_recipe(
    model: dict[str, Any],
    shapes: dict[str, dict[str, Any]],
    datamodule: Any,
    precision: str,
    device: str,
    budget_s: float,
    timing_share: float,
    validation_share: float,
    given: frozenset[str],
    recipe_map: dict[str, ShapeMap] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    max_epochs: int | None = None,
) -> tuple[Choice, list[Forecast]]:
    """The recipe for a budget of ``budget_s`` seconds on this machine.

    Args:
        model: the run's model settings, vocabulary sizes included.
        shapes: each candidate's shape keys (dotted, ``model.d_model`` ...), in the order to time
            them; where the command line fixed the shape, only the run's own is timed.
        datamodule: the run's data, set up (its first training batches are timed on).
        precision, device: the run's.
        budget_s: ``trainer.max_time`` in seconds.
        timing_share: the share of it the timing may take (``recipe.timing_share``).
        validation_share: the share validation will take (``budget.validation_share``).
        given: the recipe keys the command line set.
        recipe_map: the map the rule reads; None: the rule's (:data:`training.recipe.rule.MAP`).
        clock: seconds, monotonic.
        max_epochs: ``trainer.max_epochs``: no candidate is forecast more epochs than it.
    """
    if given.issuperset(SHAPE_KEYS):
        own = configured_shape(model, shapes)
        shapes = {own: shapes[own]} if own is not None else {}
        if not shapes:
            raise ValueError(
                "recipe.fit=budget: the command line's model is none of recipe.shapes, whose map the rule "
                "reads: choose one of them (model=NAME), or set recipe.fit=none"
            )
    # A pass over them warms up (allocations, the heap, kernel choice for each shape), the median of
    # a second pass is the speed: the median of three after one warm-up update read a Zen 5's bf16
    # speed 1.56-1.72x too slow at 4,096 tokens (bench/recipe_speed.py), and chose compact at 20
    # minutes where small as configured reached 0.8 BLEU more (BENCHMARKS.md, "The recipe fitted to
    # a budget"). Each candidate is timed at the batch size it would train at: compact's 1,024-token
    # batches train fewer tokens a second than 4,096-token ones, and timed at the run's 4,096 a Zen 5's
    # 5 minutes were forecast 7.8 epochs of it where the run trained 6.4.
    batches = BatchesAt(datamodule)
    models = {name: with_shape(model, keys) for name, keys in shapes.items()}
    start, used_map = clock(), rule.MAP if recipe_map is None else recipe_map
    run_tokens = int(datamodule.settings.batches.max_tokens)
    sizes: dict[str, tuple[int, int]] = {}  # name -> its batch size, and the batches an epoch at it

    def held(timed: dict[str, Timing]) -> list[Forecast]:
        train_s = max(budget_s - (clock() - start), 0.0) * (1.0 - validation_share)
        return forecasts(timed, sizes, train_s, max_epochs)

    def time_at(name: str, max_tokens: int) -> Timing:
        timed, sizes[name] = batches.first(max_tokens), (max_tokens, batches.per_epoch(max_tokens))
        return time_shape(models[name], timed, precision, device)

    def timer(name: str) -> Timing:
        size = first_size(used_map.get(name), run_tokens, given)
        timing = time_at(name, size)
        if name in used_map and "data.max_tokens" not in given:  # its regime's size, where another
            wanted = settings_for(used_map[name], held({name: timing})[0].epochs).max_tokens
            timing = timing if wanted == size else time_at(name, wanted)
        return timing

    timings = time_candidates(
        list(models),
        timer,
        timing_share * budget_s,
        clock,
        skip=lambda name, timed: (
            cannot_win(name, held(timed), used_map) if no_faster(models[name], timed, models) else None
        ),
    )
    found = held(timings)
    return choose(found, shapes, given, used_map), found


def fit_to_budget(
    cfg: DictConfig, datamodule: Any, precision: str, validation_share: float, given: frozenset[str]
) -> Choice:
    """:func:`fit_recipe` for a run's config (``recipe``, ``model``, ``trainer``), its data set up;
    the choice said in one log line."""
    model = {**plain(cfg.model), "src_vocab_size": datamodule.src_vocab_size}
    model["tgt_vocab_size"] = datamodule.tgt_vocab_size
    shapes = {name: shape_keys(model_group(name)) for name in cfg.recipe.shapes}
    device = "cuda" if str(cfg.trainer.get("accelerator", "cpu")) in ("gpu", "cuda") else "cpu"
    budget_s = max_time_seconds(plain(cfg.trainer)["max_time"])
    share = float(cfg.recipe.timing_share)
    max_epochs = plain(cfg.trainer).get("max_epochs")
    choice, found = fit_recipe(
        model, shapes, datamodule, precision, device, budget_s, share, validation_share, given,
        max_epochs=None if max_epochs is None else int(max_epochs),
    )  # fmt: skip
    logger.info("%s", describe(choice, found))
    return choice


def describe(choice: Choice, forecast_list: list[Forecast]) -> str:
    """The log line: what each candidate would get, what was chosen and why."""
    held = "; ".join(
        f"{f.shape}: {f.seconds_per_update:.2f} s per {f.max_tokens:,}-token update, ~{f.updates:,} updates "
        f"({f.epochs:.1f} epochs"
        + ("" if f.ended_by == "trainer.max_time" else f": {f.ended_by} ends it before the budget")
        + ")"
        for f in forecast_list
    )
    settings = ", ".join(f"{k}={v}" for k, v in choice.settings.items() if k not in SHAPE_KEYS)
    kept = f"; kept as given: {', '.join(choice.kept)}" if choice.kept else ""
    return f"recipe fit: {held}. Chosen: {choice.shape}, {settings}{kept}: {choice.why}"
