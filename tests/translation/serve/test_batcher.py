"""The queue and its decoding thread, with a stand-in search (no model, no server).

The stand-in holds its first search until the test has queued everything, so that what the
decoder then takes is decided by the queue alone, not by timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from translation.serve.batcher import Batcher, BatchLimits, QueueFullError


class HeldSearch:
    """``decode`` that answers each source with (key, source), records every call, and holds
    the first call until :meth:`release`."""

    def __init__(self, fail_on: Hashable | None = None) -> None:
        self.calls: list[tuple[Hashable, list[list[int]]]] = []
        self.started = threading.Event()
        self.released = threading.Event()
        self.fail_on = fail_on

    def __call__(self, key: Hashable, sources: list[list[int]]) -> list[tuple[Hashable, list[int]]]:
        self.calls.append((key, sources))
        self.started.set()
        assert self.released.wait(30)
        if key == self.fail_on:
            raise RuntimeError("the search broke")
        return [(key, s) for s in sources]

    def release(self) -> None:
        self.released.set()


def started(limits: BatchLimits, search: HeldSearch) -> Batcher:
    """A batcher whose decoder is inside its first (held) search of one line of key "first"."""
    batcher = Batcher(search, limits)
    batcher.start()
    batcher.submit("first", [[0]])
    assert search.started.wait(30)
    return batcher


JOBS = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 6)), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(JOBS, st.integers(1, 12), st.integers(1, 40))
def test_every_job_gets_its_own_lines_in_order_and_searches_keep_to_one_key_and_the_limits(
    jobs: list[tuple[str, int]], max_lines: int, max_tokens: int
) -> None:
    search = HeldSearch()
    limits = BatchLimits(max_queued_lines=1000, max_batch_lines=max_lines, max_batch_tokens=max_tokens)
    batcher = started(limits, search)
    futures, submitted = [], []
    for j, (key, n) in enumerate(jobs):
        sources = [[j, i] + [7] * (i % 3) for i in range(n)] + ([[]] if n % 2 else [])  # empty lines too
        futures.append(batcher.submit(key, sources))
        submitted.append((key, sources))
    search.release()
    for future, (key, sources) in zip(futures, submitted, strict=True):
        assert future.result(timeout=30) == [(key, s) for s in sources]
    batcher.close(timeout=30)
    calls = search.calls[1:]  # after the held one
    assert sum(len(sources) for _, sources in calls) == sum(len(s) for _, s in submitted)
    # One key per search, each job whole in one search, in arrival order within its key; a
    # search over the limits holds one job alone.
    position = {id(s): (j, i) for j, (_, sources) in enumerate(submitted) for i, s in enumerate(sources)}
    for key, sources in calls:
        jobs_in = [position[id(s)] for s in sources]
        assert all(submitted[j][0] == key for j, _ in jobs_in)
        assert jobs_in == sorted(jobs_in)
        tokens = sum(len(s) + 1 for s in sources if s)
        if len(sources) > max_lines or tokens > max_tokens:
            assert len({j for j, _ in jobs_in}) == 1
    # The oldest waiting job goes first: searches start in the order of their first jobs.
    firsts = [position[id(sources[0])][0] for _, sources in calls if sources]
    assert firsts == sorted(firsts)


def test_waiting_jobs_of_one_key_share_a_search() -> None:
    search = HeldSearch()
    batcher = started(BatchLimits(max_batch_lines=100), search)
    futures = [batcher.submit("k", [[i]]) for i in range(10)]
    search.release()
    assert [f.result(timeout=30) for f in futures] == [[("k", [i])] for i in range(10)]
    batcher.close(timeout=30)
    assert len(search.calls) == 2 and batcher.counters.searches == 2 and batcher.counters.requests == 11


def test_past_its_bound_the_queue_refuses_then_takes_again_once_searched() -> None:
    search = HeldSearch()
    batcher = started(BatchLimits(max_queued_lines=5), search)
    kept = batcher.submit("k", [[1]] * 4)  # the held search's line is not waiting: 4 of 5
    with pytest.raises(
        QueueFullError, match="4 lines are waiting and this request has 2: over the queue's bound of 5"
    ):
        batcher.submit("k", [[2]] * 2)
    assert batcher.queued_lines == 4 and batcher.counters.refused == 1
    search.release()
    assert len(kept.result(timeout=30)) == 4
    assert len(batcher.submit("k", [[3]] * 5).result(timeout=30)) == 5
    batcher.close(timeout=30)


def test_a_failed_search_fails_its_jobs_only() -> None:
    search = HeldSearch(fail_on="bad")
    batcher = started(BatchLimits(), search)
    bad = batcher.submit("bad", [[1]])
    good = batcher.submit("good", [[2]])
    search.release()
    with pytest.raises(RuntimeError, match="the search broke"):
        bad.result(timeout=30)
    assert good.result(timeout=30) == [("good", [2])]
    batcher.close(timeout=30)


def test_close_finishes_what_is_queued_then_refuses() -> None:
    search = HeldSearch()
    search.release()
    batcher = Batcher(search, BatchLimits(max_delay=60.0))  # a delay that close() cuts short
    batcher.start()
    waiting = batcher.submit("k", [[1], [2]])
    start = time.monotonic()
    batcher.close(timeout=30)
    assert time.monotonic() - start < 20
    assert waiting.result(timeout=0) == [("k", [1]), ("k", [2])]
    with pytest.raises(QueueFullError, match="shutting down"):
        batcher.submit("k", [[3]])


def test_the_decoder_waits_up_to_max_delay_for_more_jobs() -> None:
    calls: list[int] = []
    batcher = Batcher(lambda key, sources: calls.append(len(sources)) or sources, BatchLimits(max_delay=0.5))
    batcher.start()
    first = batcher.submit("k", [[1]])
    second = batcher.submit("k", [[2]])  # arrives within the delay: the same search
    assert first.result(timeout=30) == [[1]] and second.result(timeout=30) == [[2]]
    batcher.close(timeout=30)
    assert calls == [2]


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_batch_lines must be at least 1"):
        BatchLimits(max_batch_lines=0)
    with pytest.raises(ValueError, match="max_delay"):
        BatchLimits(max_delay=-1)
