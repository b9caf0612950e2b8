"""Peak memory of ``translate.py`` and what each part of it costs.

    python bench/translate_memory.py    # the newest runs/multi30k_de_en/*/checkpoints/averaged.ckpt
    python bench/translate_memory.py --checkpoint CKPT --max-tokens 2048 4096 20480

Two measurements, each in fresh processes (peak memory only ever grows within a process):

1. **End to end**: ``translate.py --checkpoint CKPT --input test_2016_flickr.de --quiet`` as a user
   runs it, with default options and then with each ``--max-tokens`` asked; peak resident memory
   (``ru_maxrss`` of the child, as ``/usr/bin/time -v`` reports it) and wall time.
2. **Where it goes**: a child that does what ``translate.py`` does, one stage at a time, and prints
   resident memory (RSS) and its peak after each: ``import torch``, ``import translation``, the
   checkpoint loaded, then every batch of the translation. With glibc it also prints the heap in
   use and free (``mallinfo2``): a free heap that grows batch after batch is fragmentation, an
   in-use heap that grows is something kept (such as oneDNN's kernels).

Not a test: the figures depend on the machine and the checkpoint. Results: BENCHMARKS.md,
"Translation memory".
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

# Only the standard library above this line and in bench.harness: the stages child measures its
# own imports.
from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    environment,
    find_checkpoint,
    peak_rss_mib,
    print_config,
    rss_mib,
    run_measured,
    timed,
)


def _heap() -> str:
    """glibc's heap in use / free (MiB), or "" where mallinfo2 does not exist."""

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        ]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return ""
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    used, free, mapped = (v / 2**20 for v in (info.uordblks, info.fordblks, info.hblkhd))
    return f"{used:.0f} / {free:.0f} / {mapped:.0f}"


def stages(checkpoint: str, source: str, max_tokens: int | None) -> None:
    """The child of part 2: one line per stage, ``stage | RSS | peak | heap``."""

    def row(stage: str) -> None:
        print(f"| {stage} | {rss_mib():.0f} | {peak_rss_mib():.0f} | {_heap()} |", flush=True)

    print("| stage | RSS MiB | peak MiB | glibc heap in use / free / mmapped MiB |")
    print("|---|---|---|---|")
    row("start")
    import torch  # noqa: F401

    row("`import torch`")
    from data.lines import LineMode, decode_lines
    from translation.translator import DEFAULT_MAX_TOKENS, SearchOptions, Translator

    row("`import translation.translator`")
    translator = Translator.from_checkpoint(checkpoint)
    row("checkpoint loaded")
    sources = translator.encode_sources(decode_lines(Path(source).read_bytes(), source, LineMode.LOSSLESS))
    done = [0]

    def batch_done(n: int) -> None:
        done[0] += 1
        row(f"after batch {done[0]} ({n} sentences)")

    budget = max_tokens or DEFAULT_MAX_TOKENS
    seconds, _ = timed(
        lambda: translator.translate_ids(sources, SearchOptions(), budget, progress=batch_done)
    )
    print(f"\n{len(sources)} sentences in {seconds:.1f} s, {done[0]} batches")


def end_to_end(
    checkpoint: str, source: str, max_tokens: int | None, threads: int | None
) -> tuple[float, float]:
    """Peak RSS (MiB) and wall time (s) of one ``translate.py`` run."""
    command = [
        sys.executable,
        str(ROOT / "translate.py"),
        "--checkpoint",
        checkpoint,
        "--input",
        source,
        "--quiet",
    ]
    if max_tokens is not None:
        command += ["--max-tokens", str(max_tokens)]
    if threads is not None:
        command += ["--threads", str(threads)]
    child, wall, peak = run_measured(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if child.returncode != 0:
        raise SystemExit(f"translate.py failed ({child.returncode}): {child.stderr.read().decode()[-2000:]}")
    return peak, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--checkpoint", help="default: the newest runs/multi30k_de_en/*/checkpoints/averaged.ckpt"
    )
    parser.add_argument("--source", help="default: test_2016_flickr.de of the Multi30k directory")
    parser.add_argument(
        "--max-tokens", type=int, nargs="*", default=[4096, 20480], help="budgets to run besides the default"
    )
    parser.add_argument("--threads", type=int, help="translate.py --threads (default: its own default)")
    parser.add_argument("--stages-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stages_child:
        stages(args.checkpoint, args.source, args.max_tokens[0] if args.max_tokens else None)
        return

    print_config("translate_memory", {"checkpoint": args.checkpoint, "max_tokens": args.max_tokens})
    print_config("environment", environment(args.threads or os.cpu_count() or 1))
    checkpoint = args.checkpoint or find_checkpoint("multi30k_de_en")
    if checkpoint is None:
        raise SystemExit(
            "no checkpoint: train one (python3 train.py experiment=multi30k_de_en) or give --checkpoint"
        )
    with tempfile.TemporaryDirectory() as tmp:
        source = args.source
        if source is None:
            source = str(Path(tmp) / "test_2016_flickr.de")
            Path(source).write_bytes(gzip.open(MULTI30K_DIR / "test_2016_flickr.de.gz").read())
        print(f"checkpoint {checkpoint}\nsource {source}\n")
        print("| translate.py | peak MiB | wall s |\n|---|---|---|")
        for max_tokens in [None, *args.max_tokens]:
            peak, wall = end_to_end(str(checkpoint), source, max_tokens, args.threads)
            setting = "default options" if max_tokens is None else f"--max-tokens {max_tokens}"
            print(f"| {setting} | {peak:.0f} | {wall:.1f} |", flush=True)
        print()
        env = dict(os.environ)
        if args.threads is not None:
            env["OMP_NUM_THREADS"] = str(args.threads)
        command = [
            sys.executable,
            __file__,
            "--stages-child",
            "--checkpoint",
            str(checkpoint),
            "--source",
            source,
        ]
        command.append("--max-tokens")  # none: translate.py's default budget
        subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
