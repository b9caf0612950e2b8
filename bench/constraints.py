"""Terminology constraints on test_2016_flickr: BLEU and the constraints kept, with and without them.

    python bench/constraints.py --checkpoint CKPT
    python bench/constraints.py --checkpoint CKPT --rounds 3      # for the speed ratio: medians of 3

Each line gets up to ``--per-line`` (2) constraints, words of its reference that the search would
not produce unasked: content words (letters only, three or more, not in a short list of function
words, not the reference's first word, whose capital is the sentence's) whose target subwords do
not occur in the unconstrained translation's. They are drawn by a generator seeded with ``--seed``
and the line's number, so the choice is the same in every run and for every ``--lines``, and kept
in the reference's order (what ``--constraints-order ordered`` then asks for).

Both systems translate the same lines with the same beam in this process (fp32, ``--threads``):
*without* the sources alone, *with* the sources and their constraints (``translate.py
--constraints``). Printed for each: BLEU and chrF (sacreBLEU, the target language's tokenizer),
the share of the constraints kept (their subwords occur in the output's: what the search
guarantees; and as whole words of the detokenized output, which a constraint followed by a
piece of the same word, "puppy" in "puppying", is not), the lines whose constraints were not met,
and the wall time, the median of ``--rounds`` rounds that alternate the two systems; their ratio
is the cost of the constraints. The unconstrained share is 0 by the choice of constraints.
"""

from __future__ import annotations

import argparse
import random
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (  # noqa: E402,I001
    MULTI30K_DIR,
    add_json_option,
    environment,
    median,
    print_config,
    print_table,
    read_gz_lines,
    set_threads,
    timed,
    write_json,
)
from common.metrics import corpus_scores  # noqa: E402
from translation.results import Translation  # noqa: E402
from translation.translator import SearchOptions, Translator  # noqa: E402

# Words that carry no terminology (English and German, the corpus's target languages).
FUNCTION_WORDS = frozenset(
    """a an the and or but of in on at to into onto over under near by for from with without while
    is are was were be been being has have his her their its it he she they them this that these those
    there who which what as up down out off some one two three four other another each
    der die das den dem des ein eine einer eines einem einen und oder mit auf in im an am zu
    von vom bei für über unter ist sind sich seine ihre ihr sein es er sie zwei drei""".split()
)
PUNCTUATION = string.punctuation + "„“”‘’«»"


def contains(output: list[int], constraint: list[int]) -> bool:
    """Whether ``constraint``'s subwords occur, one after the other, in ``output``'s."""
    n = len(constraint)
    return any(output[i : i + n] == constraint for i in range(len(output) - n + 1))


def words_of(text: str) -> list[str]:
    return [w.strip(PUNCTUATION) for w in text.split()]


def choose_constraints(
    translator: Translator, references: list[str], outputs: list[list[int]], per_line: int, seed: int
) -> list[list[str]]:
    """Per line, up to ``per_line`` content words of its reference that its unconstrained output
    lacks (module docstring), in the reference's order."""
    chosen = []
    for number, (reference, output) in enumerate(zip(references, outputs, strict=True), start=1):
        words = list(dict.fromkeys(words_of(reference)[1:]))
        content = [w for w in words if w.isalpha() and len(w) >= 3 and w.lower() not in FUNCTION_WORDS]
        ids = translator.encode_constraints([content])[0] if content else []
        missing = [w for w, c in zip(content, ids, strict=True) if not contains(output, c)]
        picked = random.Random(f"{seed}:{number}").sample(missing, min(per_line, len(missing)))
        chosen.append([w for w in missing if w in picked])
    return chosen


def kept(constraints: list[list[str]], ids: list[list[list[int]]], results: list[list[Translation]]) -> dict:
    """How many of the constraints the best outputs hold, as subwords and as whole words."""
    total = as_subwords = as_words = 0
    for words, wanted, hyps in zip(constraints, ids, results, strict=True):
        output = hyps[0] if hyps else Translation("", [], float("nan"), float("nan"))
        total += len(words)
        as_subwords += sum(contains(output.tokens, c) for c in wanted)
        as_words += sum(w in words_of(output.text) for w in words)
    return {
        "constraints": total,
        "kept": as_subwords / max(total, 1),
        "kept_as_words": as_words / max(total, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--lines", type=int, default=None, help="the first N lines only (default: all)")
    parser.add_argument("--per-line", type=int, default=2, help="constraints per line at most (default: 2)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the choice of constraints (default: 1)")
    parser.add_argument("--constraints-order", choices=["unordered", "ordered"], default="unordered")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of both systems, alternated (default: 1)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=MULTI30K_DIR, help="test_2016_flickr.{de,en}.gz's")
    add_json_option(parser, "constraints")
    args = parser.parse_args()
    set_threads(args.threads)
    translator = Translator.from_checkpoint(args.checkpoint)
    src_lang, tgt_lang = translator.src_lang, translator.tgt_lang
    print_config(
        "constraints",
        {"checkpoint": str(args.checkpoint), "beam": args.beam_size, "pair": f"{src_lang}-{tgt_lang}"}
        | {"per_line": args.per_line, "seed": args.seed, "order": args.constraints_order}
        | environment(args.threads),
    )
    texts = read_gz_lines(args.data_dir / f"test_2016_flickr.{src_lang}.gz")[: args.lines]
    references = read_gz_lines(args.data_dir / f"test_2016_flickr.{tgt_lang}.gz")[: args.lines]
    sources = translator.encode_sources(texts)
    options = SearchOptions(beam_size=args.beam_size, constraints_order=args.constraints_order)
    took, plain = timed(lambda: translator.translate_ids(sources, options))
    best = [hyps[0].tokens if hyps else [] for hyps in plain]
    constraints = choose_constraints(translator, references, best, args.per_line, args.seed)
    wanted = translator.encode_constraints(constraints)
    seconds: dict[str, list[float]] = {"without": [took], "with": []}
    for round_ in range(args.rounds):  # alternated: the machine's load falls on both alike
        if round_:
            seconds["without"].append(timed(lambda: translator.translate_ids(sources, options))[0])
        took, constrained = timed(lambda: translator.translate_ids(sources, options, constraints=wanted))
        seconds["with"].append(took)
    rows, results = [], {}
    for name, system, found in (
        ("without constraints", "without", plain),
        ("with constraints", "with", constrained),
    ):
        hyps = [h[0].text if h else "" for h in found]
        scores = corpus_scores(hyps, references, tgt_lang)
        share = kept(constraints, wanted, found)
        unmet = sum(1 for w, h, s in zip(wanted, found, sources, strict=True) if w and s and not h)
        took = median(seconds[system])
        results[name] = {
            "bleu": scores.bleu,
            "chrf": scores.chrf,
            "unmet_lines": unmet,
            "seconds": took,
        } | share
        rows.append(
            [name, f"{scores.bleu:.2f}", f"{scores.chrf:.2f}", f"{100 * share['kept']:.1f}%"]
            + [f"{100 * share['kept_as_words']:.1f}%", unmet, f"{took:.1f}"]
        )
    lines_with = sum(1 for c in constraints if c)
    total = results["with constraints"]["constraints"]
    print(f"{len(texts)} lines, {lines_with} with constraints, {total} in all")
    headers = [
        "system",
        "BLEU",
        "chrF",
        "constraints kept (subwords)",
        "kept (whole words)",
        "lines unmet",
        "seconds",
    ]
    print_table(headers, rows)
    ratio = median(seconds["with"]) / median(seconds["without"])
    print(f"time with / without constraints: {ratio:.2f}x (median of {args.rounds} round(s))")
    print(scores.bleu_signature, scores.chrf_signature)
    write_json(
        args.json,
        {"checkpoint": str(args.checkpoint), "beam": args.beam_size, "order": args.constraints_order}
        | {
            "lines": len(texts),
            "lines_with_constraints": lines_with,
            "results": results,
            "time_ratio": ratio,
        },
    )


if __name__ == "__main__":
    main()
