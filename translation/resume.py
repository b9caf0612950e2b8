"""``--resume``: an interrupted ``--output`` file continued, so that it ends as one straight run's.

A run stopped midway (killed, out of time) leaves ``--output`` with the lines of the parts it
finished and perhaps a part's first lines, and the last line perhaps cut short; ``--nbest-output``
is written a part at a time too, so either file may be ahead of the other. :func:`resume_point`
cuts both to the input lines whose answers are complete in both, and says how many of this
shard's lines that is: the input lines to skip (``translation.parts.file_parts``' ``skip``).
"""

from __future__ import annotations

from pathlib import Path

from translation.parts import FILE_PART_LINES
from translation.shards import WHOLE, input_line, shard_position


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
    shard: tuple[int, int] = WHOLE,
    part_lines: int = FILE_PART_LINES,
    alignments: str | Path | None = None,
) -> int:
    """Where ``--resume`` continues: the input lines whose answers are complete in ``output``
    and, given, in the ``nbest`` and ``alignments`` files, to which all are cut.

    ``output`` counts its complete lines. The n-best file's rows name their input line (from 1,
    in the whole input); the last line it names may have lost rows to the interruption, so only
    lines before it count (an n-best file without rows, or missing, counts none). Both files are
    written a part at a time, so either may be ahead of the other; the earlier one wins. The
    ``alignments`` file has a line per output line, and counts its complete lines as ``output``.

    Args:
        output: the ``--output`` file.
        nbest: the ``--nbest-output`` file, or None.
        alignments: the ``--alignment-output`` file, or None.
        shard: ``(I, N)`` of ``--shard``: the output holds parts I, I + N, ... of the input.
        part_lines: ``--buffer-size``, the lines of a part.

    Returns:
        The number of this shard's input lines answered in both, the first ones.
    """
    done = resume_lines(output)
    if alignments is not None:  # a missing file answers none
        done = min(done, resume_lines(alignments))
        _cut_lines(Path(output), done)
    if nbest is not None:
        path = Path(nbest)
        rows = path.read_bytes().split(b"\n") if path.exists() else []  # a row cut short names its line too
        named = [int(r.split(b"\t", 1)[0]) for r in rows if r.split(b"\t", 1)[0].isdigit()]
        if named:
            done = min(done, shard_position(max(named) - 1, shard, part_lines))  # the lines before it
        else:
            done = 0
        _cut_lines(Path(output), done)
        resume_nbest(path, input_line(done, shard, part_lines) + 1)
    if alignments is not None:
        _cut_lines(Path(alignments), done)
    return done


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
    rows start with their line number). Only complete rows count: one cut within its number (``1``
    of ``10``) would pass for a row of an earlier line."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1].split(b"\n")
    kept = [
        row
        for row in complete
        if row and row.split(b"\t", 1)[0].isdigit() and int(row.split(b"\t", 1)[0]) < first_line
    ]
    path.write_bytes(b"".join(row + b"\n" for row in kept))
