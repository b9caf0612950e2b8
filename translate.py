"""Translate text with a trained checkpoint: one output line per input line, in input order.

    python translate.py --checkpoint runs/x/checkpoints/best.ckpt < test.de > test.en
    python translate.py --checkpoint best.ckpt --input test.de --references test.en
    python translate.py --checkpoint best.ckpt "Ein Hund läuft." --attention-dir attn/
    python translate.py --checkpoint a.ckpt b.ckpt --input test.de               # an ensemble
    python translate.py --checkpoint best.ckpt --sampling --topk 10 --seed 1 < mono.de
    python translate.py --checkpoint best.ckpt --input test.de --score-references test.en

Only translations go to stdout; progress, warnings and scores go to stderr. A broken checkpoint or
a wrong option gives a one-line error and exit status 2. The command line only: parsing, reading,
writing. The work is in the ``translation`` package (its Python API):
``translator.py`` (batching, search), ``checkpoint.py`` (loading), ``workers.py`` and
``attention_plot.py``, ``stream.py`` (standard input as it arrives); input lines are read by
``data/lines.py`` in its lossless mode. Lightning and Hydra are never imported here.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO

import torch
from tqdm import tqdm

from data.lines import LineMode, decode_lines
from decoding.budget import ACCELERATOR_TOKENS
from fastpaths.hardware import bf16_capability
from fastpaths.optimize import optimize
from fastpaths.packed import bound_kernel_caches
from translation.checkpoint import CheckpointError
from translation.parts import (
    FILE_PART_LINES,
    count_lines,
    file_parts,
    parse_shard,
    resume_point,
)
from translation.stream import line_chunks
from translation.translator import DEFAULT_MAX_TOKENS, Score, SearchOptions, Translation, Translator
from translation.workers import WorkerPool

logger = logging.getLogger("translate")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

PROG = "translate.py"

DEFAULTS = SearchOptions()  # the search options' defaults, shown in --help


class UsageError(Exception):
    """A problem with the inputs or options found after parsing; reported in one line."""


DESCRIPTION = """\
Translate sentences with a checkpoint of this project.

Lines come from SENTENCE arguments, --input FILE or stdin, split on '\\n' only;
each gives exactly one output line, in input order. Empty and whitespace-only
lines give empty lines; invalid UTF-8 is replaced and lines longer than the
model allows are cropped, each with a warning that names the line. Only
translations go to stdout; progress, warnings and scores go to stderr. A bad
checkpoint or option gives a one-line error and exit status 2.

Standard input is translated as it arrives: each line (or each --buffer-size
lines that have come) is answered and flushed before more is read, so a person
or a process can type a line and read its translation.
"""

EXAMPLES = """\
examples:
  python translate.py --checkpoint best.ckpt < test.de > test.en
  python translate.py --checkpoint best.ckpt --input test.de --references test.en --beam-size 5
  python translate.py --checkpoint best.ckpt "Ein Hund rennt." --attention-dir attn/ --attention-heads
  python translate.py --checkpoint a.ckpt b.ckpt --weights 0.6 0.4 --input test.de
  python translate.py --checkpoint best.ckpt --sampling --topp 0.9 --seed 1 --input mono.de
  python translate.py --checkpoint best.ckpt --input test.de --score-references test.en
  python translate.py --checkpoint best.ckpt --input test.de --prefix prefixes.en
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("sentences", nargs="*", metavar="SENTENCE", help="sentences to translate, one line each")
    add(
        "--checkpoint",
        required=True,
        nargs="+",
        metavar="PATH",
        help="checkpoint written by training; several: an ensemble, searched with the weighted mean of "
        "their log-probabilities at every step (their SentencePiece models must be the same); after "
        "the first, the values that end in .ckpt or .pt or name a file are checkpoints, the rest sentences",
    )
    add(
        "--weights",
        type=float,
        nargs="+",
        metavar="W",
        help="one weight per --checkpoint, normalised to sum to 1 (default: equal)",
    )
    io = parser.add_argument_group("input and output")
    io.add_argument("--input", metavar="FILE", help="read lines from FILE ('-': stdin; default: stdin)")
    io.add_argument("--output", metavar="FILE", help="write translations to FILE (default: stdout)")
    io.add_argument(
        "--nbest-output",
        metavar="FILE",
        help="write the n-best lists to FILE, tab-separated 'line_number rank score translation' "
        "(line numbers and ranks from 1, best first; score: log-probability / GNMT length penalty; "
        "empty input lines have no rows); stdout still gets one line per input line, the best",
    )
    io.add_argument(
        "--references",
        metavar="FILE",
        help="reference translations, one per input line: after translating, print sacreBLEU, chrF "
        "and TER with their signatures to stderr",
    )
    io.add_argument(
        "--bleu-tokenize",
        metavar="NAME",
        help="sacreBLEU's tokenizer for --references' BLEU (13a, intl, char, zh, ja-mecab, ...; "
        "default: sacreBLEU's choice for the target language: zh, ja-mecab, ko-mecab, else 13a)",
    )
    io.add_argument(
        "--score-references",
        metavar="FILE",
        help="score instead of translating: for each input line and the line of FILE with its number "
        "(a translation of it), write the translation's log-probability under the model (or the "
        "ensemble): 'sum<TAB>tokens<TAB>mean', tokens counting </s>; mean is minus the training NLL "
        "without label smoothing",
    )
    io.add_argument(
        "--buffer-size",
        type=int,
        metavar="N",
        help="translate at most N lines at a time, writing each part's lines before reading the next. "
        f"--input FILE: parts of N lines (default: {FILE_PART_LINES}); stdin: never wait for more "
        "once the lines that have arrived are taken (default: 1 on a terminal, else no limit: input "
        "that is all there is batched as a whole)",
    )
    io.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted --output file: keep its complete lines, skip the input lines "
        "they answer, append the rest (--nbest-output too)",
    )
    io.add_argument(
        "--shard",
        metavar="I/N",
        help="translate the I-th of N shards of --input FILE (I from 0): its parts of --buffer-size "
        "lines I, I+N, I+2N, ...; python3 -m translation.parts interleaves the N outputs into one",
    )
    search = parser.add_argument_group("search")
    search.add_argument(
        "--beam-size",
        type=int,
        default=DEFAULTS.beam_size,
        metavar="K",
        help="beam width (default: %(default)s; 1 is greedy with scores)",
    )
    search.add_argument(
        "--nbest",
        type=int,
        default=DEFAULTS.nbest,
        metavar="N",
        help="hypotheses per line for --nbest-output (default: %(default)s)",
    )
    search.add_argument(
        "--greedy", action="store_true", help="greedy search: fastest, no scores, ignores --beam-size"
    )
    search.add_argument(
        "--min-length",
        type=int,
        default=DEFAULTS.min_len,
        metavar="N",
        help="no output shorter than N subwords (</s> forbidden before; the length limit still wins) "
        "(default: %(default)s)",
    )
    search.add_argument(
        "--no-repeat-ngram",
        type=int,
        default=DEFAULTS.no_repeat_ngram,
        metavar="N",
        help="no n-gram of N subwords occurs twice in an output (default: %(default)s: allowed)",
    )
    search.add_argument(
        "--prefix",
        metavar="FILE",
        help="one line per input line: its translation starts with that text, at the model's "
        "log-probabilities (an empty line forces nothing)",
    )
    sampling = parser.add_argument_group("sampling (back-translation)")
    sampling.add_argument(
        "--sampling",
        action="store_true",
        help="draw each translation from the model's distribution instead of searching; --nbest N: N "
        "samples per line; a line's samples depend on --seed and the line only, never on the batch",
    )
    sampling.add_argument(
        "--topk",
        type=int,
        default=DEFAULTS.topk,
        metavar="K",
        help="draw from the K most likely subwords only (default: %(default)s: all; 1 is greedy)",
    )
    sampling.add_argument(
        "--topp",
        type=float,
        default=DEFAULTS.topp,
        metavar="P",
        help="draw from the fewest most likely subwords whose probability reaches P (default: %(default)s)",
    )
    sampling.add_argument(
        "--temperature",
        type=float,
        default=DEFAULTS.temperature,
        metavar="T",
        help="sharpen (T < 1) or flatten (T > 1) the distribution drawn from (default: %(default)s)",
    )
    sampling.add_argument("--seed", type=int, default=DEFAULTS.seed, help="(default: %(default)s)")
    search.add_argument(
        "--length-penalty",
        type=float,
        default=DEFAULTS.alpha,
        metavar="ALPHA",
        help="GNMT length penalty: score = log P / ((5 + length) / 6) ** ALPHA (default: %(default)s; "
        "0: none)",
    )
    search.add_argument(
        "--max-len-a",
        type=float,
        default=DEFAULTS.max_len_a,
        metavar="A",
        help="at most A * source_length + B output tokens (default: %(default)s)",
    )
    search.add_argument(
        "--max-len-b",
        type=int,
        default=DEFAULTS.max_len_b,
        metavar="B",
        help="see --max-len-a (default: %(default)s)",
    )
    search.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="batch lines sorted by length so that each batch has at most N padded tokens, counting "
        "each source once per hypothesis (sentences x beam size x longest source; greedy counts 1): "
        "larger is faster and needs more memory; output order is the input order (default: "
        f"{DEFAULT_MAX_TOKENS} on the CPU, {ACCELERATOR_TOKENS} on a GPU)",
    )
    io.add_argument(
        "--target-lang",
        metavar="LANG",
        help="the language to translate into, for a model trained on several (data.target_lang_tags): "
        "its tag, e.g. <2fr>, goes before each input line",
    )
    run = parser.add_argument_group("running")
    run.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    run.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="weights' type: bfloat16 halves their memory and is faster on CPUs with native bf16 "
        "(AVX512-BF16, AMX) and on recent GPUs, slower where it is emulated (AVX2-only CPUs: a "
        "warning says so); a few outputs differ (speed and BLEU: BENCHMARKS.md, 'Decoding speed') "
        "(default: float32)",
    )
    run.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads for torch, in each worker with --workers (default: torch's choice; 1 per worker)",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="CPU only: search the batches in N processes of --threads threads each, a copy of the "
        "model in each; pays with small batches (--max-tokens), while big ones keep one process's "
        "threads busy and start-up takes a few seconds (BENCHMARKS.md, 'Decoding speed') "
        "(default: 1, this process)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar, no info messages; warnings stay")
    attention = parser.add_argument_group("attention plots")
    attention.add_argument(
        "--attention-dir",
        metavar="DIR",
        help="write PNG heatmaps of the best translation's cross-attention to DIR: line{N}.layer{L}.png "
        "per decoder layer, heads averaged, source subwords across, output subwords down; with an "
        "encoder whose attention is not softmax, also its self-attention: line{N}.encoder.layer{L}.png",
    )
    attention.add_argument(
        "--attention-heads",
        action="store_true",
        help="also write line{N}.layer{L}.heads.png with one panel per head",
    )
    attention.add_argument(
        "--attention-max-sentences",
        type=int,
        default=20,
        metavar="N",
        help="plot the first N non-empty lines (default: 20)",
    )
    return parser


def split_checkpoints(args: argparse.Namespace, argv: list[str]) -> None:
    """Moves the sentences that ``--checkpoint``'s list swallowed back to the sentences.

    ``--checkpoint a.ckpt "Ein Hund."`` must stay one checkpoint and one sentence: after the first
    value, the checkpoints are the values that end in ``.ckpt`` or ``.pt`` or name a file; the
    values from the first other one on are sentences, in their place among the others.
    """
    paths = args.checkpoint
    n = 1
    while n < len(paths) and (paths[n].endswith((".ckpt", ".pt")) or Path(paths[n]).is_file()):
        n += 1
    if n == len(paths):
        return
    args.checkpoint, moved = paths[:n], paths[n:]
    try:  # the sentences argparse kept are all before --checkpoint or all after its values
        before = bool(args.sentences) and argv.index(args.sentences[0]) < argv.index("--checkpoint")
    except ValueError:
        before = False
    args.sentences = [*args.sentences, *moved] if before else [*moved, *args.sentences]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    split_checkpoints(args, argv)
    for name in ("beam_size", "nbest", "max_tokens", "attention_max_sentences"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("min_length", "no_repeat_ngram", "topk"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be at least 0")
    if args.buffer_size is not None and args.buffer_size < 1:
        parser.error("--buffer-size must be at least 1")
    if not 0.0 < args.topp <= 1.0:
        parser.error(f"--topp must be in (0, 1], not {args.topp}")
    if not args.temperature > 0.0:
        parser.error(f"--temperature must be positive, not {args.temperature}")
    if args.weights is not None:
        if len(args.weights) != len(args.checkpoint):
            parser.error(
                f"--weights gives {len(args.weights)} weights for {len(args.checkpoint)} checkpoints"
            )
        if any(w < 0 for w in args.weights) or sum(args.weights) <= 0:
            parser.error("--weights must be non-negative with a positive sum")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.greedy and args.sampling:
        parser.error("--greedy and --sampling exclude each other: choose one")
    if args.greedy and args.nbest > 1:
        parser.error("--nbest > 1 needs beam search: drop --greedy")
    if args.greedy and args.nbest_output:
        parser.error(
            "--nbest-output needs beam search scores: drop --greedy (--beam-size 1 is greedy with scores)"
        )
    if args.nbest > args.beam_size and not args.sampling:
        parser.error(f"--nbest {args.nbest} is larger than --beam-size {args.beam_size}")
    if args.sentences and args.input is not None:
        parser.error("give sentences as arguments or --input, not both")
    if args.shard is not None:
        try:
            args.shard = parse_shard(args.shard)
        except ValueError as err:
            parser.error(str(err))
        if args.input in (None, "-"):
            parser.error("--shard splits an --input FILE: give one")
    if args.resume and not args.output:
        parser.error("--resume continues an --output FILE: give one")
    if args.resume and (args.input in (None, "-") or args.sentences):
        parser.error("--resume skips the lines an --output FILE answers in an --input FILE: give one")
    for option, value in (("--resume", args.resume), ("--shard", args.shard)):
        if value and args.references:
            parser.error(f"--references scores the whole output: drop {option}, then score the file")
        if value and args.attention_dir:
            parser.error(f"--attention-dir draws the lines translated in one run: drop {option}")
    if args.attention_heads and not args.attention_dir:
        parser.error("--attention-heads needs --attention-dir")
    if args.score_references:
        given = [
            option
            for option, value in (
                ("--references", args.references),
                ("--nbest-output", args.nbest_output),
                ("--attention-dir", args.attention_dir),
                ("--prefix", args.prefix),
                ("--sampling", args.sampling),
                ("--workers", args.workers > 1),  # scores are made in this process
            )
            if value
        ]
        if given:
            parser.error(f"--score-references scores given translations: drop {', '.join(given)}")
    return args


def search_options(args: argparse.Namespace) -> SearchOptions:
    """The search settings of the command line."""
    return SearchOptions(
        beam_size=1 if args.greedy else args.beam_size,
        nbest=args.nbest,
        alpha=args.length_penalty,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        min_len=args.min_length,
        no_repeat_ngram=args.no_repeat_ngram,
        greedy=args.greedy,
        sampling=args.sampling,
        topk=args.topk,
        topp=args.topp,
        temperature=args.temperature,
        seed=args.seed,
    )


Parts = Iterator[tuple[int, list[str]]]


def input_chunks(args: argparse.Namespace) -> tuple[Parts, str, int | None]:
    """The input as ``(number of the first line, lines)`` parts, its name for warnings, and its
    number of lines where it is known before reading (None for standard input).

    Arguments and ``--input`` are one part. Standard input comes as it arrives (``stream.py``),
    at most ``--buffer-size`` lines a part.
    """
    if args.sentences:
        # Each argument is one line; os.fsencode recovers the bytes of undecodable arguments.
        raw = [os.fsencode(s).replace(b"\n", b" ") for s in args.sentences]
        lines = decode_lines(b"\n".join(raw) + b"\n", "<arguments>", LineMode.LOSSLESS)
        return iter([(1, lines)]), "<arguments>", len(lines)
    if args.input is not None and args.input != "-":
        # A part at a time (translation/parts.py); a regular file's lines are counted first, a
        # named pipe (bash's <(...)) can be read once only.
        regular = Path(args.input).is_file()
        if regular:
            try:
                Path(args.input).open("rb").close()
            except OSError as err:
                raise UsageError(f"--input {args.input}: {err.strerror or err}") from None
        shard = args.shard or (0, 1)
        parts = file_parts(
            args.input, args.buffer_size or FILE_PART_LINES, shard, getattr(args, "skip_lines", 0)
        )
        return parts, args.input, count_lines(args.input) if regular and shard == (0, 1) else None
    terminal = sys.stdin.isatty()
    if terminal:
        logger.info("reading sentences from the terminal, one per line; end with Ctrl-D")
    buffer_size = args.buffer_size or (1 if terminal else sys.maxsize)

    def stream() -> Iterator[tuple[int, list[str]]]:
        number = 1
        for chunk in line_chunks(sys.stdin.fileno(), buffer_size):
            lines = decode_lines(b"\n".join(chunk) + b"\n", "<stdin>", LineMode.LOSSLESS, first_line=number)
            yield number, lines
            number += len(lines)

    return stream(), "<stdin>", None


def same_count(lines: list[str] | None, label: str, count: int, name: str) -> None:
    """Raises unless the file given as ``label`` has as many lines as the input (``count``)."""
    if lines is not None and len(lines) != count:
        raise UsageError(f"{label} has {len(lines)} lines but the input ({name}) has {count}")


def aligned_lines(
    lines: list[str] | None, option: str, first: int, count: int, name: str
) -> list[str] | None:
    """Lines ``first .. first + count - 1`` of a file given with ``option``, which must have them."""
    if lines is None:
        return None
    if first - 1 + count > len(lines):
        raise UsageError(f"{option} has {len(lines)} lines but the input ({name}) has more")
    return lines[first - 1 : first - 1 + count]


def read_file(path: str, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise UsageError(f"{option} {path}: {err.strerror or err}") from None


@contextmanager
def output(path: str | None, append: bool = False) -> Iterator[BinaryIO]:
    """Where lines go: stdout's bytes, or ``path`` opened for writing (appending: ``--resume``)."""
    if path is None:
        yield sys.stdout.buffer
        return
    try:
        f = open(path, "ab" if append else "wb")  # noqa: SIM115 (closed below)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror or err}") from None
    with f:
        yield f


def write_lines(lines: list[str], out: BinaryIO) -> None:
    """UTF-8, '\\n'-ended, whatever the locale, flushed."""
    out.write("".join(line + "\n" for line in lines).encode("utf-8"))
    out.flush()


def nbest_rows(results: list[list[Translation]], first: int = 1) -> list[str]:
    return [
        f"{number}\t{rank}\t{hyp.score:.6f}\t{hyp.text.replace(chr(9), ' ')}"
        for number, hyps in enumerate(results, start=first)
        for rank, hyp in enumerate(hyps, start=1)
    ]


def score_rows(scores: list[Score]) -> list[str]:
    return [f"{s.log_prob:.6f}\t{s.tokens}\t{s.mean:.6f}" for s in scores]


class TqdmHandler(logging.Handler):
    """Writes records to stderr through ``tqdm.write``, so that they do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


@contextmanager
def stderr_logging(quiet: bool) -> Iterator[None]:
    """Log records to stderr as 'LEVEL: message' while translating; removed afterwards."""
    root = logging.getLogger()
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.setLevel(logging.WARNING if quiet else logging.INFO)
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(min(old_level, handler.level) if old_level else handler.level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


@contextmanager
def worker_pool(translator: Translator, workers: int, threads: int | None) -> Iterator[WorkerPool | None]:
    """``workers`` processes of ``threads`` threads (default 1) each; None for one (this process)."""
    if workers == 1:
        yield None
        return
    logger.info("starting %d worker processes of %d thread(s) each", workers, threads or 1)
    with WorkerPool(translator.model, workers, threads or 1) as pool:
        yield pool


def run(args: argparse.Namespace) -> None:
    # Before the first matmul: a few kernels kept instead of one per row count decoding meets
    # (fastpaths/packed.py), so batches fit in less memory and need no padded rows.
    bound_kernel_caches()
    if args.threads is not None and args.workers == 1:
        torch.set_num_threads(args.threads)
    # Files first (cheap, and a typo is reported at once), then the model, then stdin: an
    # interactive user learns about a bad checkpoint before typing.
    for option in ("input", "references", "score_references", "prefix"):
        path = getattr(args, option)
        # exists, not is_file: a named pipe or a shell's <(...) is a file to read too
        if path not in (None, "-") and not Path(path).exists():
            raise UsageError(f"--{option.replace('_', '-')} {path}: no such file")
        if path not in (None, "-") and Path(path).is_dir():
            raise UsageError(f"--{option.replace('_', '-')} {path}: a directory, not a file")
    try:
        translator = Translator.from_checkpoints(
            args.checkpoint, args.weights, args.device, DTYPES[args.dtype], target_lang=args.target_lang
        )
    except ValueError as err:  # the device, or the target language
        raise UsageError(str(err)) from None
    if args.workers > 1 and translator.device.type != "cpu":
        raise UsageError(f"--workers {args.workers} runs CPU processes; drop it or use --device cpu")
    # The device's fast paths, applied here, where the program starts (fastpaths/optimize.py).
    fast_paths = optimize(translator.model, translator.device, "inference")
    translator.use(fast_paths)
    logger.debug("%s", fast_paths.describe())
    logger.info(
        "loaded %s: %s -> %s, %d parameters, on %s in %s",
        " + ".join(args.checkpoint),
        translator.src_lang or "?",
        translator.tgt_lang or "?",
        translator.model.num_parameters(),
        translator.device,
        args.dtype,
    )
    if args.dtype == "bfloat16":
        native, capability = bf16_capability(translator.device.type)
        if not native:  # it runs (the CPU seam packs in fp32 there), but slower than float32
            logger.warning("--dtype bfloat16 is emulated on this device, slower than float32: %s", capability)
    if args.score_references:
        score_input(args, translator)
        return
    # Workers start now, in the background, while the input is read and tokenized.
    with worker_pool(translator, args.workers, args.threads) as pool:
        translate_input(args, translator, pool)


def _peek(chunks: Iterator[tuple[int, list[str]]]) -> tuple[Iterator[tuple[int, list[str]]], int | None]:
    """``chunks`` as they were, and the number of the first line they hold (None: none)."""
    first = next(chunks, None)
    if first is None:
        return iter([]), None
    return itertools.chain([first], chunks), first[0]


def first_sample(hyps: list[Translation]) -> Translation:
    """A sampled line's first sample (``Translation.sample`` 0), whatever its score."""
    return min(hyps, key=lambda h: h.sample if h.sample is not None else 0)


def read_aligned(path: str | None, option: str) -> list[str] | None:
    """The lines of a file given with ``option`` (one per input line), or None."""
    return None if path is None else decode_lines(read_file(path, option), path, LineMode.LOSSLESS)


def translate_input(args: argparse.Namespace, translator: Translator, pool: WorkerPool | None) -> None:
    """Reads the input, translates it part by part (in ``pool`` if given) and writes every output
    asked for: each part's translations are written and flushed before the next part is read."""
    references = read_aligned(args.references, "--references")
    prefixes = read_aligned(args.prefix, "--prefix")
    options = search_options(args)
    args.skip_lines = 0
    if args.resume:  # the lines complete in --output (and --nbest-output), to which both are cut
        part_lines = args.buffer_size or FILE_PART_LINES
        args.skip_lines = resume_point(args.output, args.nbest_output, args.shard or (0, 1), part_lines)
    chunks, name, known = input_chunks(args)
    if known is not None:  # before translating, where the input's length is known
        same_count(references, f"--references {args.references}", known, name)
        same_count(prefixes, f"--prefix {args.prefix}", known, name)
    if args.resume:
        chunks, first_left = _peek(chunks)
        logger.info(
            "--resume: %s holds %d complete lines; %s",
            args.output,
            args.skip_lines,
            "nothing left to translate" if first_left is None else f"translating from line {first_left}",
        )
    hypotheses: list[str] = []  # kept for --references only: an --input of millions of lines is not held
    n_lines = 0
    plotted: tuple[list[list[int]], list[list[Translation]]] = ([], [])
    n_real = n_tokens = 0
    start = time.perf_counter()
    show = not args.quiet and sys.stderr.isatty()
    with ExitStack() as stack:
        out = stack.enter_context(output(args.output, append=args.resume))
        nbest_out = (
            stack.enter_context(output(args.nbest_output, append=args.resume)) if args.nbest_output else None
        )
        bar = stack.enter_context(tqdm(unit="sent", file=sys.stderr, disable=not show, desc="translate"))
        for first, lines in chunks:
            aligned_lines(references, f"--references {args.references}", first, len(lines), name)
            forced = aligned_lines(prefixes, f"--prefix {args.prefix}", first, len(lines), name)
            sources = translator.encode_sources(lines, name, first)
            real = sum(1 for source in sources if source)
            bar.total = (bar.total or 0) + real
            bar.refresh()
            results = translator.translate_ids(
                sources,
                options,
                args.max_tokens,
                progress=bar.update,
                pool=pool,
                prefixes=None if forced is None else translator.encode_prefixes(forced, args.prefix, first),
            )
            # With sampling, a line's output is its first sample (every sample is a fair draw; the
            # likeliest of several is not), and the n-best file keeps them all.
            best = [
                (hyps[0] if not options.sampling else first_sample(hyps)).text if hyps else ""
                for hyps in results
            ]
            write_lines(best, out)
            if nbest_out is not None:
                write_lines(nbest_rows(results, first), nbest_out)
            n_lines += len(best)
            if references is not None:
                hypotheses.extend(best)
            if args.attention_dir:
                plotted[0].extend(sources)
                plotted[1].extend(results)
            n_real += real
            n_tokens += sum(len(hyps[0].tokens) + 1 for hyps in results if hyps)
    seconds = time.perf_counter() - start
    logger.info(
        "translated %d lines (%d non-empty) in %.1f s: %.1f sentences/s, %.0f output tokens/s",
        n_lines,
        n_real,
        seconds,
        n_real / max(seconds, 1e-9),
        n_tokens / max(seconds, 1e-9),
    )
    if not (args.resume or args.shard):  # a shard, or the rest of a run, answers part of the input
        same_count(references, f"--references {args.references}", n_lines, name)
        same_count(prefixes, f"--prefix {args.prefix}", n_lines, name)
    if args.attention_dir:
        from translation.attention_plot import write_attention  # matplotlib only when asked for

        if len(args.checkpoint) > 1:
            logger.info("the attention plots show the first checkpoint's model, %s", args.checkpoint[0])
        n_files = write_attention(
            translator, *plotted, args.attention_dir, args.attention_heads, args.attention_max_sentences
        )
        logger.info("wrote %d attention plots to %s", n_files, args.attention_dir)
    if references is not None:
        from translation.metrics import corpus_scores  # sacrebleu only when asked for

        try:
            scores = corpus_scores(hypotheses, references, translator.tgt_lang, args.bleu_tokenize)
        except ValueError as err:  # a tokenizer that cannot be used here: the translations are written
            raise UsageError(f"--references: {err}") from None
        sys.stderr.write(scores.report() + "\n")
        sys.stderr.flush()


def score_input(args: argparse.Namespace, translator: Translator) -> None:
    """Writes, for each input line, the log-probability of its line of ``--score-references``."""
    targets = read_aligned(args.score_references, "--score-references")
    assert targets is not None
    chunks, name, known = input_chunks(args)
    if known is not None:
        same_count(targets, f"--score-references {args.score_references}", known, name)
    scored = 0
    show = not args.quiet and sys.stderr.isatty()
    with (
        output(args.output) as out,
        tqdm(unit="pair", file=sys.stderr, disable=not show, desc="score") as bar,
    ):
        for first, lines in chunks:
            given = aligned_lines(
                targets, f"--score-references {args.score_references}", first, len(lines), name
            )
            assert given is not None
            bar.total = (bar.total or 0) + len(lines)
            scores = translator.score_ids(
                translator.encode_sources(lines, name, first),
                translator.encode_targets(given, args.score_references, first),
                args.max_tokens or DEFAULT_MAX_TOKENS,
                progress=bar.update,
            )
            write_lines(score_rows(scores), out)
            scored += len(lines)
    same_count(targets, f"--score-references {args.score_references}", scored, name)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, or 2 for a one-line error)."""
    args = parse_args(argv)
    with stderr_logging(args.quiet):
        try:
            run(args)
        except (CheckpointError, UsageError) as err:
            what = "checkpoint " if isinstance(err, CheckpointError) else ""
            message = " ".join(str(err).split("\n"))
            sys.stderr.write(f"{PROG}: error: {what}{message}\n")
            return 2
        except BrokenProcessPool as err:
            sys.stderr.write(f"{PROG}: error: a worker process died (out of memory?): {err}\n")
            return 1
        except BrokenPipeError:  # e.g. piped into `head`: stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except KeyboardInterrupt:
            sys.stderr.write(f"{PROG}: interrupted\n")
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
