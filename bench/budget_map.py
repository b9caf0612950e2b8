"""The map of the recipe by time budget: Multi30k de->en test BLEU against the minutes of training.

    python bench/budget_map.py run 5 S4-d1 -- model=compact data.max_tokens=4096 model.dropout=0.1
    python bench/budget_map.py table            # every run so far, by budget
    python bench/budget_map.py plot docs/budget_map.png
    python bench/budget_map.py --record bench/results/budget_map_zen5.json table   # another machine's map

``run MINUTES NAME -- OVERRIDES`` trains ``python3 train.py experiment=multi30k_de_en`` with
``trainer.max_time`` set to MINUTES and the recipe fit off (``recipe.fit=none``: the settings are
the ones given), into ``bench/results/budget_map/<NAME>/``, then records what it reached
(``results.json``: test BLEU, updates, epochs, the schedule fitted to the budget, peak memory) with
the overrides, the machine and the commit, in ``bench/results/budget_map.json`` (``--record PATH``:
another file, one per machine, as the budget buys each machine different epochs). Runs are one after
the other on an otherwise idle machine: the budget is wall-clock time.

``table`` prints every run by budget and shape; ``plot`` draws BLEU against budget, one curve per
shape (each budget's best run of that shape), the frontier (the best of all) marked. The map's
figures, and the rule written from them (``training/recipe/rule.py``), are in BENCHMARKS.md,
"The recipe fitted to a budget".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, environment, print_table  # noqa: E402

RUNS = ROOT / "bench" / "results" / "budget_map"
RECORD = ROOT / "bench" / "results" / "budget_map.json"
# The model keys that make a shape, read from each run's config.yaml.
SHAPE_KEYS = ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff")


def _records() -> list[dict]:
    return json.loads(RECORD.read_text()) if RECORD.exists() else []


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip()


def _shape_of(config: dict) -> str:
    model = config["model"]
    d, layers = model["d_model"], f"{model['n_encoder_layers']}+{model['n_decoder_layers']}"
    return f"d{d} {layers} ff{model['d_ff']}"


def _epochs(out: Path, updates: int | None) -> tuple[float | None, list[float]]:
    """The passes over the training set a run's ``updates`` made (an epoch's updates: the first
    validation's), and its validation BLEU at each epoch's end, from its ``logs/metrics.csv``."""
    import csv

    with open(out / "logs" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/bleu")]
    per_epoch = int(rows[0]["step"]) + 1 if rows else None
    epochs = round(updates / per_epoch, 2) if updates and per_epoch else None
    return epochs, [round(float(r["val/bleu"]), 2) for r in rows]


def run(minutes: float, name: str, overrides: list[str]) -> dict:
    """Trains one configuration for ``minutes`` and records it."""
    seconds = int(round(minutes * 60))
    max_time = f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    out = RUNS / name
    command = [
        sys.executable, "train.py", "experiment=multi30k_de_en", f"trainer.max_time={max_time}",
        "recipe.fit=none", f"hydra.run.dir={out}", "trainer.enable_progress_bar=false", *overrides,
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return record(minutes, name, out, overrides, round(time.perf_counter() - start))


def record(
    minutes: float,
    name: str,
    out: Path,
    overrides: list[str],
    wall_s: int | None = None,
    commit: str | None = None,
) -> dict:
    """Records the run in ``out`` (trained for ``minutes`` with ``overrides``, at ``commit``: None,
    this checkout's) under ``name``: a run of :func:`run`, or another run of the recipe (the
    README's main job, say)."""
    import yaml

    results = json.loads((out / "results.json").read_text())
    config = yaml.safe_load((out / "config.yaml").read_text())
    fit = results.get("schedule_fit") or {}
    epochs, val_bleu = _epochs(out, results.get("ending_update"))
    rate = config.get("lr") or config["optimizer"]  # before the lr group (dc2bd7b): optimizer.lr
    env = environment(2)
    entry = {
        "name": name,
        "minutes": minutes,
        "overrides": overrides,
        "shape": _shape_of(config),
        "max_tokens": config["data"]["max_tokens"],
        "dropout": config["model"]["dropout"],
        "lr": rate["peak"] if "lr" in config else rate["lr"],
        "schedule": rate["schedule"],
        "bleu": results.get("test/bleu"),
        "bleu_lc": results.get("test/bleu_lc"),
        "chrf": results.get("test/chrf"),
        "updates": results.get("ending_update"),
        "epochs": epochs,
        "val_bleu_by_epoch": val_bleu,
        "ending": results.get("ending"),
        "fitted": {k: fit.get(k) for k in ("forecast_updates", "warmup", "schedule", "decay_end", "fitted")},
        "peak_mib": results.get("peak_resident_mib"),
        "wall_s": wall_s,
        "machine": f"{env['cpu']} ({env['cpu_id']}, {env['torch_cpu_capability']}, "
        f"native bf16 {env['cpu_native_bf16']})",
        "load_average_after": env["load_average"],
        "commit": commit or _commit(),
        "date": time.strftime("%Y-%m-%d"),
    }
    records = [r for r in _records() if r["name"] != name] + [entry]
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(records, indent=1) + "\n")
    return entry


def table() -> None:
    rows = [
        [r["minutes"], r["name"], r["shape"], r["max_tokens"], r["dropout"], r["lr"], r["schedule"],
         r["updates"], r.get("epochs", "-"), f"{r['bleu']:.2f}" if r["bleu"] is not None else "-",
         r["ending"]]
        for r in sorted(_records(), key=lambda r: (r["minutes"], -(r["bleu"] or 0)))
    ]  # fmt: skip
    header = ["min", "name", "shape", "tokens", "dropout", "lr", "schedule", "updates", "epochs", "BLEU"]
    header.append("ending")
    print_table(header, rows)


def plot(path: Path) -> None:
    """BLEU against budget: each shape's best run at each budget, the recipe as configured (the runs
    with no overrides) dashed, the frontier marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in _records() if r["bleu"] is not None]
    shapes = sorted({r["shape"] for r in records})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    frontier: dict[float, tuple[float, str]] = {}
    for shape in shapes:
        best: dict[float, float] = {}
        for r in records:
            if r["shape"] == shape:
                best[r["minutes"]] = max(best.get(r["minutes"], 0.0), r["bleu"])
        xs = sorted(best)
        ax.plot(xs, [best[x] for x in xs], marker="o", label=shape)
        for x in xs:
            if best[x] > frontier.get(x, (-1.0, ""))[0]:
                frontier[x] = (best[x], shape)
    configured = sorted((r["minutes"], r["bleu"]) for r in records if not r["overrides"])
    if configured:
        minutes, bleu = [m for m, _ in configured], [b for _, b in configured]
        ax.plot(minutes, bleu, ls="--", color="grey", marker="x", label="the recipe as configured")
    xs = sorted(frontier)
    ax.plot(
        xs, [frontier[x][0] for x in xs], color="black", lw=2.5, alpha=0.35, label="frontier (best of all)"
    )
    for x in xs:
        ax.annotate(f"{frontier[x][0]:.1f}", (x, frontier[x][0]), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)  # fmt: skip
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel("training budget, minutes (trainer.max_time)")
    ax.set_ylabel("test BLEU (test_2016_flickr, beam 5)")
    machine = records[0]["machine"] if records else ""
    ax.set_title(f"Multi30k de->en: BLEU by budget and model shape\n{machine}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    global RECORD
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--record", type=Path, default=RECORD, help="the runs' records (default: %(default)s)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train one configuration for a budget and record it")
    r.add_argument("minutes", type=float)
    r.add_argument("name")
    r.add_argument("overrides", nargs="*")
    a = sub.add_parser("add", help="record a run trained otherwise (the README's main job, say)")
    a.add_argument("minutes", type=float)
    a.add_argument("name")
    a.add_argument("run_dir", type=Path)
    a.add_argument("--commit", help="the commit the run trained at (default: this checkout's)")
    a.add_argument("overrides", nargs="*")
    sub.add_parser("table", help="every run so far")
    p = sub.add_parser("plot", help="BLEU against budget, one curve per shape")
    p.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    RECORD = args.record
    if args.command == "run":
        print(json.dumps(run(args.minutes, args.name, args.overrides), indent=1))
    elif args.command == "add":
        entry = record(args.minutes, args.name, args.run_dir, args.overrides, commit=args.commit)
        print(json.dumps(entry, indent=1))
    elif args.command == "table":
        table()
    else:
        plot(args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
