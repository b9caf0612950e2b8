"""Standard input as it arrives: each line answered before the next is awaited, nothing lost."""

from __future__ import annotations

import os
import random
import threading

import pytest

from translation.stream import line_chunks


def test_a_line_is_handed_over_before_the_next_is_written() -> None:
    read, write = os.pipe()
    chunks = line_chunks(read, buffer_size=8)
    try:
        os.write(write, b"one\n")
        assert next(chunks) == [b"one"]  # does not wait for more, nor for the end
        os.write(write, b"two\nthree\nfou")
        assert next(chunks) == [b"two", b"three"]
        os.write(write, b"r\n")
        assert next(chunks) == [b"four"]
        os.close(write)
        write = -1
        assert list(chunks) == []
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


def test_waiting_lines_come_in_chunks_of_the_buffer_size_and_a_last_line_needs_no_newline() -> None:
    read, write = os.pipe()
    os.write(write, b"a\nb\nc\n\nd\ne")
    os.close(write)
    try:
        assert list(line_chunks(read, buffer_size=2)) == [[b"a", b"b"], [b"c", b""], [b"d", b"e"]]
    finally:
        os.close(read)


@pytest.mark.parametrize("seed", range(3))
def test_nothing_is_lost_however_the_writer_splits_the_bytes(seed: int) -> None:
    rng = random.Random(seed)
    lines = [bytes(rng.choice(b"ab \r\xff") for _ in range(rng.randrange(0, 6))) for _ in range(300)]
    payload = b"\n".join(lines) + (b"\n" if seed % 2 else b"")
    read, write = os.pipe()

    def writer() -> None:
        rest = payload
        while rest:
            cut = rng.randrange(1, 40)
            os.write(write, rest[:cut])
            rest = rest[cut:]
        os.close(write)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        chunks = list(line_chunks(read, buffer_size=rng.randrange(1, 50)))
    finally:
        thread.join()
        os.close(read)
    got = [line for chunk in chunks for line in chunk]
    expected = lines if seed % 2 else (lines if lines[-1] else lines[:-1])
    assert got == expected
