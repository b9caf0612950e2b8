"""Translate text with a trained checkpoint: one output line per input line, in input order.

    python translate.py --checkpoint runs/x/checkpoints/best.ckpt < test.de > test.en
    python translate.py --checkpoint best.ckpt --input test.de --references test.en
    python translate.py --checkpoint best.ckpt "Ein Hund läuft." --attention-dir attn/

Only translations go to stdout; progress, warnings and scores go to stderr. A broken checkpoint or
a wrong option gives a one-line error and exit status 2. The command line only: parsing, reading,
writing. The work is in the ``translation`` package (its Python API):
``translator.py`` (batching, search), ``checkpoint.py`` (loading), ``workers.py`` and
``attention_plot.py``; input lines are read by ``data/lines.py`` in its lossless mode. Lightning
and Hydra are never imported here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm import tqdm

from data.lines import LineMode, decode_lines
from fastpaths.packed import bound_kernel_caches
from transformer.hardware import bf16_capability
from translation.checkpoint import CheckpointError
from translation.translator import DEFAULT_MAX_TOKENS, SearchOptions, Translation, Translator
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
"""

EXAMPLES = """\
examples:
  python translate.py --checkpoint best.ckpt < test.de > test.en
  python translate.py --checkpoint best.ckpt --input test.de --references test.en --beam-size 5
  python translate.py --checkpoint best.ckpt "Ein Hund rennt." --attention-dir attn/ --attention-heads
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
    add("--checkpoint", required=True, metavar="PATH", help="checkpoint written by training")
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
        help="reference translations, one per input line: after translating, print sacreBLEU and "
        "chrF with their signatures to stderr",
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
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help="batch lines sorted by length so that each batch has at most N padded tokens, counting "
        "each source once per hypothesis (sentences x beam size x longest source; greedy counts 1): "
        "larger is faster and needs more memory; output order is the input order (default: %(default)s)",
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("beam_size", "nbest", "max_tokens", "attention_max_sentences"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.greedy and args.nbest > 1:
        parser.error("--nbest > 1 needs beam search: drop --greedy")
    if args.greedy and args.nbest_output:
        parser.error(
            "--nbest-output needs beam search scores: drop --greedy (--beam-size 1 is greedy with scores)"
        )
    if args.nbest > args.beam_size:
        parser.error(f"--nbest {args.nbest} is larger than --beam-size {args.beam_size}")
    if args.sentences and args.input is not None:
        parser.error("give sentences as arguments or --input, not both")
    if args.attention_heads and not args.attention_dir:
        parser.error("--attention-heads needs --attention-dir")
    return args


def read_input(args: argparse.Namespace) -> tuple[list[str], str]:
    """The input lines and the name used for them in warnings."""
    if args.sentences:
        # Each argument is one line; os.fsencode recovers the bytes of undecodable arguments.
        raw = [os.fsencode(s).replace(b"\n", b" ") for s in args.sentences]
        return decode_lines(b"\n".join(raw) + b"\n", "<arguments>", LineMode.LOSSLESS), "<arguments>"
    if args.input is None or args.input == "-":
        if sys.stdin.isatty():
            logger.info("reading sentences from the terminal, one per line; end with Ctrl-D")
        return decode_lines(sys.stdin.buffer.read(), "<stdin>", LineMode.LOSSLESS), "<stdin>"
    return decode_lines(read_file(args.input, "--input"), args.input, LineMode.LOSSLESS), args.input


def read_file(path: str, option: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise UsageError(f"{option} {path}: {err.strerror or err}") from None


def write_lines(lines: list[str], path: str | None) -> None:
    """UTF-8, '\\n'-ended, whatever the locale; stdout when ``path`` is None."""
    payload = "".join(line + "\n" for line in lines).encode("utf-8")
    if path is None:
        sys.stdout.buffer.write(payload)
        sys.stdout.buffer.flush()
        return
    try:
        Path(path).write_bytes(payload)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror or err}") from None


def nbest_rows(results: list[list[Translation]]) -> list[str]:
    return [
        f"{number}\t{rank}\t{hyp.score:.6f}\t{hyp.text.replace(chr(9), ' ')}"
        for number, hyps in enumerate(results, start=1)
        for rank, hyp in enumerate(hyps, start=1)
    ]


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
    for option, path in (("--input", args.input), ("--references", args.references)):
        if path not in (None, "-") and not Path(path).is_file():
            raise UsageError(f"{option} {path}: no such file")
    try:
        translator = Translator.from_checkpoint(
            args.checkpoint, args.device, DTYPES[args.dtype], target_lang=args.target_lang
        )
    except ValueError as err:  # the device, or the target language
        raise UsageError(str(err)) from None
    if args.workers > 1 and translator.device.type != "cpu":
        raise UsageError(f"--workers {args.workers} runs CPU processes; drop it or use --device cpu")
    logger.info(
        "loaded %s: %s -> %s, %d parameters, on %s in %s",
        args.checkpoint,
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
    # Workers start now, in the background, while the input is read and tokenized.
    with worker_pool(translator, args.workers, args.threads) as pool:
        translate_input(args, translator, pool)


def translate_input(args: argparse.Namespace, translator: Translator, pool: WorkerPool | None) -> None:
    """Reads the input, translates it (in ``pool`` if given) and writes every output asked for."""
    lines, name = read_input(args)
    references = None
    if args.references:
        references = decode_lines(
            read_file(args.references, "--references"), args.references, LineMode.LOSSLESS
        )
        if len(references) != len(lines):
            raise UsageError(
                f"--references {args.references} has {len(references)} lines "
                f"but the input ({name}) has {len(lines)}"
            )
    options = SearchOptions(
        beam_size=1 if args.greedy else args.beam_size,
        nbest=args.nbest,
        alpha=args.length_penalty,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        greedy=args.greedy,
    )
    start = time.perf_counter()
    sources = translator.encode_sources(lines, name)
    n_real = sum(1 for s in sources if s)
    show = not args.quiet and sys.stderr.isatty()
    with tqdm(total=n_real, unit="sent", file=sys.stderr, disable=not show, desc="translate") as bar:
        results = translator.translate_ids(sources, options, args.max_tokens, progress=bar.update, pool=pool)
    seconds = time.perf_counter() - start
    hypotheses = [hyps[0].text if hyps else "" for hyps in results]
    write_lines(hypotheses, args.output)
    n_tokens = sum(len(hyps[0].tokens) + 1 for hyps in results if hyps)
    logger.info(
        "translated %d lines (%d non-empty) in %.1f s: %.1f sentences/s, %.0f output tokens/s",
        len(lines),
        n_real,
        seconds,
        n_real / max(seconds, 1e-9),
        n_tokens / max(seconds, 1e-9),
    )
    if args.nbest_output:
        write_lines(nbest_rows(results), args.nbest_output)
    if args.attention_dir:
        from translation.attention_plot import write_attention  # matplotlib only when asked for

        n_files = write_attention(
            translator,
            sources,
            results,
            args.attention_dir,
            args.attention_heads,
            args.attention_max_sentences,
        )
        logger.info("wrote %d attention plots to %s", n_files, args.attention_dir)
    if references is not None:
        from translation.metrics import corpus_scores  # sacrebleu only when asked for

        sys.stderr.write(corpus_scores(hypotheses, references).report() + "\n")
        sys.stderr.flush()


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
