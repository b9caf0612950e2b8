"""The server over real HTTP: it is started as a user starts it (``python3 -m translation.serve``
on a free loopback port) and asked with the standard library's client.

Two servers of a tiny random en->{de,fr} model serve the module: one as a user starts it, one
that gathers requests for up to 1.5 s (``--max-delay-ms``) with a small queue, so that batching
and the queue's bound can be seen without racing the decoder.
"""

from __future__ import annotations

import json
import re
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.toy_text import toy_pairs
from tests.translation.serve.helpers import (
    TAGS,
    Server,
    reference_translator,
    require_serve,
    write_toy_checkpoint,
)

require_serve()

LINES = [s for s, _ in toy_pairs(12, seed=3)] + ["", "   ", "hund"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_toy_checkpoint(tmp_path_factory.mktemp("serve") / "en_defr.ckpt", TAGS)


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("log") / "server.log"
    with Server(checkpoint, log, "--target-lang", "de", "--max-request-lines", "50") as running:
        yield running


@pytest.fixture(scope="module")
def gathering(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("log") / "gathering.log"
    options = ("--target-lang", "de", "--max-delay-ms", "1500", "--max-queued-lines", "40")
    with Server(
        checkpoint, log, *options, "--max-request-lines", "40", "--max-batch-lines", "100"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def reference(checkpoint: Path):
    return {lang: reference_translator(checkpoint, lang) for lang in TAGS}


def test_translations_equal_the_translators(server: Server, reference) -> None:
    status, answer, _ = server.post({"lines": LINES, "beam_size": 3})
    assert status == 200, answer
    assert answer == {"translations": reference["de"].translate(LINES, beam_size=3)}
    assert answer["translations"][LINES.index("")] == answer["translations"][LINES.index("   ")] == ""

    status, answer, _ = server.post({"lines": LINES, "greedy": True, "target_lang": "fr"})
    assert answer == {"translations": reference["fr"].translate(LINES, greedy=True)}, answer

    status, answer, _ = server.post({"lines": LINES, "beam_size": 4, "nbest": 3, "alpha": 1.0})
    assert status == 200, answer
    assert answer["translations"] == reference["de"].translate(LINES, beam_size=4, alpha=1.0)
    assert len(answer["nbest"]) == len(LINES)
    for line, best, hyps in zip(LINES, answer["translations"], answer["nbest"], strict=True):
        assert (hyps == []) if not line.strip() else (1 <= len(hyps) <= 3 and hyps[0]["text"] == best)
        scores = [h["score"] for h in hyps]
        assert scores == sorted(scores, reverse=True)

    assert server.post({"lines": []})[:2] == (200, {"translations": []})


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, None),
        ([1, 2], 400, None),
        ({}, 400, "lines"),
        ({"lines": "one line"}, 400, "lines"),
        ({"lines": ["ein hund", 3]}, 400, "lines[1]"),
        ({"lines": ["ein hund"] * 51}, 400, "lines"),
        ({"lines": ["a"], "beam_size": 0}, 400, "beam_size"),
        ({"lines": ["a"], "beam_size": "5"}, 400, "beam_size"),
        ({"lines": ["a"], "beam_size": 17}, 400, "beam_size"),
        ({"lines": ["a"], "beam_size": 2, "nbest": 3}, 400, "nbest"),
        ({"lines": ["a"], "greedy": 1}, 400, "greedy"),
        ({"lines": ["a"], "greedy": True, "sampling": True}, 400, "greedy"),
        ({"lines": ["a"], "topp": 1.5}, 400, "topp"),
        ({"lines": ["a"], "beam": 3}, 400, "beam"),
        ({"lines": ["a"], "target_lang": "es"}, 400, "target_lang"),
        ({"lines": ["a"], "target_lang": ["de"]}, 400, "target_lang"),
        ({"lines": ["x" * (1 << 20)]}, 413, None),
    ],
)
def test_a_bad_request_gets_an_error_naming_its_field(server: Server, body, status, field) -> None:
    got, answer, headers = server.post(body)
    assert (got, answer["field"]) == (status, field), answer
    assert answer["error"] and headers["content-type"] == "application/json"
    if field and "[" not in field:  # a line's error speaks of "each line"
        assert field in answer["error"]


def test_other_paths_and_methods_answer_json(server: Server) -> None:
    status, text, _ = server.get("/nowhere")
    assert status == 404 and json.loads(text)["field"] is None
    status, text, _ = server.get("/translate")
    assert status == 405 and json.loads(text)["error"]


def test_the_page_is_whole_and_posts_to_translate(server: Server) -> None:
    status, html, headers = server.get("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    for part in ("<textarea", "<button", "<output", "<script>", "<style>"):
        assert part in html
    assert re.search(r"fetch\(\s*\"/translate\"\s*,\s*\{\s*method:\s*\"POST\"", html)
    assert "JSON.stringify(body)" in html and "lines" in html
    # Nothing from elsewhere: no external scripts, styles, fonts or images.
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html)
    assert "http://" not in html and "https://" not in html and "@import" not in html


def test_health_names_the_languages_and_counts(server: Server) -> None:
    before = server.health()
    assert before["status"] == "ok"
    assert (before["source_lang"], before["target_langs"], before["default_target_lang"]) == (
        "en",
        ["de", "fr"],
        "de",
    )
    server.post({"lines": ["hund", "katze"]})
    after = server.health()
    assert after["requests"] == before["requests"] + 1 and after["lines"] == before["lines"] + 2
    assert after["queued_lines"] == 0


def _wait_for_queued(server: Server, lines: int) -> None:
    for _ in range(400):
        if server.health()["queued_lines"] >= lines:
            return
        threading.Event().wait(0.005)
    raise AssertionError(f"{lines} lines never waited in the queue: {server.health()}")


@pytest.mark.slow
def test_concurrent_requests_are_searched_together_each_getting_its_own_lines(gathering, reference) -> None:
    pairs = toy_pairs(40, seed=7)
    requests = [
        [s for s, _ in pairs[i : i + n]]
        for i, n in zip(range(0, 40, 5), [5, 1, 4, 5, 3, 2, 5, 5], strict=True)
    ]
    requests[3][1] = ""  # an empty line in the middle of a request
    before = gathering.health()
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda lines: gathering.post({"lines": lines, "beam_size": 2}), requests))
    after = gathering.health()
    for lines, (status, answer, _) in zip(requests, answers, strict=True):
        assert status == 200, answer
        assert answer["translations"] == reference["de"].translate(lines, beam_size=2)
    searches = after["searches"] - before["searches"]
    assert after["requests"] - before["requests"] == len(requests)
    assert 1 <= searches < len(requests), (before, after)

    # Requests with other settings are never searched together: each gets its own settings' output.
    settings = [
        {"beam_size": 2},
        {"greedy": True},
        {"beam_size": 2, "target_lang": "fr"},
        {"beam_size": 3},
    ] * 2
    lines = [s for s, _ in pairs[:4]]  # 8 requests of 4: 32 lines, within the queue's 40
    before = gathering.health()
    with ThreadPoolExecutor(len(settings)) as pool:
        answers = list(pool.map(lambda options: gathering.post({"lines": lines, **options}), settings))
    after = gathering.health()
    for options, (status, answer, _) in zip(settings, answers, strict=True):
        search = {k: v for k, v in options.items() if k != "target_lang"}
        expected = reference[options.get("target_lang", "de")].translate(lines, **search)
        assert status == 200 and answer["translations"] == expected, options
    assert 4 <= after["searches"] - before["searches"] < len(settings)


def test_a_full_queue_answers_503_and_the_server_goes_on(gathering, reference) -> None:
    first = [s for s, _ in toy_pairs(30, seed=11)]
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(gathering.post, {"lines": first, "beam_size": 2})
        _wait_for_queued(gathering, len(first))  # 30 of the 40 lines the queue holds
        status, answer, headers = gathering.post({"lines": ["hund"] * 11, "beam_size": 2})
        assert status == 503 and answer["field"] is None and "40" in answer["error"], answer
        assert headers["retry-after"] == "1"
        assert gathering.health()["status"] == "ok"  # answered while the queue is full
        status, answer, _ = waiting.result(timeout=60)
    assert status == 200 and answer["translations"] == reference["de"].translate(first, beam_size=2)
    status, answer, _ = gathering.post({"lines": ["hund"] * 11, "beam_size": 2})
    assert status == 200 and len(answer["translations"]) == 11
    assert gathering.health()["refused"] >= 1


@pytest.mark.slow
def test_sigterm_answers_the_requests_in_flight_then_exits_0(
    checkpoint: Path, tmp_path: Path, reference
) -> None:
    server = Server(
        checkpoint, tmp_path / "server.log", "--target-lang", "de", "--max-delay-ms", "1500"
    ).start()
    lines = [s for s, _ in toy_pairs(6, seed=5)]
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(server.post, {"lines": lines, "beam_size": 2})
        _wait_for_queued(server, len(lines))
        server.proc.send_signal(signal.SIGTERM)
        status, answer, _ = in_flight.result(timeout=60)
    assert status == 200 and answer["translations"] == reference["de"].translate(lines, beam_size=2)
    assert server.proc.wait(timeout=60) == 0  # one SIGTERM: a second could land in Python's exit
    log = server.log()
    assert "stopped: 1 requests, 6 lines in 1 searches; 0 refused" in log and "stopped by SIGTERM" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--checkpoint", "{bad}"], "error: checkpoint .*bad.ckpt"),
        (
            ["--target-lang", "es"],
            "--target-lang: this model was not trained to translate into es, only into de, fr",
        ),
        (["--max-request-lines", "9", "--max-queued-lines", "8"], "could never be queued"),
        (["--device", "gpu-please"], "not a device"),
    ],
)
def test_a_bad_checkpoint_or_option_is_a_one_line_error(
    tmp_path, checkpoint, capsys, options, message
) -> None:
    from translation.serve.__main__ import main

    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    args = ["--checkpoint", str(checkpoint), *(o.format(bad=tmp_path / "bad.ckpt") for o in options)]
    assert main([*args, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python3 -m translation.serve: error: ") and re.search(message, err), err
