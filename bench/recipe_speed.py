"""How well the recipe fit's few timed updates read a candidate's speed in the run, and how much a
candidate's tokens per second move with the batch size.

    python bench/recipe_speed.py                                  # compact and small, 1,024-4,096 tokens
    python bench/recipe_speed.py --shapes small --max-tokens 4096 --batches 24
    python bench/recipe_speed.py --shapes compact --max-tokens 1024 --fit-batches 4 8 --fit-repeats 6

For each shape (``conf/model``) and each ``data.max_tokens``, on Multi30k de->en's first training
batches as the run cuts them, in the precision ``trainer.precision=auto`` picks, with the threads
the run has (``--threads``):

- ``fit``: the shape's speed as ``recipe.fit=budget`` reads it (:func:`training.recipe.fit.time_shape`:
  its batches twice over, the median of the second pass), timed first in the process as in the run;
  with ``--fit-batches`` and ``--fit-repeats``, read on that many batches (``TIMED_BATCHES`` by
  default), each count on the same successive windows of the batches, the counts alternated, so
  that a shared host's drift reaches each alike: the spread of ``fit / second`` is what each count
  would forecast;
- ``first pass``: the same function over ``--batches`` batches (or the fit's windows', where
  more), each of a shape the process has not trained on (as in a run's first epoch);
- ``second pass``: the same batches again, every shape seen (as in the later epochs).

``fit / second`` is the fit's seconds per update over the run's: above 1, the fit reads the shape
slower than the run will train it, and forecasts it fewer epochs. Tokens per second across batch
sizes is what the fit's conversion from the timed batch to a regime's batch assumes constant.
"""

from __future__ import annotations

import argparse
import logging
import sys
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    ROOT,
    add_json_option,
    environment,
    print_config,
    print_table,
    set_threads,
    write_json,
)


def _datamodule(data_dir: str | None, max_tokens: int):  # noqa: ANN202
    """The de->en recipe's ``TranslationDataModule`` at ``max_tokens``, composed as train.py does."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    overrides = ["experiment=multi30k_de_en", f"data.max_tokens={max_tokens}"]
    if data_dir is not None:
        overrides.append(f"data.data_dir={data_dir}")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    dm = instantiate(cfg.data, run_dir=str(ROOT / "bench" / "results" / "recipe_speed_run"))
    dm.prepare_data()
    dm.setup("fit")
    return cfg, dm


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", default=["compact", "small"], help="conf/model files, in order"
    )
    parser.add_argument(
        "--max-tokens", type=int, nargs="+", default=[4096, 2048, 1024], help="data.max_tokens"
    )
    parser.add_argument(
        "--batches", type=int, default=16, help="batches a pass (after a warm-up one), at least the fit's"
    )
    parser.add_argument(
        "--fit-batches", type=int, nargs="+", default=None, help="batches the fit times (TIMED_BATCHES)"
    )
    parser.add_argument("--fit-repeats", type=int, default=1, help="readings of the fit for each count")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the run's: 2 on this machine)")
    parser.add_argument(
        "--data-dir", default=str(MULTI30K_DIR), help="Multi30k's files (default: the shared copy)"
    )
    add_json_option(parser, "recipe_speed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    set_threads(args.threads)

    from training.config import model_group, plain
    from training.precision import choose_precision
    from training.recipe.fit import TIMED_BATCHES, shape_keys, time_shape, with_shape
    from training.recipe.timing import time_updates

    precision = choose_precision("auto", "cpu").precision
    env = environment(args.threads)
    print_config("recipe_speed", {**env, "precision": precision, "batches": args.batches})
    data_dir = args.data_dir if Path(args.data_dir).is_dir() else None
    counts = args.fit_batches or [TIMED_BATCHES]
    need = max(args.batches, max(counts) * args.fit_repeats)
    results = []
    for max_tokens in args.max_tokens:
        cfg, dm = _datamodule(data_dir, max_tokens)
        batches = list(islice(iter(dm.train_dataloader()), 1 + need))
        base = {**plain(cfg.model), "src_vocab_size": dm.src_vocab_size, "tgt_vocab_size": dm.tgt_vocab_size}
        for shape in args.shapes:
            model = with_shape(base, shape_keys(model_group(shape)))
            fits: dict[int, list[float]] = {k: [] for k in counts}
            for r in range(args.fit_repeats):  # window r of each count starts at the same batch
                for k in counts:
                    window = batches[r * max(counts) : r * max(counts) + k]
                    fits[k].append(time_shape(model, window, precision, "cpu").seconds_per_update)
            first = time_updates(model, batches, precision)  # new shapes
            second = time_updates(model, batches, precision)  # seen ones
            for k, readings in fits.items():
                results.append(
                    {
                        "shape": shape,
                        "max_tokens": max_tokens,
                        "fit_batches": k,
                        "fit_s_per_update": readings,
                        "first_s_per_update": first.seconds_per_update,
                        "second_s_per_update": second.seconds_per_update,
                        "second_tokens_per_s": second.tokens_per_second,
                    }
                )
    rows = []
    for r in results:
        ratios = [f / r["second_s_per_update"] for f in r["fit_s_per_update"]]
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else f"{ratios[0]:.2f}"
        fit = sorted(r["fit_s_per_update"])[len(ratios) // 2]
        rows.append(
            [r["shape"], r["max_tokens"], r["fit_batches"], fit, r["first_s_per_update"],
             r["second_s_per_update"], spread, r["second_tokens_per_s"]]
        )  # fmt: skip
    print_table(
        [
            "shape",
            "max_tokens",
            "fit batches",
            "fit s/update",
            "first pass",
            "second pass",
            "fit / second",
            "tokens/s (second)",
        ],
        rows,
    )
    write_json(
        args.json,
        {
            "environment": env,
            "precision": precision,
            "batches": args.batches,
            "fit_repeats": args.fit_repeats,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
