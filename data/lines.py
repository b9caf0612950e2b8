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

:func:`one_line` turns the line-break characters inside a text into spaces, so that a translation
never spans two output lines.
"""

from __future__ import annotations

import enum
import gzip
import logging
from pathlib import Path

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


def _strict_lines(raw: bytes, name: str) -> list[str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line_no = raw.count(b"\n", 0, err.start) + 1
        line_start = raw.rfind(b"\n", 0, err.start) + 1
        bad = raw[err.start : err.end]
        raise UndecodableLineError(
            f"{name}: invalid UTF-8 at line {line_no}, byte {err.start - line_start} of the line "
            f"({bad!r}: {err.reason})"
        ) from None
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
