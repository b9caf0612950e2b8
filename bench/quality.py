"""Quality: train the Multi30k experiments and print the BLEU table (test_2016_flickr).

    python bench/quality.py                  # trains de->en then en->de (~45 min each), then the table
    python bench/quality.py --collect        # no training: the table of the newest existing runs
    python bench/quality.py --experiments multi30k_de_en -- trainer.max_time=00:00:10:00

Each experiment is ``python train.py experiment=<name>`` (conf/experiment/<name>.yaml: the small
model, bf16 autocast, 42 minutes of training, then beam 5 on test_2016_flickr with the average of
the last 5 epoch checkpoints). The table takes the newest run directory of each experiment, and
re-scores its ``test.<tgt>.hyp`` against the references with sacreBLEU (cased BLEU, lowercased
BLEU, chrF; default 13a tokenization) rather than trusting the logged numbers; both are printed.

Times: ``training`` is from the run's first log line to the last epoch checkpoint (data and
SentencePiece loading, training epochs and their validation); ``total`` is to results.json
(averaging and the beam-5 test included); ``wall`` is the whole ``train.py`` process when this
script ran it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.harness import (  # noqa: E402,I001
    MULTI30K_DIR,
    ROOT,
    environment,
    print_config,
    print_table,
    read_gz_lines,
    write_json,
)
from common.metrics import corpus_scores  # noqa: E402

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]")


def newest_run(name: str) -> Path | None:
    runs = [Path(p).parent for p in glob.glob(str(ROOT / "runs" / name / "*" / "config.yaml"))]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def _first_log_time(run: Path) -> float | None:
    log = run / "train.log"
    if not log.exists():
        return None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _STAMP.match(line)
            if m:
                return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    return None


def _config_value(run: Path, key: str) -> str:
    for line in (run / "config.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith(f"{key}:"):
            return stripped.split(":", 1)[1].strip()
    return "?"


def _epochs_steps(run: Path) -> tuple[int, int]:
    path = run / "logs" / "metrics.csv"
    epochs = steps = 0
    if path.exists():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("epoch") and row.get("train/loss"):  # not the test stage's row
                    epochs = max(epochs, int(float(row["epoch"])) + 1)
                if row.get("step"):
                    steps = max(steps, int(float(row["step"])) + 1)
    return epochs, steps


def describe(name: str, run: Path, wall: float | None) -> dict:
    src, tgt = _config_value(run, "src_lang"), _config_value(run, "tgt_lang")
    row: dict = {"experiment": name, "run": str(run.relative_to(ROOT)), "pair": f"{src}-{tgt}"}
    logged = json.loads((run / "results.json").read_text()) if (run / "results.json").exists() else {}
    row["logged"] = {k: v for k, v in logged.items() if k.startswith("test/")}
    hyp = run / f"test.{tgt}.hyp"
    if hyp.exists():
        hyps = hyp.read_text(encoding="utf-8").split("\n")[:-1]
        refs = read_gz_lines(MULTI30K_DIR / f"test_2016_flickr.{tgt}.gz")
        scores = corpus_scores(hyps, refs)
        row.update(
            bleu=scores.bleu,
            bleu_lc=scores.bleu_lowercase,
            chrf=scores.chrf,
            signatures=[scores.bleu_signature, scores.bleu_lowercase_signature, scores.chrf_signature],
        )
    start = _first_log_time(run)
    ckpts = glob.glob(str(run / "checkpoints" / "epoch*.ckpt")) + glob.glob(
        str(run / "checkpoints" / "last.ckpt")
    )
    if start and ckpts:
        row["training_min"] = (max(os.path.getmtime(p) for p in ckpts) - start) / 60
    if start and (run / "results.json").exists():
        row["total_min"] = ((run / "results.json").stat().st_mtime - start) / 60
    row["wall_min"] = wall / 60 if wall else None
    row["epochs"], row["steps"] = _epochs_steps(run)
    row["test_ckpt"] = _config_value(run, "test_ckpt")
    row["precision"] = _config_value(run, "precision")
    row["max_time"] = _config_value(run, "max_time")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiments", nargs="+", default=["multi30k_de_en", "multi30k_en_de"])
    parser.add_argument("--collect", action="store_true", help="do not train; read the newest runs")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides passed to every train.py (after --)")
    args = parser.parse_args()

    walls: dict[str, float] = {}
    if not args.collect:
        for name in args.experiments:
            cmd = [
                sys.executable,
                "train.py",
                f"experiment={name}",
                "trainer.enable_progress_bar=false",
                *args.overrides,
            ]
            print("running:", " ".join(cmd), flush=True)
            start = time.time()
            subprocess.run(cmd, cwd=ROOT, check=True)
            walls[name] = time.time() - start

    rows, results = [], []
    for name in args.experiments:
        run = newest_run(name)
        if run is None:
            print(f"{name}: no run under runs/{name}/")
            continue
        r = describe(name, run, walls.get(name))
        results.append(r)
        rows.append(
            [
                r["pair"],
                r.get("bleu", float("nan")),
                r.get("bleu_lc", float("nan")),
                r.get("chrf", float("nan")),
                r["epochs"],
                r["steps"],
                r.get("training_min", float("nan")),
                r.get("total_min", float("nan")),
                r["wall_min"] or float("nan"),
                r["test_ckpt"],
                r["run"],
            ]
        )
    print_config(
        "quality: Multi30k test_2016_flickr, beam 5",
        {**environment(torch.get_num_threads()), "collect_only": args.collect},
    )
    print_table(
        [
            "pair",
            "BLEU",
            "BLEU lc",
            "chrF",
            "epochs",
            "steps",
            "training min",
            "total min",
            "wall min",
            "weights",
            "run",
        ],
        rows,
    )
    for r in results:
        print(f"{r['pair']}: logged by train.py: {r['logged']}")
        for sig in r.get("signatures", []):
            print(f"  {sig}")
    write_json("quality", {"results": results})


if __name__ == "__main__":
    main()
