"""The recipe fitted to a budget (training/recipe/): the keys the command line gives stay, the rule
reads the map's curves, and a run applies, records and keeps what it chose."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.toy_text import write_toy_corpus
from tests.training.test_pipeline import compose_config, toy_overrides
from training.config import model_group, plain
from training.lr import RateSettings
from training.pipeline import train
from training.recipe import fit as recipe_fit
from training.recipe import rule
from training.recipe.fit import SHAPE_KEYS, describe, given_keys, shape_keys
from training.recipe.forecast import Forecast, forecast
from training.recipe.rule import Regime, ShapeMap, cannot_win, choose, predicted_bleu
from training.recipe.timing import Timing, time_updates

REGIMES = (
    Regime(3.0, 0.1, 2048, 2e-3, "linear", 10),
    Regime(float("inf"), 0.2, 4096, 1e-3, "linear", 20),
)
TOY_MAP = {
    "tiny": ShapeMap(((1.0, 10.0), (4.0, 20.0), (16.0, 25.0)), REGIMES),
    "compact": ShapeMap(((1.0, 6.0), (4.0, 18.0), (16.0, 30.0)), REGIMES),
}
SHAPES = {name: {key: i for key in SHAPE_KEYS} for i, name in enumerate(TOY_MAP)}


def test_the_keys_the_command_line_sets_are_given():
    overrides = ["model=tiny", "model.dropout=0.3", "+lr.peak=1e-3", "trainer.max_time=00:00:05:00", "seed=2"]
    assert given_keys(overrides) == frozenset({*SHAPE_KEYS, "model.dropout", "lr.peak"})
    assert given_keys(["data.max_tokens=2048", "lr.schedule=cosine"]) == {"data.max_tokens", "lr.schedule"}
    assert given_keys(["experiment=multi30k_de_en"]) == frozenset()


@settings(max_examples=200, deadline=None)
@given(epochs=st.floats(0.0, 100.0))
def test_the_curve_is_read_between_its_points_and_never_extrapolated_upwards(epochs):
    curve = TOY_MAP["compact"].curve
    value = predicted_bleu(curve, epochs)
    assert 0.0 <= value <= max(b for _, b in curve)
    if epochs >= curve[-1][0]:
        assert value == curve[-1][1]
    for e, b in curve:
        assert predicted_bleu(curve, e) == pytest.approx(b)
    assert predicted_bleu(curve, epochs) <= predicted_bleu(curve, epochs * 1.5) + 1e-9  # more is no worse


def _forecasts(tiny_epochs: float, compact_epochs: float) -> list[Forecast]:
    return [Forecast("tiny", 4096, 0.1, int(tiny_epochs * 100), tiny_epochs),
            Forecast("compact", 4096, 0.3, int(compact_epochs * 100), compact_epochs)]  # fmt: skip


def test_the_shape_with_the_best_bleu_at_its_epochs_is_chosen_with_its_regimes_settings():
    short = choose(_forecasts(3.0, 1.0), SHAPES, frozenset(), TOY_MAP)  # tiny ~17.9 against compact 6
    assert (
        short.shape == "tiny" and short.settings["model.dropout"] == 0.2 and short.settings["lr.peak"] == 1e-3
    )
    long = choose(_forecasts(48.0, 16.0), SHAPES, frozenset(), TOY_MAP)  # tiny 25 against compact 30
    assert long.shape == "compact" and long.settings["data.max_tokens"] == 4096
    small = choose(_forecasts(2.0, 0.5), SHAPES, frozenset(), TOY_MAP)
    assert small.settings["data.max_tokens"] == 2048 and small.settings["model.dropout"] == 0.1
    assert "tiny" in small.why and "compact" in small.why


def test_a_given_key_is_kept_and_not_set():
    choice = choose(_forecasts(2.0, 0.5), SHAPES, frozenset({"model.dropout", "lr.peak"}), TOY_MAP)
    assert "model.dropout" not in choice.settings and "lr.peak" not in choice.settings
    assert choice.kept == ("lr.peak", "model.dropout")


def test_a_later_candidate_that_cannot_win_even_at_the_fastest_ones_epochs_is_not_timed():
    """tiny, timed first, gets 3 epochs (~17.9 by its curve); compact, no faster, would reach at
    most its curve's ~15.5 there: not timed. At 48 epochs of tiny (25) compact could reach 30: timed."""
    short = [Forecast("tiny", 4096, 0.1, 300, 3.0)]
    reason = cannot_win("compact", short, TOY_MAP)
    assert (
        reason is not None
        and "compact not timed" in reason
        and "~15.5" in reason
        and "tiny's ~17.9" in reason
    )
    assert cannot_win("compact", [Forecast("tiny", 4096, 0.1, 4800, 48.0)], TOY_MAP) is None
    assert cannot_win("off_the_map", short, TOY_MAP) is None
    timed = []

    def timer(name):  # noqa: ANN001
        timed.append(name)
        return Timing(0.1, 1.0, 3)

    names = ["tiny", "compact"]
    skip_short = lambda name, timings: cannot_win(name, short, TOY_MAP)  # noqa: E731
    assert list(recipe_fit.time_candidates(names, timer, 100.0, skip=skip_short)) == ["tiny"]
    assert timed == ["tiny"]
    long = [Forecast("tiny", 4096, 0.1, 4800, 48.0)]
    skip_long = lambda name, timings: cannot_win(name, long, TOY_MAP)  # noqa: E731
    assert list(recipe_fit.time_candidates(names, timer, 100.0, skip=skip_long)) == names
    assert timed == ["tiny", "tiny", "compact"]
    shapes = {name: {key.split(".", 1)[1]: model_group(name)[key.split(".", 1)[1]] for key in SHAPE_KEYS}
              for name in ("compact", "small")}  # fmt: skip
    timing = {"compact": Timing(0.1, 1.0, 3)}
    assert recipe_fit.no_faster(shapes["small"], timing, shapes)  # listed after compact: may be skipped
    assert not recipe_fit.no_faster(shapes["compact"], {"small": timing["compact"]}, shapes)  # always timed


def test_a_candidate_is_timed_first_at_its_first_regimes_batch_size():
    """compact at 1,024 tokens (its regime below 15 epochs; timed again at 2,048 where the forecast
    passes 15), small at its 4,096 whatever the run's; a size given on the command line, or a shape
    off the map, at the run's."""
    assert recipe_fit.first_size(rule.MAP["compact"], 4096, frozenset()) == 1024
    assert recipe_fit.first_size(rule.MAP["small"], 2048, frozenset()) == 4096
    assert recipe_fit.first_size(rule.MAP["compact"], 3000, frozenset({"data.max_tokens"})) == 3000
    assert recipe_fit.first_size(None, 3000, frozenset()) == 3000


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


def _overrides(toy, extra: list[str]) -> list[str]:
    budget = [
        "trainer.max_time=00:00:00:30",
        "trainer.max_epochs=100",
        "recipe.fit=budget",
        "budget.fit=budget",
        # 15 of the 30 s: both toy candidates timed, the second unless the first took 7.5 s (at 10 s of
        # budget a loaded 2-core Zen 3 once took the 2.5 s that dropped compact)
        "recipe.timing_share=0.5",
    ]
    return [*toy_overrides(*toy), "test=false", "recipe.shapes=[tiny,compact]", *budget, *extra]


def test_a_run_times_its_candidates_applies_records_and_keeps_the_choice(toy, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(rule, "MAP", TOY_MAP)
    extra = ["model.dropout=0.3"]  # given on the command line: kept
    overrides = _overrides(toy, extra)
    overrides.remove("model=tiny")  # the shape left to the fit
    overrides.append("trainer.max_steps=4")  # the fit forecasts the budget; training stops sooner
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        results = train(compose_config(overrides, out), overrides=["recipe.fit=budget", *extra])
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe fit: tiny")]
    assert (
        len(said) == 1
        and "tiny:" in said[0]
        and "compact:" in said[0]
        and "kept as given: model.dropout" in said[0]
    )
    recipe = results["recipe"]
    assert recipe["shape"] in TOY_MAP and recipe["kept"] == ["model.dropout"]
    assert {f["shape"] for f in recipe["forecasts"]} == {"tiny", "compact"}
    config = yaml.safe_load((out / "config.yaml").read_text().split("\n", 1)[1])
    assert config["recipe"]["chosen"] == recipe["settings"] and config["model"]["dropout"] == 0.3
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    for key, value in recipe["settings"].items():
        group, name = key.split(".")
        assert config[group][name] == value, key
        if group == "model":
            assert last["hyper_parameters"]["model"][name] == value, key
    assert json.loads((out / "results.json").read_text())["recipe"] == recipe


def test_a_resumed_run_keeps_its_recipe_and_times_nothing(toy, tmp_path, monkeypatch, caplog):
    """The resumed command is the first's: the experiment's own settings differ from what the fit
    chose, and the resume takes the checkpoint's choice rather than refusing them or fitting again."""
    monkeypatch.setattr(rule, "MAP", TOY_MAP)
    overrides = _overrides(toy, ["checkpoint.every_n_updates=2"])
    overrides.remove("model=tiny")
    first = tmp_path / "first"
    results = train(compose_config([*overrides, "trainer.max_steps=2"], first), overrides=[])
    chosen = results["recipe"]["settings"]
    ckpt = first / "checkpoints" / "last.ckpt"
    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed = train(
            compose_config([*overrides, "trainer.max_steps=4", f"ckpt_path={ckpt}"], tmp_path / "b"),
            overrides=[],
        )
    said = [r.getMessage() for r in caplog.records]
    assert not any(m.startswith("recipe fit: tiny") for m in said)  # nothing timed again
    assert any(m.startswith("resume: the recipe fitted to the budget kept") for m in said)
    assert resumed["ending_update"] == 4 and "recipe" not in resumed
    config = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text().split("\n", 1)[1])
    assert config["recipe"]["chosen"] == chosen
    last = torch.load(ckpt, weights_only=True)  # the resumed run writes on into the first's checkpoints
    assert last["global_step"] == 4
    for key, value in chosen.items():
        group, name = key.split(".")
        if group == "model":
            assert last["hyper_parameters"]["model"][name] == value, key


def test_the_maps_candidates_are_the_default_shapes_and_its_settings_are_valid_config():
    """Every default candidate is on the map and a conf/model file; every curve rises with the epochs
    it was measured at; every regime's settings are values the config takes."""
    cfg = compose_config([])
    assert list(cfg.recipe.shapes) and set(cfg.recipe.shapes) <= set(rule.MAP)
    for name, shape_map in rule.MAP.items():
        assert set(model_group(name)) >= {key.split(".", 1)[1] for key in SHAPE_KEYS}
        epochs = [e for e, _ in shape_map.curve]
        assert epochs == sorted(epochs) and epochs[0] > 0 and len(set(epochs)) == len(epochs)
        assert all(0.0 < b < 100.0 for _, b in shape_map.curve)
        ends = [r.until_epochs for r in shape_map.regimes]
        assert ends == sorted(ends) and ends[-1] == float("inf")
        for regime in shape_map.regimes:
            lr = {**plain(cfg.lr), "peak": regime.peak, "schedule": regime.schedule}
            RateSettings.from_dict({**lr, "warmup_steps": regime.warmup_steps})
            assert 0.0 <= regime.dropout < 1.0 and regime.max_tokens > 0


def _measured(epochs: dict[str, float]) -> list[Forecast]:
    return [Forecast(name, 4096, 1.0, int(e * 100), e) for name, e in epochs.items()]


def test_the_rule_gives_the_maps_best_at_the_budgets_it_measured():
    """Zen 3, 5 minutes (BENCHMARKS.md, "The recipe fitted to a budget"): compact trained 3.0 epochs
    (36.07 BLEU), small 1.56 (6.08): compact, with the settings of its best run (dropout 0). At 20
    minutes (compact 11.5 epochs, 40.47 with dropout 0.1 against 38.15 without; small ~6): compact
    with dropout 0.1. Where the budget holds the small model's 33 epochs (a Zen 5's 30 minutes,
    41.84), the small model as tuned."""
    shapes = {name: shape_keys(model_group(name)) for name in rule.MAP}
    short = choose(_measured({"compact": 3.0, "small": 1.56}), shapes, frozenset(), rule.MAP)
    assert short.shape == "compact"
    assert (short.settings["model.dropout"], short.settings["data.max_tokens"]) == (0.0, 1024)
    assert (short.settings["lr.peak"], short.settings["lr.schedule"]) == (2e-3, "linear")
    assert short.settings["model.d_model"] == model_group("compact")["d_model"]
    twenty = choose(_measured({"compact": 11.5, "small": 6.0}), shapes, frozenset(), rule.MAP)
    assert twenty.shape == "compact" and twenty.settings["model.dropout"] == 0.1
    assert (twenty.settings["data.max_tokens"], twenty.settings["lr.peak"]) == (1024, 2e-3)
    # 20 minutes on a Zen 5: compact trained 26.6 epochs (41.24 at dropout 0.2, 40.77 at 0.1), small
    # 23.0 (41.54): small; compact alone there, with dropout 0.2
    zen5 = choose(_measured({"compact": 26.6, "small": 23.0}), shapes, frozenset(), rule.MAP)
    assert zen5.shape == "small" and "compact ~41.2" in zen5.why
    alone = choose(_measured({"compact": 26.6}), shapes, frozenset(), rule.MAP)
    assert alone.shape == "compact" and alone.settings["model.dropout"] == 0.2
    # from 15 epochs compact trains 2,048-token batches (a Zen 5's 14 minutes: 42.23 against 40.97)
    assert alone.settings["data.max_tokens"] == 2048
    long = choose(_measured({"compact": 100.0, "small": 33.0}), shapes, frozenset(), rule.MAP)
    assert long.shape == "small"
    # 2 hours on a Zen 5: medium's 65.6 epochs at dropout 0.3 reached 41.32, below small's 41.84
    two_hours = choose(
        _measured({"compact": 300.0, "small": 150.0, "medium": 65.6}), shapes, frozenset(), rule.MAP
    )
    assert two_hours.shape == "small" and "medium ~41.3" in two_hours.why
    # 30 minutes on a Zen 5: medium's 16.6 epochs reached 38.93, small's 33 41.45-41.84
    thirty = choose(
        _measured({"compact": 40.0, "small": 33.0, "medium": 16.6}), shapes, frozenset(), rule.MAP
    )
    assert thirty.shape == "small" and "medium ~38.9" in thirty.why
    assert (long.settings["model.dropout"], long.settings["data.max_tokens"], long.settings["lr.peak"]) == (
        0.2,
        4096,
        1e-3,
    )


def test_no_candidate_is_forecast_more_epochs_than_trainer_max_epochs():
    """A budget that holds 300 epochs of a run that trainer.max_epochs ends at 30: the rule reads
    the map at 30, and says so; without a limit (None, -1) the budget's epochs stand."""
    capped = forecast("small", 4096, 0.01, 3000.0, 100, max_epochs=30)
    assert (capped.updates, capped.epochs, capped.ended_by) == (3000, 30.0, "trainer.max_epochs=30")
    for limit in (None, -1, 4000):
        free = forecast("small", 4096, 0.01, 3000.0, 100, max_epochs=limit)
        assert (free.updates, free.epochs, free.ended_by) == (300_000, 3000.0, "trainer.max_time")
    choice = choose([capped], {"small": SHAPES["compact"]}, frozenset(), {"small": TOY_MAP["compact"]})
    assert choice.forecasts[0]["ended_by"] == "trainer.max_epochs=30"
    assert "trainer.max_epochs=30 ends it before the budget" in describe(choice, [capped])


class _GpuData:
    """What the fit reads of a run's data: 120 batches an epoch at 4,096 tokens, as many tokens at
    any other size; each batch stands for its size (``max_tokens``)."""

    src_vocab_size = tgt_vocab_size = 64
    settings = SimpleNamespace(batches=SimpleNamespace(max_tokens=4096))

    def train_loader_at(self, max_tokens: int) -> list[int]:
        return [max_tokens] * (120 * 4096 // max_tokens)


@pytest.mark.parametrize(
    ("max_time", "seconds", "shape", "epochs", "timings"),
    [
        # 8 minutes at an H100's pace: both shapes reach the 30 epochs trainer.max_epochs allows,
        # where the small model's curve (~41.7) passes compact's (40.5): small, as the CPUs tuned it.
        # compact is timed twice: at 1,024 tokens, then at its 2,048 from 15 epochs.
        ("00:00:08:00", {"compact": 0.010, "small": 0.015}, "small", {"compact": 30.0, "small": 30.0}, 3),
        # 2 minutes on a slower GPU: compact 11.25 epochs (~40.4); small, even at those epochs ~37.5,
        # is not timed: compact, dropout 0.1.
        ("00:00:02:00", {"compact": 0.08, "small": 0.12}, "compact", {"compact": 11.25}, 1),
    ],
)
def test_the_gpu_experiment_fits_the_recipe_by_the_same_rule_at_the_gpus_speed(
    monkeypatch, caplog, max_time, seconds, shape, epochs, timings
):
    """experiment=multi30k_de_en_gpu fits its recipe to the budget: each candidate is timed on
    CUDA (here a stand-in timer, so that the choice runs on the CPU), and the rule reads the map at
    the epochs the GPU's speed gives, at most trainer.max_epochs."""
    cfg = compose_config(["experiment=multi30k_de_en_gpu", f"trainer.max_time={max_time}"])
    assert cfg.recipe.fit == "budget" and cfg.trainer.max_epochs == 30
    names = {model_group(name)["d_model"]: name for name in cfg.recipe.shapes}
    devices = []

    def timer(model, batches, precision, device, warmup=1):  # noqa: ANN001
        devices.append(device)  # the same tokens a second at every batch size
        return Timing(seconds[names[model["d_model"]]] * batches[0] / 4096, 1.0, len(batches) - 1)

    monkeypatch.setattr(recipe_fit, "time_updates", timer)
    with caplog.at_level(logging.INFO, logger="training.recipe.fit"):
        choice = recipe_fit.fit_to_budget(cfg, _GpuData(), "bf16-mixed", 0.1, frozenset())
    assert devices == ["cuda"] * timings
    assert {f["shape"]: f["epochs"] for f in choice.forecasts} == pytest.approx(epochs, rel=2e-3)
    regime = rule.settings_for(rule.MAP[shape], epochs[shape])
    assert choice.shape == shape and choice.settings["model.dropout"] == regime.dropout
    assert (choice.settings["data.max_tokens"], choice.settings["lr.schedule"]) == (
        regime.max_tokens,
        regime.schedule,
    )
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe fit:")]
    chosen = [line for line in said if "Chosen:" in line]
    assert len(chosen) == 1 and f"Chosen: {shape}," in chosen[0]
    skipped = [name for name in cfg.recipe.shapes if name not in epochs]
    assert [line.split()[2] for line in said if "not timed" in line] == skipped


def _toy_batches(n: int, rows: int = 3, length: int = 5) -> list[dict[str, torch.Tensor]]:
    """``n`` batches of random ids (no padding), each of another length: a new shape each."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(4, 20, (rows, length + i), generator=generator)
        out.append({"src": ids, "tgt_in": ids, "tgt_out": ids})
    return out


def test_time_updates_times_the_updates_after_its_warmup():
    """The fit's timing (time_shape: the batches twice, the second pass timed) times exactly the
    second pass; a warm-up that leaves nothing to time is refused, naming the counts."""
    model = {"src_vocab_size": 20, "tgt_vocab_size": 20, "d_model": 8, "n_heads": 2, "n_encoder_layers": 1}
    model.update(n_decoder_layers=1, d_ff=16, dropout=0.0)
    batches = _toy_batches(3)
    timing = recipe_fit.time_shape(model, batches, "32-true", "cpu")
    assert timing.updates == 3 and timing.seconds_per_update > 0
    assert time_updates(model, batches, warmup=2).updates == 1
    for warmup in (0, 3):
        with pytest.raises(ValueError, match=f"3 batches leave none to time after warmup={warmup}"):
            time_updates(model, batches, warmup=warmup)


class _SizedData:
    """A run's data at 4,096-token batches: 100 an epoch, as many tokens at any other size; each
    batch stands for its size."""

    settings = SimpleNamespace(batches=SimpleNamespace(max_tokens=4096))

    def __init__(self) -> None:
        self.cut: list[int] = []

    def train_loader_at(self, max_tokens: int) -> list[int]:
        self.cut.append(max_tokens)
        return [max_tokens] * (100 * 4096 // max_tokens)


@pytest.mark.parametrize(
    ("given", "budget_s", "timed", "epochs", "chosen"),
    [
        # one: all its regimes train at 1,024 tokens, timed there only; at twice 4,096's seconds per
        # token it gets half the epochs (10 s at 0.1 s per 4,096 tokens would be 100 updates, 1 epoch):
        # ~15 BLEU by its curve. two: timed at its first regime's 2,048 (below 3 epochs), as fast per
        # token as 4,096: 1 epoch, ~20, chosen.
        (frozenset(), 10.0, [("one", 1024), ("two", 2048)], {"one": 0.5, "two": 1.0}, "two"),
        # 40 s: two's 4 epochs at 2,048 pass its first regime: timed again at 4,096, its next one's.
        (frozenset(), 40.0, [("one", 1024), ("two", 2048), ("two", 4096)], {"one": 2.0, "two": 4.0}, "one"),
        # data.max_tokens given: every candidate is timed at the run's batch size, once; read there,
        # one's 1 epoch gives ~30.
        (frozenset({"data.max_tokens"}), 10.0, [("one", 4096), ("two", 4096)], dict(one=1.0, two=1.0), "one"),
    ],
)
def test_each_candidate_is_timed_at_the_batch_size_it_would_train_at(
    monkeypatch, given, budget_s, timed, epochs, chosen
):
    """The forecast of a candidate is its speed at its regime's batch size: compact's 1,024-token
    batches train fewer tokens a second than the run's 4,096, and read at 4,096 its epochs were
    over-counted (a Zen 5's 5 minutes: 7.8 forecast, 6.4 trained)."""
    one = (Regime(float("inf"), 0.1, 1024, 2e-3, "linear", 10),)
    two = (Regime(3.0, 0.0, 2048, 1e-3, "linear", 10), Regime(float("inf"), 0.2, 4096, 1e-3, "linear", 10))
    recipe_map = {"one": ShapeMap(((1.0, 30.0),), one), "two": ShapeMap(((1.0, 20.0),), two)}
    # two the smaller (timed whatever one's forecast); seconds per 4,096 tokens by batch size
    shapes = {name: {key: size for key in SHAPE_KEYS} for name, size in (("one", 2), ("two", 1))}
    per_token, seen = {1024: 2.0, 2048: 1.0, 4096: 1.0}, []

    def timer(model, batches, precision, device, warmup=1):  # noqa: ANN001
        seen.append(("one" if model["d_model"] == 2 else "two", batches[0]))
        return Timing(0.1 * per_token[batches[0]] * batches[0] / 4096, 1.0, len(batches) - 1)

    monkeypatch.setattr(recipe_fit, "time_updates", timer)
    data, model = _SizedData(), {"src_vocab_size": 8, "tgt_vocab_size": 8}
    choice, found = recipe_fit.fit_recipe(
        model, shapes, data, "32-true", "cpu", budget_s, 1.0, 0.0, given, recipe_map, clock=lambda: 0.0
    )
    assert seen == timed and sorted(set(data.cut)) == sorted({size for _, size in timed})
    assert {f.shape: f.epochs for f in found} == pytest.approx(epochs)
    assert {f.shape: f.max_tokens for f in found} == dict(timed)
    assert choice.shape == chosen
