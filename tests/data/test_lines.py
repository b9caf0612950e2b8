"""Lines split on \\n only, in both modes: strict (corpora) and lossless (translation input).

Every hostile input is run through both modes: where they agree, the expected lines are given
once; where they differ (invalid UTF-8, NUL bytes), each mode's rule is asserted.
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest

from data import lines as lines_mod
from data.lines import (
    LINE_BREAKS,
    BadLineError,
    LineMode,
    UndecodableLineError,
    decode_lines,
    one_line,
    read_lines,
)

STRICT, LOSSLESS = LineMode.STRICT, LineMode.LOSSLESS

# Characters that str.splitlines() or universal newlines treat as line breaks, \n aside.
HOSTILE = [c for c in LINE_BREAKS if c != "\n"]


def _write(path: Path, payload: bytes) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


# ----------------------------------------------------------------------- what both modes share

BOTH_MODES = [
    (b"", []),
    (b"\n", [""]),
    (b"a\nb\n", ["a", "b"]),
    (b"a\nb", ["a", "b"]),  # no final newline: the last line still counts
    (b"a\n\n", ["a", ""]),
    (b"x\n\n\ny\n", ["x", "", "", "y"]),
    (b"a\r\nb\r\n", ["a", "b"]),  # CRLF
    (b"eins\r\nzwei\r\n\r\n", ["eins", "zwei", ""]),  # CRLF, with an empty line
    ("a\u2028b\x85c\x0cd\u2029e\x0bf\n".encode(), ["a\u2028b\x85c\x0cd\u2029e\x0bf"]),
    (b"\xef\xbb\xbfa\n", ["a"]),  # byte order mark
    (b"\xef\xbb\xbf", []),  # a byte order mark alone
]


@pytest.mark.parametrize("mode", [STRICT, LOSSLESS])
@pytest.mark.parametrize(("raw", "lines"), BOTH_MODES)
def test_both_modes_split_on_newline_only(raw: bytes, lines: list[str], mode: LineMode) -> None:
    assert decode_lines(raw, "x.txt", mode) == lines


@pytest.mark.parametrize("mode", [STRICT, LOSSLESS])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_hostile_separators_stay_inside_lines(tmp_path: Path, suffix: str, mode: LineMode) -> None:
    lines = [f"vor{c}nach {i}" for i, c in enumerate(HOSTILE)] + ["\r\r", "ende\r", "\x1c\x1d\x1e"]
    payload = "".join(s + "\n" for s in lines).encode()
    assert len(payload.decode().splitlines()) > len(lines)  # the trap
    # \r\n is a line end in both modes: one \r is removed from the end of a line.
    want = [s.removesuffix("\r") for s in lines]
    assert read_lines(_write(tmp_path / f"train.de{suffix}", payload), mode) == want


@pytest.mark.parametrize("mode", [STRICT, LOSSLESS])
def test_one_line_per_newline_whatever_the_line_holds(mode: LineMode) -> None:
    # Every non-newline byte value that is valid UTF-8 on its own (NUL aside in strict mode, where
    # it is an error), and each hostile character.
    refused = {0x0A} if mode is LOSSLESS else {0x0A, 0x00}
    pieces = [bytes([b]) for b in range(0x80) if b not in refused] + [c.encode() for c in HOSTILE]
    raw = b"\n".join(b"<" + p + b">" for p in pieces)
    assert len(decode_lines(raw, "x.txt", mode)) == len(pieces)


# ------------------------------------------------------------------------ where the modes differ


@pytest.mark.parametrize(
    ("raw", "lines"),
    [
        (b"eins\r\nzwei\n", ["eins", "zwei"]),  # not wholly CRLF: \r\n is still a line end
        (b"a\rb\n\r\n", ["a\rb", ""]),  # \r inside a line stays
        (b"a\r\r\nb\r\n", ["a\r", "b"]),  # only one \r is removed
        (b"a\r\nb\r", ["a", "b"]),  # an unterminated last line ending in \r
    ],
)
@pytest.mark.parametrize("mode", [STRICT, LOSSLESS])
def test_carriage_returns(raw: bytes, lines: list[str], mode: LineMode) -> None:
    assert decode_lines(raw, "x.txt", mode) == lines


def test_strict_mode_warns_once_per_file_about_windows_line_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path / "train.de.gz", b"eins\r\nzwei\r\ndrei\n" * 3)
    with caplog.at_level("WARNING", logger="data.lines"):
        lines = [line for block in lines_mod.iter_line_blocks(path) for line in block]
    assert lines == ["eins", "zwei", "drei"] * 3
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 6 lines end with \\r\\n (Windows line ends), read as line ends"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="data.lines"):
        list(lines_mod.iter_line_blocks(_write(tmp_path / "unix.de", b"eins\nzwei\n")))
    assert not caplog.records


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_strict_mode_refuses_a_nul_byte_naming_file_line_and_byte(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"train.de{suffix}", b"gut\nEin\x00Hund\nok\n")
    for read in (lambda: read_lines(path, STRICT), lambda: list(lines_mod.iter_line_blocks(path))):
        with pytest.raises(BadLineError, match=rf"{path}: NUL byte at line 2, byte 3 of the line"):
            read()
    assert decode_lines(b"a\x00b\n", "in.txt", LOSSLESS) == ["a\x00b"]  # translation input keeps it


@pytest.mark.parametrize("block", [2, 5, 1 << 24])
def test_bad_lines_are_reported_in_place_of_raising_and_keep_the_alignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(lines_mod, "_BLOCK_BYTES", block)
    path = _write(tmp_path / "train.de", b"gut\nkaputt \xff\nEin\x00Hund\r\nok")
    bad: list[tuple[int, str]] = []
    lines = [
        line for b in lines_mod.iter_line_blocks(path, lambda n, why: bad.append((n, why))) for line in b
    ]
    assert lines == ["gut", "kaputt \ufffd", "Ein\x00Hund", "ok"]
    assert [n for n, _ in bad] == [2, 3]
    assert "invalid UTF-8 at byte 7" in bad[0][1] and "NUL byte at byte 3" in bad[1][1]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"no gzip here\n", r"is not gzip data .*yet its name ends in \.gz"),
        (gzip.compress(b"eins\nzwei\n" * 5000)[:60], r"corrupt or truncated gzip data after line \d+"),
    ],
)
def test_a_damaged_gzip_file_is_named(tmp_path: Path, payload: bytes, message: str) -> None:
    path = tmp_path / "train.de.gz"
    path.write_bytes(payload)
    with pytest.raises(lines_mod.CorruptFileError, match=rf"{path}.*{message}|{path} {message}"):
        list(lines_mod.iter_line_blocks(path))


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_strict_mode_refuses_invalid_utf8_naming_file_and_line(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path / f"train.de{suffix}", b"gut\nauch gut\nkaputt \xff\xfe hier\nok\n")
    with pytest.raises(UndecodableLineError) as err:
        read_lines(path, STRICT)
    msg = str(err.value)
    assert str(path) in msg
    assert "line 3" in msg
    assert "byte 7 of the line" in msg
    assert "\\xff" in msg


def test_lossless_mode_replaces_invalid_utf8_and_names_the_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        lines = decode_lines(b"fine\nbad \xff byte\n\xc3\n", "in.txt", LOSSLESS)
    assert lines == ["fine", "bad \ufffd byte", "\ufffd"]
    assert "in.txt line 2: invalid UTF-8" in caplog.text
    assert "in.txt line 3: invalid UTF-8" in caplog.text
    assert "line 1" not in caplog.text
    with pytest.raises(UndecodableLineError, match="in.txt: invalid UTF-8 at line 2"):
        decode_lines(b"fine\nbad \xff byte\n\xc3\n", "in.txt", STRICT)


def test_mode_must_be_a_line_mode() -> None:
    with pytest.raises(ValueError, match="LineMode"):
        decode_lines(b"a\n", "x.txt", "strict")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ one_line


def test_one_line_removes_every_line_break() -> None:
    text = "a" + "b".join(LINE_BREAKS) + "c"
    assert one_line(text).splitlines() == [one_line(text)]
    assert len(one_line(text)) == len(text)


# ------------------------------------------------------------- strict mode, streamed in blocks

TRICKY = [
    b"",
    b"\n",
    b"eins\r\nzwei\r\n\r\n",  # a Windows file: \r removed
    b"eins\r\nzwei\n",  # not wholly \r\n: removed too
    b"a\r\nb\r",  # unterminated last line ending in \r
    b"\xef\xbb\xbfmit bom\nzweite\n",
    b"\xef\xbb\xbf",
    "vor\u2028nach\x85x\x0cy\r\rz\nende".encode(),
    "ä\nöü\r\n".encode() * 7,
]


@pytest.mark.parametrize("raw", TRICKY)
@pytest.mark.parametrize("block", [1, 2, 3, 5, 1 << 24])
def test_any_block_size_reads_the_same_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: bytes, block: int
) -> None:
    path = _write(tmp_path / "f.txt.gz", raw)
    expected = read_lines(path, STRICT)  # the whole file at once
    monkeypatch.setattr(lines_mod, "_BLOCK_BYTES", block)
    blocks = list(lines_mod.iter_line_blocks(path))
    assert [line for b in blocks for line in b] == expected
    assert all(blocks)  # no empty blocks
