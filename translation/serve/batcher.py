"""Requests gathered into searches: one queue, one decoding thread.

Each request is a job: its lines' subword ids and a key (its search settings and target
language). :meth:`Batcher.submit` queues the job and returns a future of its results, or raises
:class:`QueueFullError` when the lines waiting would pass ``max_queued_lines``: the caller answers 503
at once instead of letting waits grow without bound. One thread, the decoder, loops:

1. it waits for a job; with ``max_delay`` > 0 it then waits up to that long after the oldest
   job's arrival for more to come, unless a full batch of lines is already waiting;
2. it takes the oldest job, whatever its size, then the later jobs *with the same key*, in
   arrival order, while the lines stay within ``max_batch_lines`` and the source tokens within
   ``max_batch_tokens`` (jobs with other settings are left for the next rounds: one search has
   one config);
3. it decodes their lines together in one call of ``decode`` (``decoding.Searcher`` sorts them
   by length and batches them under the device's budget), and hands each job its own slice of
   the results, in its order.

The oldest job always goes first, so no key waits behind another forever. A search that
raises fails the futures of its jobs, not the thread. While one search runs, requests queue up,
so the busier the server, the larger its searches: batching comes from load, not from waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

Result = TypeVar("Result")
# decode(key, sources) -> one result per source, in order.
Decode = Callable[[Hashable, list[list[int]]], Sequence[Result]]


class QueueFullError(Exception):
    """The queue cannot take a job: over its bound, or closed (the server is stopping)."""


@dataclass(frozen=True)
class BatchLimits:
    """How much the queue holds and one search takes.

    Attributes:
        max_queued_lines: lines waiting (not yet in a search) at most; a job that would pass
            it is refused (:class:`QueueFullError`).
        max_batch_lines: lines in one search, unless one job alone has more.
        max_batch_tokens: source subwords (EOS included) in one search, unless one job alone
            has more.
        max_delay: seconds the decoder waits after the oldest job's arrival for more jobs to
            join its search; 0: it starts at once.
    """

    max_queued_lines: int = 4096
    max_batch_lines: int = 512
    max_batch_tokens: int = 16384
    max_delay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_queued_lines", "max_batch_lines", "max_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_delay < 0:
            raise ValueError(f"max_delay must be at least 0, not {self.max_delay}")


@dataclass
class Job:
    """One request's lines waiting for their search."""

    key: Hashable
    sources: list[list[int]]
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> int:
        """Source subwords with EOS; an empty line costs nothing (it never reaches the model)."""
        return sum(len(s) + 1 for s in self.sources if s)


@dataclass
class Counters:
    """What the decoder has done, for ``/health`` and the tests of batching."""

    requests: int = 0
    lines: int = 0
    searches: int = 0
    refused: int = 0


class Batcher(Generic[Result]):
    """The queue and its decoding thread (module docstring).

    Args:
        decode: searches one batch: ``decode(key, sources)`` gives one result per source.
        limits: the queue's bound and a search's size.
    """

    def __init__(self, decode: Decode, limits: BatchLimits) -> None:
        self.decode = decode
        self.limits = limits
        self.counters = Counters()
        self._queue: deque[Job] = deque()
        self._queued_lines = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="decoder", daemon=True)

    @property
    def queued_lines(self) -> int:
        """Lines waiting for a search (those in the running search not counted)."""
        return self._queued_lines

    def start(self) -> None:
        self._thread.start()

    def submit(self, key: Hashable, sources: list[list[int]]) -> Future:
        """Queues one request's sources; its future gets their results, in order.

        Raises:
            QueueFullError: the queue is closed, or its lines would pass ``max_queued_lines``.
        """
        job = Job(key, sources)
        with self._cond:
            if self._closed:
                self.counters.refused += 1
                raise QueueFullError("the server is shutting down")
            if self._queued_lines + len(sources) > self.limits.max_queued_lines:
                self.counters.refused += 1
                raise QueueFullError(
                    f"{self._queued_lines} lines are waiting and this request has {len(sources)}: "
                    f"over the queue's bound of {self.limits.max_queued_lines} lines; try again shortly"
                )
            self._queue.append(job)
            self._queued_lines += len(sources)
            self.counters.requests += 1
            self._cond.notify()
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Refuses new jobs, lets the decoder finish those queued, and waits for it."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._search(batch)

    def _next_batch(self) -> list[Job] | None:
        """The jobs of the next search, taken off the queue; None once closed and empty."""
        limits = self.limits
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].arrived + limits.max_delay
            while not self._closed and self._queued_lines < limits.max_batch_lines:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            first = self._queue.popleft()
            batch, lines, tokens = [first], len(first.sources), first.tokens
            kept: deque[Job] = deque()
            full = False
            while self._queue:
                job = self._queue.popleft()
                if not full and job.key == first.key:
                    if lines + len(job.sources) <= limits.max_batch_lines and (
                        tokens + job.tokens <= limits.max_batch_tokens
                    ):
                        batch.append(job)
                        lines, tokens = lines + len(job.sources), tokens + job.tokens
                        continue
                    full = True  # later jobs of this key keep their turn behind this one
                kept.append(job)
            self._queue = kept
            self._queued_lines -= lines
            return batch

    def _search(self, batch: list[Job]) -> None:
        """One search of the batch's lines; each job's future gets its slice, or the error."""
        sources = [s for job in batch for s in job.sources]
        try:
            results = list(self.decode(batch[0].key, sources)) if sources else []
            if len(results) != len(sources):
                raise RuntimeError(f"the search gave {len(results)} results for {len(sources)} lines")
        except Exception as err:
            logger.exception("a search of %d lines failed", len(sources))
            for job in batch:
                job.future.set_exception(err)
            return
        with self._cond:
            self.counters.searches += 1
            self.counters.lines += len(sources)
        start = 0
        for job in batch:
            job.future.set_result(results[start : start + len(job.sources)])
            start += len(job.sources)
