"""Input lines: split on \\n only, invalid UTF-8 replaced with a warning, never a line lost."""

from __future__ import annotations

import logging

import pytest

from translation.lines import LINE_BREAKS, one_line, read_lines

# ------------------------------------------------------------------------------ read_lines


@pytest.mark.parametrize(
    ("raw", "lines"),
    [
        (b"", []),
        (b"\n", [""]),
        (b"a\nb\n", ["a", "b"]),
        (b"a\nb", ["a", "b"]),  # no final newline: the last line still counts
        (b"a\n\n", ["a", ""]),
        (b"a\r\nb\r\n", ["a", "b"]),  # CRLF
        (b"a\rb\n\r\n", ["a\rb", ""]),  # \r inside a line stays
        ("a\u2028b\x85c\x0cd\u2029e\x0bf\n".encode(), ["a\u2028b\x85c\x0cd\u2029e\x0bf"]),
        (b"\xef\xbb\xbfa\n", ["a"]),  # byte order mark
    ],
)
def test_read_lines_splits_on_newline_only(raw: bytes, lines: list[str]) -> None:
    assert read_lines(raw, "x.txt") == lines


def test_read_lines_replaces_invalid_utf8_and_names_the_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        lines = read_lines(b"fine\nbad \xff byte\n\xc3\n", "in.txt")
    assert lines == ["fine", "bad \ufffd byte", "\ufffd"]
    assert "in.txt line 2: invalid UTF-8" in caplog.text
    assert "in.txt line 3: invalid UTF-8" in caplog.text
    assert "line 1" not in caplog.text


def test_one_line_removes_every_line_break() -> None:
    text = "a" + "b".join(LINE_BREAKS) + "c"
    assert one_line(text).splitlines() == [one_line(text)]
    assert len(one_line(text)) == len(text)
