"""Shards: one input translated by N processes, merged back.

``translate.py --input FILE --shard I/N`` translates parts I, I + N, I + 2N, ... of FILE (its
parts of ``--buffer-size`` lines, numbered from 0: every N-th part, so that each shard gets the
file's long and short stretches alike); :func:`merge_shards` (``python3 -m translation.parts``)
interleaves the N outputs back into one, part by part, given the same ``--buffer-size``.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, NamedTuple


class Shard(NamedTuple):
    """Shard ``index`` (from 0) of ``count``: the input's parts index, index + count, ..."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard(0, 1)  # an unsharded run: every part


def parse_shard(text: str) -> Shard:
    """``"I/N"`` -> Shard(I, N), 0 <= I < N.

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
    return Shard(i, n)


def shard_position(line: int, shard: tuple[int, int], part_lines: int) -> int:
    """The position among a shard's lines of input line ``line`` (from 0), or of the first line
    of the shard after it where it is another shard's. ``line`` = the input's length gives the
    number of lines the shard holds."""
    index, n = shard
    part, within = divmod(line, part_lines)
    mine = part // n  # this shard's parts before the line's part
    if part % n == index:
        return mine * part_lines + within
    return (mine + (1 if part % n > index else 0)) * part_lines


def input_line(position: int, shard: tuple[int, int], part_lines: int) -> int:
    """The input line (from 0) of a shard's ``position``-th line."""
    index, n = shard
    part, within = divmod(position, part_lines)
    return (part * n + index) * part_lines + within


def merge_shards(outputs: list[str | Path], part_lines: int, out: BinaryIO) -> int:
    """Interleaves the N shards' outputs (shard 0 first) into the whole output, ``part_lines`` lines from
    each in turn (shard I answered parts I, I + N, ...); returns the lines written.

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
                lines = [line for line in (reader.readline() for _ in range(part_lines)) if line]
                if ended and lines:
                    raise ValueError(f"{outputs[i]}: lines left after a shorter shard ended")
                ended = ended or len(lines) < part_lines
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
