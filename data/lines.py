"""Text as lines, split on ``b"\\n"`` only, under one of two named policies.

Python's universal newlines and ``str.splitlines()`` also split on ``\\r``, U+2028, U+2029,
``\\x85``, ``\\x0b``, ``\\x0c``, ... (:data:`LINE_BREAKS`), which silently breaks the alignment of
a source line with its target or its translation. Here only ``b"\\n"`` ends a line; the other
characters stay inside their line. In both modes a final ``\n`` does not start an extra line, a
last line without ``\n`` is kept, a UTF-8 byte order mark at the start is removed, and one ``\r``
is removed from the end of each line that has one: ``\r\n`` is a line end (a Windows file, or
lines pasted from one), while a ``\r`` inside a line stays. The modes differ where the input is
not clean:

* :attr:`LineMode.STRICT`, for corpora: invalid UTF-8 raises :class:`UndecodableLineError`
  and a NUL byte :class:`BadLineError`, each naming the file, the line and the byte; lines that
  ended with ``\r\n`` are counted in one warning naming the file.
* :attr:`LineMode.LOSSLESS`, for translation input: invalid UTF-8 is replaced by U+FFFD with a
  warning that names the line.

Why two: a training corpus must never be silently altered, while a translation filter must give
exactly one output line for every input line, whatever the input holds.

:func:`iter_line_blocks` gives the strict mode's lines of a file in blocks, holding about 16 MB at
a time, for corpora of any size.

:func:`one_line` turns the line-break characters inside a text into spaces, so that a translation
never spans two output lines.
"""

from __future__ import annotations

import enum
import gzip
import logging
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

_BOM = b"\xef\xbb\xbf"

# Characters that ``str.splitlines`` (and many editors and terminals) treat as line breaks. Inside
# a line they are turned into spaces before tokenizing, and removed from every output line, so
# that one input line is always one output line.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_TO_SPACE = str.maketrans(dict.fromkeys(LINE_BREAKS, " "))


class LineMode(enum.Enum):
    """How :func:`decode_lines` treats invalid UTF-8 and NUL bytes (see the module docstring)."""

    STRICT = "strict"
    """Corpora: nothing is altered silently; invalid UTF-8 and NUL bytes raise; ``\\r\\n`` line
    ends counted in a warning."""
    LOSSLESS = "lossless"
    """Translation input: no line is lost; invalid UTF-8 replaced with a warning."""


class BadLineError(ValueError):
    """A line a corpus cannot hold (invalid UTF-8, a NUL byte); the message names the file, line and byte."""


class UndecodableLineError(BadLineError):
    """Invalid UTF-8 in :attr:`LineMode.STRICT`; the message names the file, the line and the bytes."""


# Called with a bad line's number (from 1) and what is wrong with it, in place of raising.
OnBadLine = Callable[[int, str], None]


def one_line(text: str) -> str:
    """``text`` with every line-break character (:data:`LINE_BREAKS`) replaced by a space."""
    return text.translate(_TO_SPACE)


def decode_lines(raw: bytes, name: str, mode: LineMode, first_line: int = 1) -> list[str]:
    """Split raw bytes on ``b"\\n"`` only and decode them as UTF-8 under ``mode``.

    Args:
        raw: the whole input, or (:attr:`LineMode.LOSSLESS` only) whole lines of it from line
            ``first_line`` on.
        name: the file name (or ``"<stdin>"``) used in errors and warnings.
        mode: :attr:`LineMode.STRICT` or :attr:`LineMode.LOSSLESS`.
        first_line: the number of the first line in ``raw``: warnings count from it, and a byte
            order mark is removed from line 1 only.

    Returns:
        One string per line, without its ``\\n``.

    Raises:
        UndecodableLineError: invalid UTF-8 in :attr:`LineMode.STRICT`.
    """
    if first_line == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM) :]
    if not raw:
        return []
    if mode is LineMode.STRICT:
        if first_line != 1:
            raise ValueError("first_line is for LineMode.LOSSLESS: strict lines are read whole")
        return _strict_lines(raw, name)
    if mode is LineMode.LOSSLESS:
        return _lossless_lines(raw, name, first_line)
    raise ValueError(f"mode must be a LineMode, not {mode!r}")


def read_lines(path: str | Path, mode: LineMode) -> list[str]:
    """:func:`decode_lines` of a file, ``gzip``-decompressed when its name ends with ``.gz``.

    Args:
        path: a plain or ``.gz`` UTF-8 text file; its name is used in errors and warnings.
        mode: :attr:`LineMode.STRICT` or :attr:`LineMode.LOSSLESS`.

    Raises:
        UndecodableLineError: invalid UTF-8 in :attr:`LineMode.STRICT`.
        OSError: the file cannot be read.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    return decode_lines(raw, str(path), mode)


def _decode_strict(raw: bytes, name: str, first_line: int = 1, on_bad: OnBadLine | None = None) -> str:
    """UTF-8 text of ``raw`` (whole lines, the first one line ``first_line``), checked line by line.

    A line with invalid UTF-8 or a NUL byte raises :class:`BadLineError` naming it, or, with
    ``on_bad``, is reported to it and kept (invalid bytes replaced by U+FFFD) so that the lines
    stay aligned with another file's.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        if on_bad is None:
            line_no = first_line + raw.count(b"\n", 0, err.start)
            line_start = raw.rfind(b"\n", 0, err.start) + 1
            bad = raw[err.start : err.end]
            raise UndecodableLineError(
                f"{name}: invalid UTF-8 at line {line_no}, byte {err.start - line_start} of the line "
                f"({bad!r}: {err.reason})"
            ) from None
        text = "\n".join(
            _decode_reporting(part, first_line + i, on_bad) for i, part in enumerate(raw.split(b"\n"))
        )
    if "\x00" in text:
        for i, line in enumerate(text.split("\n")):
            if "\x00" in line:
                byte = len(line[: line.index("\x00")].encode())
                if on_bad is None:
                    raise BadLineError(f"{name}: NUL byte at line {first_line + i}, byte {byte} of the line")
                on_bad(first_line + i, f"NUL byte at byte {byte} of the line")
    return text


def _decode_reporting(part: bytes, line_no: int, on_bad: OnBadLine) -> str:
    try:
        return part.decode("utf-8")
    except UnicodeDecodeError as err:
        on_bad(
            line_no,
            f"invalid UTF-8 at byte {err.start} of the line ({part[err.start : err.end]!r}: {err.reason})",
        )
        return part.decode("utf-8", errors="replace")


def _without_cr(lines: list[str]) -> tuple[list[str], int]:
    """``lines`` with one ``\\r`` removed from the end of each, and how many had one."""
    ended = sum(1 for line in lines if line.endswith("\r"))
    if not ended:
        return lines, 0
    return [line[:-1] if line.endswith("\r") else line for line in lines], ended


def _warn_crlf(name: str, count: int) -> None:
    if count:
        logger.warning("%s: %d lines end with \\r\\n (Windows line ends), read as line ends", name, count)


def _strict_lines(raw: bytes, name: str) -> list[str]:
    text = _decode_strict(raw, name)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    lines, ended = _without_cr(lines)
    _warn_crlf(name, ended)
    return lines


def _lossless_lines(raw: bytes, name: str, first_line: int) -> list[str]:
    parts = raw.split(b"\n")
    if raw.endswith(b"\n"):
        parts.pop()
    parts = [p[:-1] if p.endswith(b"\r") else p for p in parts]
    try:  # fast path: the whole input is valid
        return [p.decode("utf-8") for p in parts]
    except UnicodeDecodeError:
        pass
    lines = []
    for number, part in enumerate(parts, start=first_line):
        try:
            lines.append(part.decode("utf-8"))
        except UnicodeDecodeError as err:
            logger.warning(
                "%s line %d: invalid UTF-8 (%r at byte %d) replaced with U+FFFD",
                name,
                number,
                part[err.start : err.end],
                err.start,
            )
            lines.append(part.decode("utf-8", errors="replace"))
    return lines


# ----------------------------------------------------------------------- streaming (strict mode)

# Bytes read per block while streaming a file; lines are decoded a block at a time.
_BLOCK_BYTES = 1 << 24


class CorruptFileError(ValueError):
    """A compressed file that is corrupt or cut short; the message names it and the last line read whole."""


def _open_binary(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115


def iter_line_blocks(path: str | Path, on_bad: OnBadLine | None = None) -> Iterator[list[str]]:
    """:func:`read_lines` in :attr:`LineMode.STRICT`, streamed: lists of consecutive lines.

    One block of about 16 MB is held at a time, however large the file: what a corpus of tens of
    millions of lines is read with. The lines are those of ``read_lines(path, LineMode.STRICT)``
    whatever the block size (``\r\n``, its warning and the byte order mark included).

    Args:
        path: a plain or ``.gz`` UTF-8 text file; its name is used in errors.
        on_bad: called with the number and the fault of each line with invalid UTF-8 or a NUL
            byte, which is then yielded with invalid bytes replaced; ``None``: such a line raises.

    Yields:
        Non-empty lists of lines without their ``\n``, in file order.

    Raises:
        BadLineError: without ``on_bad``, invalid UTF-8 (:class:`UndecodableLineError`) or a NUL
            byte; the message names the file, the line and the byte.
        CorruptFileError: a ``.gz`` file that is not gzip, or is corrupt or cut short; the message
            names the file and the last line read whole (lines before it may already have been
            yielded).
        OSError: the file cannot be read.
    """
    path = Path(path)
    done = crlf = 0  # lines yielded so far; those of them that ended with \r\n
    rest = b""
    try:
        with _open_binary(path) as f:
            bom_checked = False
            while block := f.read(_BLOCK_BYTES):
                block = rest + block
                if not bom_checked:
                    if len(block) < len(_BOM) and _BOM.startswith(block):
                        rest = block  # too short to tell yet
                        continue
                    bom_checked = True
                    if block.startswith(_BOM):
                        block = block[len(_BOM) :]
                cut = block.rfind(b"\n")
                if cut < 0:
                    rest = block
                    continue
                rest = block[cut + 1 :]
                lines, ended = _without_cr(
                    _decode_strict(block[:cut], str(path), done + 1, on_bad).split("\n")
                )
                done += len(lines)
                crlf += ended
                yield lines
    except gzip.BadGzipFile as err:
        if done == 0:
            raise CorruptFileError(
                f"{path} is not gzip data ({err}), yet its name ends in .gz: "
                "compress it with gzip, or remove .gz from its name"
            ) from None
        raise CorruptFileError(_corrupt(path, done, err)) from None
    except (EOFError, zlib.error) as err:
        raise CorruptFileError(_corrupt(path, done, err)) from None
    if rest:
        lines, ended = _without_cr([_decode_strict(rest, str(path), done + 1, on_bad)])
        crlf += ended
        yield lines
    _warn_crlf(str(path), crlf)


def _corrupt(path: Path, done: int, err: Exception) -> str:
    return (
        f"{path}: corrupt or truncated gzip data after line {done} ({err}): "
        "download or compress it again (gzip -t checks a file)"
    )
