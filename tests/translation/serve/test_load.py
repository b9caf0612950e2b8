"""A bounded load on the loopback: 32 clients send 2,000 lines in requests of 1 to 24 lines to one
server of a tiny model; no line is lost, each request gets its own lines back in order, and the
lines per second are reported (``-s`` shows them; ``bench/serve_load.py`` measures a real model)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tests.toy_text import toy_pairs
from tests.translation.serve.helpers import Server, reference_translator, require_serve, write_toy_checkpoint

require_serve()

CLIENTS = 32
LINES = 2000


@pytest.mark.slow
def test_32_clients_lose_no_line_and_keep_order(tmp_path: Path, record_property) -> None:
    checkpoint = write_toy_checkpoint(tmp_path / "toy.ckpt")
    lines = [s for s, _ in toy_pairs(LINES, seed=21)]
    lines[::97] = [""] * len(lines[::97])  # empty lines among them
    expected = reference_translator(checkpoint).translate(lines, beam_size=2)

    taken, lock = 0, threading.Lock()
    answers: list[tuple[int, list[str], int, dict]] = []  # (first line, lines, status, answer)
    failures: list[BaseException] = []

    def client(number: int, server: Server) -> None:
        nonlocal taken
        rng = random.Random(number)
        try:
            while True:
                with lock:
                    first, taken = taken, min(LINES, taken + rng.randint(1, 24))
                    last = taken
                if first >= LINES:
                    return
                status, answer, _ = server.post({"lines": lines[first:last], "beam_size": 2}, timeout=120)
                with lock:
                    answers.append((first, lines[first:last], status, answer))
        except BaseException as err:  # noqa: BLE001 (reported by the test)
            failures.append(err)

    with Server(checkpoint, tmp_path / "server.log", "--beam-size", "2") as server:
        threads = [threading.Thread(target=client, args=(n, server)) for n in range(CLIENTS)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        seconds = time.perf_counter() - start
        health = server.health()

    assert not failures, failures[:3]
    assert not any(thread.is_alive() for thread in threads)
    assert all(status == 200 for _, _, status, _ in answers), [a for a in answers if a[2] != 200][:3]
    answered = sorted((first, len(sent)) for first, sent, _, _ in answers)
    assert sum(n for _, n in answered) == LINES  # every line sent once ...
    assert [first for first, _ in answered] == [0, *(f + n for f, n in answered[:-1])]  # ... none skipped
    for first, sent, _, answer in answers:
        assert answer["translations"] == expected[first : first + len(sent)]
    assert health["lines"] == LINES and health["requests"] == len(answers)
    rate = LINES / seconds
    record_property("lines_per_second", round(rate, 1))
    print(
        f"\n{CLIENTS} clients, {LINES} lines in {len(answers)} requests, {health['searches']} searches: "
        f"{seconds:.1f} s, {rate:.0f} lines/s"
    )
