"""The length penalty, chosen on validation: beam search at each alpha, scored on val and test.

    python bench/length_penalty.py --checkpoints RUN1/checkpoints/averaged.ckpt RUN2/...
    python bench/length_penalty.py --checkpoints A.ckpt --alphas 0.6 2 --lines 20   # a check

Each checkpoint (a run's ``averaged.ckpt``, what its test stage decodes) translates Multi30k's
validation and test_2016_flickr sources (``--data-dir``; the checkpoint's languages) with beam
search (``--beam-size``) at each GNMT length penalty ``--alphas``, as ``translate.py`` does (the
device's fast paths, ``--threads`` threads), scored with sacreBLEU. Printed per checkpoint and
alpha: BLEU and the length ratio (output / reference words; below 1 the brevity penalty costs).
The choice is the alpha of the highest validation BLEU averaged over the checkpoints; beside it,
each checkpoint's test BLEU there and at ``--baseline`` (the project's default, 0.6), and the
mean difference. Validation and the test stage's training are unaffected by alpha (validation
searches greedily), so a run's checkpoints re-decoded here are what its test stage gives with the
same ``decoding.alpha``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sacrebleu.metrics import BLEU  # noqa: E402

from bench.harness import (  # noqa: E402,I001
    MULTI30K_DIR,
    add_json_option,
    environment,
    print_config,
    print_table,
    read_gz_lines,
    set_threads,
    write_json,
)
from decoding import SearchSettings  # noqa: E402
from fastpaths.optimize import optimize  # noqa: E402
from translation.translator import SearchOptions, Translator  # noqa: E402

SPLITS = ("val", "test_2016_flickr")
ALPHAS = (0.0, 0.6, 1.0, 1.5, 2.0, 2.5, 3.0)


def scored(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Cased BLEU (sacreBLEU's 13a, as the test stage) and the output / reference length ratio."""
    score = BLEU().corpus_score(hypotheses, [references])
    return {"bleu": score.score, "ratio": score.sys_len / max(score.ref_len, 1)}


def sweep(path: Path, alphas: list[float], beam_size: int, data_dir: Path, lines: int | None) -> dict:
    """``{split: {alpha: scored(...)}}`` of one checkpoint."""
    translator = Translator.from_checkpoint(path)
    translator.use(optimize(translator.model, translator.device, "inference"))
    found: dict[str, dict[float, dict[str, float]]] = {}
    for split in SPLITS:
        sources = read_gz_lines(data_dir / f"{split}.{translator.src_lang}.gz")[:lines]
        references = read_gz_lines(data_dir / f"{split}.{translator.tgt_lang}.gz")[:lines]
        found[split] = {}
        for alpha in alphas:
            options = SearchOptions(beam_size=beam_size, alpha=alpha)
            found[split][alpha] = scored(translator.translate(sources, options), references)
            print(f"{path} {split} alpha {alpha}: {found[split][alpha]}", flush=True)
    return found


def choose(results: dict[str, dict], alphas: list[float]) -> float:
    """The alpha of the highest validation BLEU averaged over the checkpoints (the first on a tie)."""
    return max(alphas, key=lambda a: statistics.mean(r["val"][a]["bleu"] for r in results.values()))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoints", type=Path, nargs="+", required=True, metavar="CKPT")
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS))
    parser.add_argument(
        "--baseline",
        type=float,
        default=SearchSettings().alpha,
        help="the alpha compared with (default: %(default)s)",
    )
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=MULTI30K_DIR)
    parser.add_argument("--lines", type=int, default=None, help="the first N lines of each split only")
    parser.add_argument("--threads", type=int, default=2)
    add_json_option(parser, "length_penalty")
    args = parser.parse_args()
    alphas = sorted(set(args.alphas) | {args.baseline})
    set_threads(args.threads)
    print_config(
        "length penalty",
        {"checkpoints": " ".join(map(str, args.checkpoints)), "alphas": alphas, "beam": args.beam_size}
        | environment(args.threads),
    )
    results = {str(p): sweep(p, alphas, args.beam_size, args.data_dir, args.lines) for p in args.checkpoints}
    for split in SPLITS:
        rows = [
            [name, *(f"{r[split][a]['bleu']:.2f} ({r[split][a]['ratio']:.3f})" for a in alphas)]
            for name, r in results.items()
        ]
        means = [statistics.mean(r[split][a]["bleu"] for r in results.values()) for a in alphas]
        rows.append(["mean", *(f"{m:.2f}" for m in means)])
        print(f"{split}: BLEU (length ratio) by alpha")
        print_table(["checkpoint", *map(str, alphas)], rows)
    chosen = choose(results, alphas)
    tests = {name: r["test_2016_flickr"] for name, r in results.items()}
    gains = [t[chosen]["bleu"] - t[args.baseline]["bleu"] for t in tests.values()]
    rows = [
        [name, f"{t[args.baseline]['bleu']:.2f}", f"{t[chosen]['bleu']:.2f}", f"{gain:+.2f}"]
        for (name, t), gain in zip(tests.items(), gains, strict=True)
    ]
    print(f"chosen on validation: alpha {chosen}; test BLEU at {args.baseline} and at {chosen}")
    print_table(["checkpoint", f"test at {args.baseline}", f"test at {chosen}", "difference"], rows)
    print(f"mean test difference: {statistics.mean(gains):+.2f} BLEU over {len(gains)} checkpoint(s)")
    settings = {"alphas": alphas, "beam": args.beam_size, "chosen": chosen, "baseline": args.baseline}
    write_json(args.json, settings | {"results": results})


if __name__ == "__main__":
    main()
