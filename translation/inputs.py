"""Where ``translate.py``'s lines come from, and the files that give one line per input line.

:func:`read_input` gives the input as ``(number of its first line, lines)`` parts: SENTENCE
arguments are one part; ``--input FILE`` comes in parts of ``--buffer-size`` lines
(``translation/parts.py``), a shard's only, from where ``--resume`` continues; standard input
comes as it arrives (``translation/stream.py``). Every line is read by ``data/lines.py`` in its
lossless mode, so each gives exactly one output line. :class:`AlignedFile` is ``--references``,
``--prefix`` or ``--score-references``: one line per input line, which it must have.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from data.lines import LineMode, decode_lines
from translation.parts import FILE_PART_LINES, count_lines, file_parts
from translation.shards import WHOLE, InputDigest, Shard
from translation.stream import line_chunks
from translation.usage import UsageError

logger = logging.getLogger("translate")

Parts = Iterator[tuple[int, list[str]]]


@dataclass
class Input:
    """The input to translate.

    Attributes:
        parts: ``(number of its first line, lines)``, in input order.
        name: the input's name, for warnings (``<stdin>``, ``<arguments>``, the file).
        known: its number of lines where it is known before reading (a whole regular file or
            the arguments); None otherwise.
    """

    parts: Parts
    name: str
    known: int | None


def check_readable(option: str, path: str | None) -> None:
    """Refuses a file option (``--input``, ``--references``, ...) that names no file to read."""
    # exists, not is_file: a named pipe or a shell's <(...) is a file to read too
    if path not in (None, "-") and not Path(path).exists():
        raise UsageError(f"{option} {path}: no such file")
    if path not in (None, "-") and Path(path).is_dir():
        raise UsageError(f"{option} {path}: a directory, not a file")


def read_input(
    sentences: list[str],
    path: str | None,
    buffer_size: int | None,
    shard: Shard | None = None,
    skip: int = 0,
    digest: InputDigest | None = None,
) -> Input:
    """The input: the ``sentences`` if any, else the file at ``path``, else standard input.

    Args:
        sentences: SENTENCE arguments, one line each.
        path: ``--input`` (None or ``-``: standard input).
        buffer_size: ``--buffer-size``: the lines of a file's parts (default
            :data:`~translation.parts.FILE_PART_LINES`), the most of standard input's.
        shard: ``--shard`` of a file, or None for all of it.
        skip: the lines of the file (of the shard) that ``--resume`` skips.
        digest: fed every line of the file as it is read (a shard's record).
    """
    if sentences:
        # Each argument is one line; os.fsencode recovers the bytes of undecodable arguments.
        raw = [os.fsencode(s).replace(b"\n", b" ") for s in sentences]
        lines = decode_lines(b"\n".join(raw) + b"\n", "<arguments>", LineMode.LOSSLESS)
        return Input(iter([(1, lines)]), "<arguments>", len(lines))
    if path is not None and path != "-":
        # A part at a time; a regular file's lines are counted first, a named pipe (bash's
        # <(...)) can be read once only.
        regular = Path(path).is_file()
        if regular:
            try:
                Path(path).open("rb").close()
            except OSError as err:
                raise UsageError(f"--input {path}: {err.strerror or err}") from None
        parts = file_parts(path, buffer_size or FILE_PART_LINES, shard or WHOLE, skip, digest)
        return Input(parts, path, count_lines(path) if regular and shard is None else None)
    return Input(_stdin_parts(buffer_size), "<stdin>", None)


def _stdin_parts(buffer_size: int | None) -> Parts:
    """Standard input as it arrives, at most ``buffer_size`` lines a part (default: one line at
    a time on a terminal, else all that has come)."""
    terminal = sys.stdin.isatty()
    if terminal:
        logger.info("reading sentences from the terminal, one per line; end with Ctrl-D")
    most = buffer_size or (1 if terminal else sys.maxsize)

    def stream() -> Parts:
        number = 1
        for chunk in line_chunks(sys.stdin.fileno(), most):
            lines = decode_lines(b"\n".join(chunk) + b"\n", "<stdin>", LineMode.LOSSLESS, first_line=number)
            yield number, lines
            number += len(lines)

    return stream()


@dataclass(frozen=True)
class AlignedFile:
    """A file given with ``option`` whose line ``n`` goes with input line ``n``."""

    option: str
    path: str
    lines: list[str]

    @classmethod
    def read(cls, option: str, path: str | None) -> AlignedFile | None:
        """The file's lines (lossless, as the input's), or None where the option is not given."""
        if path is None:
            return None
        try:
            raw = Path(path).read_bytes()
        except OSError as err:
            raise UsageError(f"{option} {path}: {err.strerror or err}") from None
        return cls(option, path, decode_lines(raw, path, LineMode.LOSSLESS))

    @property
    def label(self) -> str:
        return f"{self.option} {self.path}"

    def check_count(self, count: int, name: str) -> None:
        """Raises unless the file has as many lines as the input ``name`` (``count``)."""
        if len(self.lines) != count:
            raise UsageError(f"{self.label} has {len(self.lines)} lines but the input ({name}) has {count}")

    def lines_for(self, first: int, count: int, name: str) -> list[str]:
        """Lines ``first .. first + count - 1``, which the file must have."""
        if first - 1 + count > len(self.lines):
            raise UsageError(f"{self.label} has {len(self.lines)} lines but the input ({name}) has more")
        return self.lines[first - 1 : first - 1 + count]
