"""Shards: one input translated by N processes, each recording what its output holds; merged back.

``translate.py --input FILE --output OUT --shard I/N`` translates parts I, I + N, I + 2N, ... of
FILE (its parts of ``--buffer-size`` lines, numbered from 0: every N-th part, so that each shard
gets the file's long and short stretches alike) and keeps ``OUT.shard.json`` beside OUT, the
:class:`ShardRecord` of what OUT holds: I/N, the part size, and, once the run has finished, the
input's line count and fingerprint (:class:`InputDigest`) and the lines written. ``--resume`` on a
shard refuses an output recorded with another I/N or part size.

``python3 -m translation.parts OUT0 OUT1 ...`` (:func:`merge_shards`) reads the records, so it
needs no setting repeated by hand: it checks that the outputs are the N shards of one input, each
finished and holding exactly the lines its share of the input has, then interleaves them part by
part (:func:`interleave`) into input order. Anything else (a shard missing or given twice, one
unfinished or cut short, shards of two inputs, of different N or part sizes) is a
:class:`ShardError` naming the file at fault.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import BinaryIO, NamedTuple

RECORD_SUFFIX = ".shard.json"


class ShardError(ValueError):
    """Shards that cannot be merged or resumed as asked; the message names the file at fault."""


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


class InputDigest:
    """The input's fingerprint, fed the lines as they are read: how many, and the SHA-256 of the
    lines each ended by ``\\n`` (a last line without its ``\\n`` counts as with it)."""

    def __init__(self) -> None:
        self.lines = 0
        self._sha = hashlib.sha256()

    def update(self, lines: list[bytes]) -> None:
        """Adds the next ``lines`` of the input (without their ``\\n``)."""
        if lines:
            self._sha.update(b"\n".join(lines) + b"\n")
            self.lines += len(lines)

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


@dataclass(frozen=True)
class ShardRecord:
    """What a shard's output holds, kept beside it as ``OUTPUT.shard.json``.

    Attributes:
        input: the input file as given (for messages).
        index, count: the shard, I of N.
        part_lines: the lines of a part (``--buffer-size``).
        input_lines, input_sha256: the input's :class:`InputDigest`; None until the run finished.
        lines: the lines the output holds; None until the run finished.
    """

    input: str
    index: int
    count: int
    part_lines: int
    input_lines: int | None = None
    input_sha256: str | None = None
    lines: int | None = None

    @property
    def shard(self) -> Shard:
        return Shard(self.index, self.count)

    @property
    def finished(self) -> bool:
        return self.lines is not None

    @property
    def expected_lines(self) -> int:
        """The lines this shard's share of the input has (a finished record only)."""
        assert self.input_lines is not None
        return shard_position(self.input_lines, self.shard, self.part_lines)

    def describe(self) -> str:
        """``shard 1/2 of in.de (40 lines, in parts of 10)``."""
        size = "" if self.input_lines is None else f"{self.input_lines} lines, "
        return f"shard {self.shard} of {self.input} ({size}in parts of {self.part_lines})"

    def unfinished(self) -> ShardRecord:
        """The record while a resumed run writes: unfinished, the input's fingerprint kept."""
        return replace(self, lines=None)

    def finish(self, digest: InputDigest, lines: int, input_name: str) -> ShardRecord:
        """The record of the finished run that read its input ``input_name`` as ``digest`` and
        left ``lines`` in the output.

        Raises:
            ShardError: a resumed run whose record was finished before from another input.
        """
        fingerprint = (digest.lines, digest.sha256)
        if self.input_sha256 is not None and fingerprint != (self.input_lines, self.input_sha256):
            raise ShardError(
                f"{input_name}: not the input the output it resumes was made from, {self.describe()} "
                f"(SHA-256 {self.input_sha256[:12]}...); it has {digest.lines} lines, SHA-256 "
                f"{digest.sha256[:12]}..."
            )
        return replace(self, input_lines=digest.lines, input_sha256=digest.sha256, lines=lines)

    @staticmethod
    def path_of(output: str | Path) -> Path:
        """Where the record of ``output`` is kept: beside it."""
        return Path(f"{output}{RECORD_SUFFIX}")

    def write(self, output: str | Path) -> None:
        """Writes the record beside ``output``, whole or not at all (a new file moved over the old)."""
        path = self.path_of(output)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, path)

    @classmethod
    def read(cls, output: str | Path) -> ShardRecord | None:
        """The record beside ``output``; None where there is none.

        Raises:
            ShardError: a record that cannot be read, naming it.
        """
        path = cls.path_of(output)
        if not path.exists():
            return None
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as err:
            raise ShardError(f"{path}: not a shard record of translate.py ({err})") from None


def check_resumable(output: str | Path, shard: Shard | None, part_lines: int) -> None:
    """Refuses to ``--resume`` an output that holds lines made as another shard, or with another
    part size, or without a record of the shard it holds.

    Args:
        output: the ``--output`` file, which holds lines.
        shard: this run's ``--shard``, or None.
        part_lines: this run's part size.

    Raises:
        ShardError: naming the output and how it was made.
    """
    record = ShardRecord.read(output)
    if record is None:
        if shard is not None:
            raise ShardError(
                f"{output} has no record {ShardRecord.path_of(output)} of the shard it holds: it was "
                "not written with --shard; translate the shard afresh (without --resume)"
            )
        return
    if shard is None:
        raise ShardError(
            f"{output} holds {record.describe()}: resume it with --shard {record.shard} "
            f"--buffer-size {record.part_lines}"
        )
    if (record.shard, record.part_lines) != (shard, part_lines):
        raise ShardError(
            f"{output} holds {record.describe()}, not shard {shard} in parts of {part_lines}: "
            f"resume it with --shard {record.shard} --buffer-size {record.part_lines}"
        )


def _complete_lines(path: Path) -> int:
    """The lines of ``path``.

    Raises:
        ShardError: its last line has no ``\\n`` (a write cut short).
    """
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    if last != b"\n":
        raise ShardError(
            f"{path}: its last line is cut short (an interrupted run: continue it with --resume)"
        )
    return count


def _finished_record(output: Path) -> ShardRecord:
    """The record of a shard's output that finished and holds the lines it should."""
    record = ShardRecord.read(output)
    if record is None:
        raise ShardError(
            f"{output}: no {ShardRecord.path_of(output).name} beside it, so not an output of "
            "translate.py --output FILE --shard I/N (or one whose record was removed)"
        )
    if not record.finished:
        raise ShardError(
            f"{output}: {record.describe()} did not finish (continue it with translate.py ... --resume)"
        )
    lines = _complete_lines(output)
    if lines != record.lines or lines != record.expected_lines:
        raise ShardError(
            f"{output}: {lines} lines, but {record.describe()} holds {record.expected_lines}: "
            "cut short or changed after it was written"
        )
    return record


def _check_one_set(outputs: list[Path], records: list[ShardRecord]) -> None:
    """Refuses records that are not shards 0 .. N-1 of one input, each once."""
    first, first_path = records[0], outputs[0]
    for path, record in zip(outputs, records, strict=True):
        if (record.input_lines, record.input_sha256) != (first.input_lines, first.input_sha256):
            raise ShardError(
                f"{path}: {record.describe()} is of another input than {first_path}, {first.describe()} "
                "(their lines differ)"
            )
        if record.count != first.count:
            raise ShardError(f"{path}: one of {record.count} shards, but {first_path} one of {first.count}")
        if record.part_lines != first.part_lines:
            raise ShardError(
                f"{path}: in parts of {record.part_lines} lines, but {first_path} in parts of "
                f"{first.part_lines}: translate the shards with one --buffer-size"
            )
    seen: dict[int, Path] = {}
    for path, record in zip(outputs, records, strict=True):
        if record.index in seen:
            raise ShardError(f"{path}: shard {record.shard} again (also {seen[record.index]})")
        seen[record.index] = path
    missing = [f"{i}/{first.count}" for i in range(first.count) if i not in seen]
    if missing:
        raise ShardError(
            f"shard {', '.join(missing)} of {first.input} missing: the outputs given "
            f"({', '.join(map(str, outputs))}) hold {len(seen)} of its {first.count} shards"
        )


def merge_shards(outputs: list[str | Path], out: BinaryIO, part_lines: int | None = None) -> int:
    """Writes the whole output of the N shards' ``outputs`` (in any order) to ``out``, in input
    order, as their records say; returns the lines written.

    Args:
        outputs: the shards' ``--output`` files, each with its record beside it.
        out: where the merged lines go.
        part_lines: None (the records' part size), or the part size the shards must have.

    Raises:
        ShardError: the outputs are not the finished, complete shards of one input (or not of
            ``part_lines``), naming the file at fault; nothing is written then.
    """
    paths = [Path(p) for p in outputs]
    records = [_finished_record(path) for path in paths]
    _check_one_set(paths, records)
    if part_lines is not None and records[0].part_lines != part_lines:
        raise ShardError(
            f"{paths[0]}: {records[0].describe()}, not in parts of --buffer-size {part_lines} "
            "(the records give the part size: drop --buffer-size)"
        )
    in_order = [path for _, path in sorted(zip((r.index for r in records), paths, strict=True))]
    return interleave(in_order, records[0].part_lines, out)


def interleave(outputs: list[Path], part_lines: int, out: BinaryIO) -> int:
    """Interleaves shard outputs (shard 0 first) into the whole output, ``part_lines`` lines from
    each in turn (shard I answered parts I, I + N, ...); returns the lines written.

    Raises:
        ShardError: a shard has lines left once the others ran out of whole parts (their sizes
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
                    raise ShardError(f"{outputs[i]}: lines left after a shorter shard ended")
                ended = ended or len(lines) < part_lines
                out.write(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines))
                written += len(lines)
        for i, reader in enumerate(readers):
            if reader.readline():
                raise ShardError(f"{outputs[i]}: lines left after a shorter shard ended")
    finally:
        for reader in readers:
            reader.close()
    out.flush()
    return written
