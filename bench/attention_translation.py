"""Multi30k translation with each attention mechanism, in equal wall-clock budgets.

    python bench/attention_translation.py                      # every configuration, 5 minutes each
    python bench/attention_translation.py --budget 00:00:42:00 --warmup 600 --average-last 5 \\
        --only encoder_self=linear                             # the full CPU recipe for one of them
    python bench/attention_translation.py --dry-run            # the train.py commands, not run

Issue 23, item 4. The CPU recipe (``experiment=multi30k_de_en``) with only the mechanism changed:
softmax everywhere (the baseline), then encoder self-attention with each mechanism that can take
that role, then decoder self-attention with each causal one (``transformer/mechanisms.py``,
``REFUSED``), the other roles softmax. Every run has the same seed, data, model and schedule, and
the same ``trainer.max_time`` (``--budget``): a mechanism that trains slower does fewer updates.
The recipe's schedule is fitted to the shorter budget for all alike (``--warmup`` updates,
``--average-last`` epoch checkpoints averaged for the test). Each mechanism runs with its default
settings (``AttentionConfig``).

Each configuration is one ``train.py`` process; its run goes to ``<runs-dir>/<label>/``. Per run:
test BLEU, lowercased BLEU and chrF (beam 5, test_2016_flickr, from the run's ``results.json``),
epochs and updates done, training target tokens/s (the mean of the logged ``train/tok_s``, the
first logged value left out as warm-up), the process's peak RSS (``os.wait4``'s ``ru_maxrss``: the
process and the children it waited for) and its wall time. A run that fails is reported with its
exit status and the end of its log, not dropped. ``--skip-done`` keeps runs that finished before.

Not a test: the figures depend on the machine. Results: BENCHMARKS.md, "Attention mechanisms in
translation".
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    environment,
    print_config,
    print_table,
    run_measured,
    write_json,
)
from transformer.mechanisms import REFUSED  # noqa: E402

RUN_RECORD = "bench_run.json"  # written by this script into each run directory


def configurations() -> list[tuple[str, str | None, str | None]]:
    """(label, role, mechanism) of every run: the softmax baseline, then each mechanism per role."""
    runs: list[tuple[str, str | None, str | None]] = [("softmax", None, None)]
    for role in ("encoder_self", "decoder_self"):
        for name, refused in REFUSED.items():
            if name != "softmax" and role not in refused:
                runs.append((f"{role}={name}", role, name))
    return runs


def train_command(
    role: str | None, mechanism: str | None, run_dir: Path, args: argparse.Namespace
) -> list[str]:
    """The ``train.py`` command line of one configuration."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        f"experiment={args.experiment}",
        f"hydra.run.dir={run_dir}",
        f"trainer.max_time={args.budget}",
        f"lr.warmup_steps={args.warmup}",
        f"average_last={args.average_last}",
        "test_ckpt=averaged" if args.average_last > 1 else "test_ckpt=last",
        "logger=csv",
    ]
    if role is not None:
        command.append(f"model.attention.{role}={mechanism}")
    return command + list(args.override)


def logged_training(run_dir: Path) -> dict:
    """Validations (epochs, the partial last one included), updates done, and the mean training
    tokens/s (the first logged value left out as warm-up), from the run's log and metrics.csv."""
    tok_s, epochs, updates = [], 0, None
    with (run_dir / "logs" / "metrics.csv").open() as f:
        for row in csv.DictReader(f):
            if row.get("train/tok_s"):
                tok_s.append(float(row["train/tok_s"]))
            if row.get("val/loss"):
                epochs = max(epochs, int(float(row["epoch"])) + 1)
    # training/pipeline.py logs "run <status> at update <N>: ..." once fitting ended.
    found = re.findall(r"\brun [a-z ]+ at update (\d+):", (run_dir / "train.log").read_text())
    if found:
        updates = int(found[-1])
    tok_s = tok_s[1:] or tok_s
    return {
        "epochs": epochs,
        "updates": updates,
        "tok_s": sum(tok_s) / len(tok_s) if tok_s else None,
    }


def test_results(run_dir: Path) -> dict:
    """The test stage's figures and the training's, read back from a finished run's directory."""
    results = json.loads((run_dir / "results.json").read_text())
    return {
        "bleu": results.get("test/bleu"),
        "bleu_lc": results.get("test/bleu_lc"),
        "chrf": results.get("test/chrf"),
        "val_bleu": results.get("val/bleu"),
        "precision": results.get("precision"),
        **logged_training(run_dir),
    }


def run_one(label: str, role: str | None, mechanism: str | None, args: argparse.Namespace) -> dict:
    """Trains and tests one configuration in its own process; its figures, or why it failed."""
    run_dir = Path(args.runs_dir).resolve() / label.replace("=", "-")
    record_path = run_dir / RUN_RECORD
    if args.skip_done and record_path.exists():
        record = json.loads(record_path.read_text())
        if record.get("status") == "ok":
            print(f"-- {label}: done before, kept ({run_dir})", flush=True)
            record.update(test_results(run_dir))  # read again: what is read may have changed
            record_path.write_text(json.dumps(record, indent=2) + "\n")
            return record
    run_dir.mkdir(parents=True, exist_ok=True)
    command = train_command(role, mechanism, run_dir, args)
    print(f"-- {label}: {' '.join(command[1:])}", flush=True)
    with (run_dir / "bench_stdout.log").open("w") as log:
        proc, wall, peak = run_measured(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    record = {
        "label": label,
        "role": role,
        "mechanism": mechanism or "softmax",
        "run_dir": str(run_dir),
        "wall_s": wall,
        "peak_rss_mib": peak,
        "exit_code": proc.returncode,
    }
    results_path = run_dir / "results.json"
    if proc.returncode != 0 or not results_path.exists():
        tail = (run_dir / "bench_stdout.log").read_text().splitlines()[-15:]
        record.update(status=f"failed (exit {proc.returncode})", log_tail=tail)
        print("\n".join(tail), flush=True)
    else:
        record.update(status="ok", **test_results(run_dir))
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"   {record['status']} in {record['wall_s']:.0f} s", flush=True)
    return record


def table(records: list[dict]) -> tuple[list[str], list[list[object]]]:
    headers = ["configuration", "BLEU", "BLEU lc", "chrF", "epochs", "updates", "tgt tok/s", "peak RSS MiB"]
    rows = []
    for r in records:
        if r["status"] != "ok":
            rows.append([r["label"], r["status"], "", "", "", "", "", f"{r['peak_rss_mib']:.0f}"])
            continue
        rows.append(
            [
                r["label"],
                f"{r['bleu']:.2f}",
                f"{r['bleu_lc']:.2f}",
                f"{r['chrf']:.2f}",
                r["epochs"],
                r["updates"],
                f"{r['tok_s']:,.0f}" if r["tok_s"] is not None else "-",
                f"{r['peak_rss_mib']:.0f}",
            ]
        )
    return headers, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--experiment", default="multi30k_de_en", help="train.py experiment (default: %(default)s)"
    )
    p.add_argument("--budget", default="00:00:05:00", help="trainer.max_time of every run, DD:HH:MM:SS")
    p.add_argument("--warmup", type=int, default=150, help="optimizer.warmup_steps of every run")
    p.add_argument("--average-last", type=int, default=2, help="epoch checkpoints averaged for the test")
    p.add_argument("--only", nargs="+", help="labels to run (softmax, encoder_self=linear, ...); default all")
    p.add_argument("--override", nargs="*", default=[], help="further train.py overrides, for every run")
    p.add_argument("--runs-dir", default=str(ROOT / "runs" / "attention_translation"), help="runs go here")
    p.add_argument("--skip-done", action="store_true", help="keep runs that finished in --runs-dir before")
    p.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    p.add_argument("--json", default="attention_translation", help="results file (name or path)")
    args = p.parse_args(argv)

    runs = configurations()
    if args.only:
        known = {label for label, _, _ in runs}
        unknown = sorted(set(args.only) - known)
        if unknown:
            p.error(
                f"--only: unknown configuration(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        runs = [run for run in runs if run[0] in args.only]
    if args.dry_run:
        for label, role, mechanism in runs:
            run_dir = Path(args.runs_dir).resolve() / label.replace("=", "-")
            print(" ".join(train_command(role, mechanism, run_dir, args)[1:]))
        return 0

    config = {k: v for k, v in vars(args).items() if k not in ("dry_run", "json")}
    print_config("attention mechanisms in translation", {**config, "runs": len(runs)})
    records = [run_one(label, role, mechanism, args) for label, role, mechanism in runs]
    print()
    print_table(*table(records))
    write_json(
        args.json,
        {"environment": environment(threads=os.cpu_count() or 1), "config": config, "results": records},
    )
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
