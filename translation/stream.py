"""Lines of a stream as they arrive: translate what has come, without waiting for the rest.

A person typing into ``translate.py``, or a process that writes one line into its pipe and reads
the translation before writing the next, must get each answer before the input ends (as
``fairseq-interactive`` and ``marian-decoder`` answer). :func:`line_chunks` reads what the file
descriptor has, and hands over the complete lines it holds (at most ``buffer_size``) as soon as
no more bytes are waiting; it blocks only while it holds no complete line. Input that is all
there already (a file, a pipe whose writer has finished) is read in chunks of ``buffer_size``
lines, so that it is batched as one input is.
"""

from __future__ import annotations

import os
import select
from collections import deque
from collections.abc import Iterator

READ_BYTES = 1 << 16


def _waiting(fd: int) -> bool:
    """Whether bytes (or the end of the stream) can be read from ``fd`` without blocking."""
    try:
        ready, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):  # not selectable: read as a whole input
        return True
    return bool(ready)


def line_chunks(fd: int, buffer_size: int) -> Iterator[list[bytes]]:
    """Lines of ``fd`` (without their ``\\n``), in chunks of 1 to ``buffer_size``.

    A chunk is given once ``buffer_size`` lines are held, or once at least one is held and no
    more bytes are waiting; at the end of the stream, the rest (a last line without ``\\n``
    included). Nothing is lost: the chunks joined are the stream's lines.

    Args:
        fd: a readable file descriptor (stdin's: ``sys.stdin.fileno()``).
        buffer_size: the most lines in a chunk (at least 1).
    """
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be at least 1, not {buffer_size}")
    lines: deque[bytes] = deque()
    partial = b""
    ended = False
    while True:
        # Read while there is room, and while nothing complete is held or more is waiting.
        while not ended and len(lines) < buffer_size and (not lines or _waiting(fd)):
            data = os.read(fd, READ_BYTES)
            if not data:
                ended = True
                break
            *complete, partial = (partial + data).split(b"\n")
            lines.extend(complete)
        if ended and partial:
            lines.append(partial)
            partial = b""
        if not lines:
            return
        yield [lines.popleft() for _ in range(min(buffer_size, len(lines)))]
