"""A large input translated in parts: bounded memory, output as it is made, resumable, shardable.

Back-translating a monolingual corpus of millions of lines takes hours. ``translate.py --input
FILE`` reads the file a part of ``--buffer-size`` lines at a time (:func:`file_parts`; default
:data:`FILE_PART_LINES`), translates it, appends its lines to the output in input order and
flushes them before reading the next part, so memory stays bounded and a crash loses the part
being translated only. ``--resume`` continues an interrupted ``--output`` file
(``translation/resume.py``).

``--shard I/N`` splits a corpus between N processes or machines: process I translates parts I,
I + N, I + 2N, ... and records what its output holds beside it (``translation/shards.py``).
``python3 -m translation.parts OUT0 OUT1 ...`` (:func:`main`) merges the N outputs into one, in
input order, from their records alone: no setting is repeated by hand, and outputs that are not
the N complete shards of one input are refused, naming the file at fault.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from data.lines import LineMode, decode_lines
from translation.shards import WHOLE, InputDigest, ShardError, merge_shards
from translation.stream import line_chunks

# Lines a part of an --input file holds by default: thousands of sentences to sort into batches,
# a few MiB of text and results held at once.
FILE_PART_LINES = 10_000


def count_lines(path: str | Path) -> int:
    """The lines of a file as :func:`file_parts` reads them (a last line without ``\\n`` counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def file_parts(
    path: str | Path,
    part_lines: int,
    shard: tuple[int, int] = WHOLE,
    skip: int = 0,
    digest: InputDigest | None = None,
) -> Iterator[tuple[int, list[str]]]:
    """``(number of its first line, lines)`` of each part of ``path`` this shard translates.

    Args:
        path: the input (a file, or a named pipe).
        part_lines: lines per part (the last may have fewer).
        shard: (I, N): every N-th part from part I.
        skip: lines of this shard's parts already translated (``--resume``): not yielded.
        digest: fed every line of the input, this shard's or not, as it is read: once the
            parts are exhausted, the whole input's fingerprint.
    """
    index, count = shard
    number = 1
    with open(path, "rb") as f:
        for part, chunk in enumerate(_whole_chunks(f, part_lines)):
            if digest is not None:
                digest.update(chunk)
            first = number
            number += len(chunk)
            if part % count != index:
                continue
            lines = decode_lines(b"\n".join(chunk) + b"\n", str(path), LineMode.LOSSLESS, first_line=first)
            if skip >= len(lines):
                skip -= len(lines)
                continue
            yield first + skip, lines[skip:]
            skip = 0


def _whole_chunks(f: BinaryIO, part_lines: int) -> Iterator[list[bytes]]:
    """Chunks of exactly ``part_lines`` lines (the last one shorter): a file's parts do not depend
    on how its bytes arrive, so every shard cuts the same parts."""
    held: list[bytes] = []
    for chunk in line_chunks(f.fileno(), part_lines):
        held.extend(chunk)
        while len(held) >= part_lines:
            yield held[:part_lines]
            held = held[part_lines:]
    if held:
        yield held


def main(argv: list[str] | None = None) -> int:
    """``python3 -m translation.parts OUT0 OUT1 ...``: the shards merged to stdout; 0, or 1 with
    a one-line error naming the file at fault."""
    parser = argparse.ArgumentParser(
        prog="python3 -m translation.parts",
        description="Merge the outputs of translate.py --output OUT --shard I/N, I = 0 .. N-1, into one "
        "in input order (stdout), as the record beside each (OUT.shard.json) says.",
    )
    parser.add_argument("outputs", nargs="+", help="the shards' --output files, in any order")
    parser.add_argument(
        "--buffer-size",
        type=int,
        metavar="N",
        help="not needed (the shards' records give their part size); given, the shards must have it",
    )
    args = parser.parse_args(argv)
    try:
        merge_shards(args.outputs, sys.stdout.buffer, args.buffer_size)
    except (OSError, ShardError) as err:
        sys.stderr.write(f"translation.parts: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
