"""A large input translated in parts: bounded memory, output as it is made, resumable, shardable.

Back-translating a monolingual corpus of millions of lines takes hours. ``translate.py --input
FILE`` reads the file a part of ``--buffer-size`` lines at a time (:func:`file_parts`; default
:data:`FILE_PART_LINES`), translates it, appends its lines to the output in input order and
flushes them before reading the next part, so memory stays bounded and a crash loses the part
being translated only.

``--resume`` continues an interrupted ``--output`` file (:func:`resume_lines`): its complete lines
are kept (a last line without its ``\\n`` is cut), the input lines they answer are skipped, and the
rest is appended, so the file ends as an uninterrupted run's would.

``--shard I/N`` splits a corpus between N processes or machines: the input's parts are numbered
from 0 and process I translates parts I, I + N, I + 2N, ... (every N-th part, so each gets the
file's long and short stretches alike); :func:`merge_shards` (``python3 -m translation.parts``)
interleaves the N outputs back into one, part by part, given the same ``--buffer-size``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from data.lines import LineMode, decode_lines
from translation.stream import line_chunks

# Lines a part of an --input file holds by default: thousands of sentences to sort into batches,
# a few MiB of text and results held at once.
FILE_PART_LINES = 10_000


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N), 0 <= I < N.

    Raises:
        ValueError: not of that form, saying what is expected.
    """
    index, _, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"--shard {text!r}: give I/N, this process's shard of N (I from 0 to N-1)") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: I must be from 0 to N-1 and N at least 1")
    return i, n


def count_lines(path: str | Path) -> int:
    """The lines of a file as :func:`file_parts` reads them (a last line without ``\\n`` counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def file_parts(
    path: str | Path, part_lines: int, shard: tuple[int, int] = (0, 1), skip: int = 0
) -> Iterator[tuple[int, list[str]]]:
    """``(number of its first line, lines)`` of each part of ``path`` this shard translates.

    Args:
        path: the input (a file, or a named pipe).
        part_lines: lines per part (the last may have fewer).
        shard: (I, N): every N-th part from part I.
        skip: lines of this shard's parts already translated (``--resume``): not yielded.
    """
    index, count = shard
    number = 1
    with open(path, "rb") as f:
        for part, chunk in enumerate(_whole_chunks(f, part_lines)):
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


def resume_lines(path: str | Path) -> int:
    """The complete lines of an interrupted output file, which it is cut to (a last line without
    its ``\\n`` is removed): the input lines already answered. 0 for a missing file."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
    return data[:keep].count(b"\n")


def resume_point(
    output: str | Path,
    nbest: str | Path | None = None,
    shard: tuple[int, int] = (0, 1),
    part_lines: int = FILE_PART_LINES,
) -> int:
    """Where ``--resume`` continues: the input lines whose answers are complete in ``output``
    and, given, in the ``nbest`` file, to which both files are cut.

    ``output`` counts its complete lines. The n-best file's rows name their input line (from 1,
    in the whole input); the last line it names may have lost rows to the interruption, so only
    lines before it count (an n-best file without rows, or missing, counts none). Both files are
    written a part at a time, so either may be ahead of the other; the earlier one wins.

    Args:
        output: the ``--output`` file.
        nbest: the ``--nbest-output`` file, or None.
        shard: ``(I, N)`` of ``--shard``: the output holds parts I, I + N, ... of the input.
        part_lines: ``--buffer-size``, the lines of a part.

    Returns:
        The number of this shard's input lines answered in both, the first ones.
    """
    done = resume_lines(output)
    if nbest is not None:
        path = Path(nbest)
        rows = path.read_bytes().split(b"\n") if path.exists() else []  # a row cut short names its line too
        named = [int(r.split(b"\t", 1)[0]) for r in rows if r.split(b"\t", 1)[0].isdigit()]
        if named:
            done = min(done, _shard_index(max(named) - 1, shard, part_lines))  # the lines before it
        else:
            done = 0
        _cut_lines(Path(output), done)
        resume_nbest(path, _input_index(done, shard, part_lines) + 1)
    return done


def _shard_index(line: int, shard: tuple[int, int], part_lines: int) -> int:
    """The position among a shard's lines of input line ``line`` (from 0), or of the first line
    of the shard after it where it is another shard's."""
    index, n = shard
    part, within = divmod(line, part_lines)
    mine = part // n  # this shard's parts before the line's part
    if part % n == index:
        return mine * part_lines + within
    return (mine + (1 if part % n > index else 0)) * part_lines


def _input_index(position: int, shard: tuple[int, int], part_lines: int) -> int:
    """The input line (from 0) of a shard's ``position``-th line."""
    index, n = shard
    part, within = divmod(position, part_lines)
    return (part * n + index) * part_lines + within


def _cut_lines(path: Path, lines: int) -> None:
    """Cuts a file to its first ``lines`` lines (a missing file stays missing)."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = 0
    for _ in range(lines):
        end = data.index(b"\n", end) + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)


def resume_nbest(path: str | Path, first_line: int) -> None:
    """Cuts an interrupted ``--nbest-output`` file to its rows of lines before ``first_line`` (its
    rows start with their line number)."""
    path = Path(path)
    if not path.exists():
        return
    kept = [
        row
        for row in path.read_bytes().split(b"\n")
        if row and row.split(b"\t", 1)[0].isdigit() and int(row.split(b"\t", 1)[0]) < first_line
    ]
    path.write_bytes(b"".join(row + b"\n" for row in kept))


def merge_shards(outputs: list[str | Path], part_lines: int, out: BinaryIO) -> int:
    """Interleaves the N shards' outputs into the whole output, ``part_lines`` lines from each in
    turn (shard I answered parts I, I + N, ...); returns the lines written.

    Raises:
        ValueError: a shard has lines left once the others ran out of whole parts (their sizes
            do not fit one input cut into parts of ``part_lines``), naming it.
    """
    readers = [open(p, "rb") for p in outputs]  # noqa: SIM115 (closed below)
    written = 0
    try:
        ended = False
        while not ended:
            for i, reader in enumerate(readers):
                lines = [reader.readline() for _ in range(part_lines)]
                lines = [line for line in lines if line]
                if ended and lines:
                    raise ValueError(f"{outputs[i]}: lines left after a shorter shard ended")
                if len(lines) < part_lines:
                    ended = True
                out.write(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines))
                written += len(lines)
        for i, reader in enumerate(readers):
            if reader.readline():
                raise ValueError(f"{outputs[i]}: lines left after a shorter shard ended")
    finally:
        for reader in readers:
            reader.close()
    out.flush()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m translation.parts",
        description="Interleave the outputs of translate.py --shard 0/N .. N-1/N into one (stdout).",
    )
    parser.add_argument("outputs", nargs="+", help="the shards' --output files, shard 0 first")
    parser.add_argument(
        "--buffer-size",
        type=int,
        default=FILE_PART_LINES,
        help=f"the --buffer-size the shards ran with (default: {FILE_PART_LINES})",
    )
    args = parser.parse_args(argv)
    try:
        merge_shards(args.outputs, args.buffer_size, sys.stdout.buffer)
    except (OSError, ValueError) as err:
        sys.stderr.write(f"translation.parts: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
