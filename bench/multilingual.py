"""One English->{German, French} model against two bilingual ones, at the same training budget.

    python bench/multilingual.py                      # trains the three models (~17 min each), then the table
    python bench/multilingual.py --epochs 4           # a shorter budget
    python bench/multilingual.py --collect            # no training: score the newest runs of the three

The three runs are ``train.py`` with the CPU recipe (conf/experiment/multi30k/cpu_recipe.yaml),
each trained on the same number of sentence pairs (no time limit, no early stopping):
``multi30k_en_de`` and the same with ``data.tgt_lang=fr`` for ``--epochs`` epochs of 29,000
pairs, and ``multi30k_en_defr`` (conf/experiment/multi30k_en_defr.yaml: both training sets
mixed, sources tagged <2de> / <2fr>) for half as many epochs of 58,000. Each direction of
test_2016_flickr is then translated with the run's last checkpoint (no averaging or selection,
which would weigh the runs' epochs differently), beam 5, and scored with sacreBLEU (BLEU, chrF).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
from translation.translator import SearchOptions, Translator  # noqa: E402

# run name -> (experiment, extra overrides, directions it is scored on, epochs per --epochs)
RUNS = {
    "bench_en_de": ("multi30k_en_de", [], ["de"], 1.0),
    "bench_en_fr": ("multi30k_en_de", ["data.tgt_lang=fr"], ["fr"], 1.0),
    "bench_en_defr": ("multi30k_en_defr", [], ["de", "fr"], 0.5),
}


def newest(name: str) -> Path:
    runs = sorted((ROOT / "runs" / name).glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise SystemExit(f"no last checkpoint under runs/{name}/: train it first (without --collect)")
    return runs[-1]


def train(name: str, experiment: str, extra: list[str], epochs: int) -> float:
    """Seconds the ``train.py`` process took."""
    command = [sys.executable, "train.py", f"experiment={experiment}", f"name={name}"]
    command += [f"trainer.max_epochs={epochs}", "trainer.max_time=null", "average_last=0"]
    command += ["early_stopping.patience=null", "test=false", "plot=false", *extra]
    print(" ".join(command[1:]), flush=True)
    start = time.monotonic()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=14, help="epochs of a bilingual model (default 14)")
    parser.add_argument("--collect", action="store_true", help="score the newest runs, train nothing")
    parser.add_argument("--beam-size", type=int, default=5)
    args = parser.parse_args()
    print_config("multilingual", {"epochs": args.epochs, "beam": args.beam_size, **environment(2)})
    seconds = {}
    if not args.collect:
        for name, (experiment, extra, _, share) in RUNS.items():
            seconds[name] = train(name, experiment, extra, round(args.epochs * share))
    sources = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.en.gz")
    rows, results = [], {}
    for name, (_, _, directions, _) in RUNS.items():
        ckpt = newest(name)
        for lang in directions:
            translator = Translator.from_checkpoint(ckpt, target_lang=lang)
            hyps = translator.translate(sources, SearchOptions(beam_size=args.beam_size))
            scores = corpus_scores(hyps, read_gz_lines(MULTI30K_DIR / f"test_2016_flickr.{lang}.gz"))
            results[f"{name}/en-{lang}"] = {"bleu": scores.bleu, "chrf": scores.chrf, "checkpoint": str(ckpt)}
            wall = f"{seconds[name] / 60:.1f}" if name in seconds else "-"
            rows.append([name, f"en->{lang}", f"{scores.bleu:.2f}", f"{scores.chrf:.2f}", wall])
            print(f"{name} en->{lang}: BLEU {scores.bleu:.2f} chrF {scores.chrf:.2f}", flush=True)
    print_table(["run", "direction", "BLEU", "chrF", "train.py minutes"], rows)
    print(scores.bleu_signature, scores.chrf_signature)
    write_json("multilingual", {"epochs": args.epochs, "results": results, "seconds": seconds})


if __name__ == "__main__":
    main()
