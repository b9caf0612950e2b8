"""Translate text with a trained checkpoint: one output line per input line, in input order.

    python translate.py --checkpoint runs/x/checkpoints/best.ckpt < test.de > test.en
    python translate.py --checkpoint best.ckpt --input test.de --references test.en
    python translate.py --checkpoint best.ckpt "Ein Hund läuft." --attention-dir attn/
    python translate.py --checkpoint a.ckpt b.ckpt --input test.de               # an ensemble
    python translate.py --checkpoint best.ckpt --sampling --topk 10 --seed 1 < mono.de
    python translate.py --checkpoint best.ckpt --input test.de --score-references test.en
    python translate.py --checkpoint best.ckpt --input mono.de --output part0.en --shard 0/2
    python3 -m translation.parts part0.en part1.en > mono.en                     # the shards merged

Only translations go to stdout; progress, warnings and scores go to stderr. A broken checkpoint or
a wrong option gives a one-line error and exit status 2. The command line only: it parses, builds
the translator and runs; the work is in the ``translation`` package (its Python API):
``options.py`` and ``usage.py`` (the options and their checks), ``translator.py`` (batching,
search), ``checkpoint.py`` (loading), ``inputs.py``, ``parts.py`` and ``stream.py`` (where lines
come from), ``pipeline.py`` (translating part by part), ``scoring.py`` (``--score-references``),
``terminology.py`` (``--constraints``),
``outputs.py`` (the output formats), ``resume.py`` and ``shards.py`` (``--resume``, ``--shard``),
``workers.py`` and ``attention_plot.py``. Lightning and Hydra are never imported here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

import torch

from fastpaths.hardware import bf16_capability
from fastpaths.optimize import optimize
from fastpaths.packed import bound_kernel_caches
from translation.checkpoint import CheckpointError
from translation.console import stderr_logging
from translation.inputs import check_readable
from translation.options import DTYPES, PROG
from translation.pipeline import TranslationRun
from translation.scoring import score_input
from translation.shards import ShardError
from translation.translator import Translator
from translation.usage import UsageError, checkpoint_search, parse_args, search_options
from translation.workers import WorkerPool

__all__ = ["main", "parse_args", "search_options", "worker_pool"]

logger = logging.getLogger("translate")


@contextmanager
def worker_pool(translator: Translator, workers: int, threads: int | None) -> Iterator[WorkerPool | None]:
    """``workers`` processes of ``threads`` threads (default 1) each; None for one (this process)."""
    if workers == 1:
        yield None
        return
    logger.info("starting %d worker processes of %d thread(s) each", workers, threads or 1)
    with WorkerPool(translator.model, workers, threads or 1) as pool:
        yield pool


def load_translator(args: argparse.Namespace) -> Translator:
    """The checkpoints' translator on ``--device`` in ``--dtype``, with the device's fast paths."""
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
    return translator


def run(args: argparse.Namespace) -> None:
    """Builds the translator and translates (or scores) the input, as ``args`` say."""
    # Before the first matmul: a few kernels kept instead of one per row count decoding meets
    # (fastpaths/packed.py), so batches fit in less memory and need no padded rows.
    bound_kernel_caches()
    if args.threads is not None and args.workers == 1:
        torch.set_num_threads(args.threads)
    # Files first (cheap, and a typo is reported at once), then the model, then stdin: an
    # interactive user learns about a bad checkpoint before typing.
    for option in ("input", "references", "score_references", "prefix"):
        check_readable(f"--{option.replace('_', '-')}", getattr(args, option))
    translator = load_translator(args)
    # The search options not given take the checkpoint's settings (its test stage's).
    args.decoding = checkpoint_search(args, translator.search_settings)
    if args.score_references:
        score_input(args, translator)
        return
    # Workers start now, in the background, while the input is read and tokenized.
    with worker_pool(translator, args.workers, args.threads) as pool:
        TranslationRun(args, translator, pool).run()


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, or 2 for a one-line error)."""
    args = parse_args(argv)
    with stderr_logging(args.quiet):
        try:
            run(args)
        except (CheckpointError, UsageError, ShardError) as err:
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
