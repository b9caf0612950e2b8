"""Two checkpoints of one run: each alone, their weight average and their ensemble, on test_2016_flickr.

    python bench/ensemble.py --run runs/multi30k_de_en/<run>        # its two newest epoch checkpoints
    python bench/ensemble.py --checkpoints A.ckpt B.ckpt

Each system translates test_2016_flickr (the source language of the checkpoints) with beam 5 in
this process, ``--threads`` threads, and is scored with sacreBLEU (BLEU, chrF) against the
target side. The weight average is the element-wise mean of the two state dicts
(``training/averaging.py``, what a run's ``averaged.ckpt`` is); the ensemble searches with the
mean of the two models' log-probabilities at every step (``transformer/ensemble.py``), at about
twice one model's cost.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (  # noqa: E402,I001
    MULTI30K_DIR,
    environment,
    print_config,
    print_table,
    read_gz_lines,
    set_threads,
    timed,
    write_json,
)
from common.metrics import corpus_scores  # noqa: E402
from training.average import average_checkpoints  # noqa: E402
from translation.translator import SearchOptions, Translator  # noqa: E402


def newest_epochs(run: Path) -> list[Path]:
    found = sorted((run / "checkpoints").glob("epoch*.ckpt"))
    if len(found) < 2:
        raise SystemExit(f"{run}/checkpoints holds {len(found)} epoch checkpoints; two are needed")
    return found[-2:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=Path, help="a run directory: its two newest epoch checkpoints")
    source.add_argument(
        "--checkpoints", type=Path, nargs=2, metavar="CKPT", help="two checkpoints of one run"
    )
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    first, second = args.checkpoints or newest_epochs(args.run)
    langs = Translator.from_checkpoint(first)
    src_lang, tgt_lang = langs.src_lang, langs.tgt_lang
    print_config(
        "ensemble",
        {"a": str(first), "b": str(second), "beam": args.beam_size, "pair": f"{src_lang}-{tgt_lang}"}
        | environment(args.threads),
    )
    sources = read_gz_lines(MULTI30K_DIR / f"test_2016_flickr.{src_lang}.gz")
    references = read_gz_lines(MULTI30K_DIR / f"test_2016_flickr.{tgt_lang}.gz")
    with tempfile.TemporaryDirectory() as tmp:
        average = average_checkpoints([first, second], Path(tmp) / "average.ckpt")
        systems = {
            f"A ({first.name})": lambda: Translator.from_checkpoint(first),
            f"B ({second.name})": lambda: Translator.from_checkpoint(second),
            "weight average of A and B": lambda: Translator.from_checkpoint(average),
            "ensemble of A and B": lambda: Translator.from_checkpoints([first, second]),
        }
        rows, results = [], {}
        for name, make in systems.items():
            translator = make()
            seconds, hyps = timed(
                lambda t=translator: t.translate(sources, SearchOptions(beam_size=args.beam_size))
            )
            scores = corpus_scores(hyps, references)
            results[name] = {"bleu": scores.bleu, "chrf": scores.chrf, "seconds": seconds}
            rows.append([name, f"{scores.bleu:.2f}", f"{scores.chrf:.2f}", f"{seconds:.1f}"])
            print(f"{name}: BLEU {scores.bleu:.2f} chrF {scores.chrf:.2f} in {seconds:.1f} s", flush=True)
    print_table(["system", "BLEU", "chrF", "seconds (1,000 sentences)"], rows)
    print(scores.bleu_signature, scores.chrf_signature)
    write_json("ensemble", {"a": str(first), "b": str(second), "beam": args.beam_size, "results": results})


if __name__ == "__main__":
    main()
