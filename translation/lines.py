"""Input lines for translation: every line of the input gives exactly one output line.

* :func:`read_lines` splits raw bytes on ``b"\\n"`` only (``str.splitlines`` would also split on
  ``\\r``, U+2028, ``\\x85``, ...), and replaces invalid UTF-8 with a warning that names the line
  instead of failing, so that no line is lost.
* :func:`one_line` turns the other line-break characters inside a line into spaces, so that a
  translation never spans two output lines.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# Characters that ``str.splitlines`` (and many editors and terminals) treat as line breaks. Inside
# a line they are turned into spaces before tokenizing, and removed from every output line, so
# that one input line is always one output line.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_TO_SPACE = str.maketrans(dict.fromkeys(LINE_BREAKS, " "))


def one_line(text: str) -> str:
    """``text`` with every line-break character replaced by a space."""
    return text.translate(_TO_SPACE)


def read_lines(raw: bytes, name: str) -> list[str]:
    """Split raw input on ``b"\\n"`` only and decode each line as UTF-8.

    A final ``\\n`` does not start an extra line; a last line without ``\\n`` is kept. One ``\\r``
    at the end of a line (CRLF files) is removed; any other ``\\r``, ``\\x0c``, U+2028, ... stays
    inside its line (see :func:`one_line`). A UTF-8 byte order mark at the start is removed.
    Invalid UTF-8 is replaced by U+FFFD with a warning that names the line.

    Args:
        raw: the whole input.
        name: the file name (or ``"<stdin>"``) used in warnings.

    Returns:
        One string per line.
    """
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    if not raw:
        return []
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
