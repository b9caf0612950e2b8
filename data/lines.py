"""Text as lines, split on ``b"\\n"`` only, under one of two named policies.

Python's universal newlines and ``str.splitlines()`` also split on ``\\r``, U+2028, U+2029,
``\\x85``, ``\\x0b``, ``\\x0c``, ... (:data:`LINE_BREAKS`), which silently breaks the alignment of
a source line with its target or its translation. Here only ``b"\\n"`` ends a line; the other
characters stay inside their line. In both modes a final ``\\n`` does not start an extra line, a
last line without ``\\n`` is kept, and a UTF-8 byte order mark at the start is removed. The modes
differ where the input is not clean:

* :attr:`LineMode.STRICT`, for corpora: invalid UTF-8 raises :class:`UndecodableLineError`
  naming the file, the line and the bytes; a ``\\r`` before ``\\n`` is removed only when *every*
  line ends with ``\\r\\n`` (a Windows file), and kept otherwise.
* :attr:`LineMode.LOSSLESS`, for translation input: invalid UTF-8 is replaced by U+FFFD with a
  warning that names the line; one ``\\r`` is removed from the end of each line that has one.

Why two: a training corpus must never be silently altered (a stray ``\\r`` in one line of a Unix
file is data), while a translation filter must give exactly one output line for every input line,
whatever the input holds.

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
from collections.abc import Iterator
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
    """How :func:`decode_lines` treats invalid UTF-8 and ``\\r`` (see the module docstring)."""

    STRICT = "strict"
    """Corpora: nothing is altered silently; invalid UTF-8 raises; ``\\r`` removed only from a
    file whose every line ends with ``\\r\\n``."""
    LOSSLESS = "lossless"
    """Translation input: no line is lost; invalid UTF-8 replaced with a warning; one trailing
    ``\\r`` removed from each line."""


class UndecodableLineError(ValueError):
    """Invalid UTF-8 in :attr:`LineMode.STRICT`; the message names the file, the line and the bytes."""


def one_line(text: str) -> str:
    """``text`` with every line-break character (:data:`LINE_BREAKS`) replaced by a space."""
    return text.translate(_TO_SPACE)


def decode_lines(raw: bytes, name: str, mode: LineMode) -> list[str]:
    """Split raw bytes on ``b"\\n"`` only and decode them as UTF-8 under ``mode``.

    Args:
        raw: the whole input.
        name: the file name (or ``"<stdin>"``) used in errors and warnings.
        mode: :attr:`LineMode.STRICT` or :attr:`LineMode.LOSSLESS`.

    Returns:
        One string per line, without its ``\\n``.

    Raises:
        UndecodableLineError: invalid UTF-8 in :attr:`LineMode.STRICT`.
    """
    if raw.startswith(_BOM):
        raw = raw[len(_BOM) :]
    if not raw:
        return []
    if mode is LineMode.STRICT:
        return _strict_lines(raw, name)
    if mode is LineMode.LOSSLESS:
        return _lossless_lines(raw, name)
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


def _decode_strict(raw: bytes, name: str, first_line: int = 1) -> str:
    """UTF-8 text of ``raw`` (whole lines, the first one line ``first_line``), or an error naming the line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line_no = first_line + raw.count(b"\n", 0, err.start)
        line_start = raw.rfind(b"\n", 0, err.start) + 1
        bad = raw[err.start : err.end]
        raise UndecodableLineError(
            f"{name}: invalid UTF-8 at line {line_no}, byte {err.start - line_start} of the line "
            f"({bad!r}: {err.reason})"
        ) from None


def _strict_lines(raw: bytes, name: str) -> list[str]:
    text = _decode_strict(raw, name)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if lines and all(line.endswith("\r") for line in lines):
        lines = [line[:-1] for line in lines]
    return lines


def _lossless_lines(raw: bytes, name: str) -> list[str]:
    parts = raw.split(b"\n")
    if raw.endswith(b"\n"):
        parts.pop()
    parts = [p[:-1] if p.endswith(b"\r") else p for p in parts]
    try:  # fast path: the whole input is valid
        return [p.decode("utf-8") for p in parts]
    except UnicodeDecodeError:
        pass
    lines = []
    for number, part in enumerate(parts, start=1):
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


def _every_line_ends_crlf(path: Path) -> bool:
    """Whether every line of ``path`` (the last one too, terminated or not) ends with ``\\r``.

    Stops at the first ``\\n`` without a ``\\r`` before it, i.e. within the first block of a
    Unix file; a Windows file is scanned to its end.
    """
    prev_last = last = b""
    with _open_binary(path) as f:
        while block := f.read(_BLOCK_BYTES):
            if block.count(b"\n") != (prev_last + block).count(b"\r\n"):
                return False
            prev_last = last = block[-1:]
    return last in (b"\n", b"\r")


def iter_line_blocks(path: str | Path) -> Iterator[list[str]]:
    """:func:`read_lines` in :attr:`LineMode.STRICT`, streamed: lists of consecutive lines.

    One block of about 16 MB is held at a time, however large the file: what a corpus of tens of
    millions of lines is read with. The lines are those of ``read_lines(path, LineMode.STRICT)``
    whatever the block size (``\\r`` and the byte order mark included).

    Args:
        path: a plain or ``.gz`` UTF-8 text file; its name is used in errors.

    Yields:
        Non-empty lists of lines without their ``\\n``, in file order.

    Raises:
        UndecodableLineError: invalid UTF-8; the message names the file, the line and the bytes.
        CorruptFileError: the ``.gz`` file is corrupt or cut short; the message names the file
            and the last line read whole (lines before it may already have been yielded).
        OSError: the file cannot be read.
    """
    path = Path(path)
    strip_cr = _every_line_ends_crlf(path)
    done = 0  # lines yielded so far
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
                lines = _decode_strict(block[:cut], str(path), done + 1).split("\n")
                if strip_cr:
                    lines = [line[:-1] for line in lines]
                done += len(lines)
                yield lines
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise CorruptFileError(f"{path}: corrupt or truncated gzip data after line {done}: {err}") from None
    if rest:
        line = _decode_strict(rest, str(path), done + 1)
        yield [line[:-1] if strip_cr else line]
