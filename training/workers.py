"""Decoding in several single-thread CPU processes at once instead of one multi-thread process.

Decoding runs one small step after another: per step a few matmuls of ``beam * batch`` rows and
dozens of small operators, each too small for two threads to share well. Two processes of one
thread each, every one decoding its own batches, keep two cores busier than one process of two
threads (CTranslate2's ``inter_threads`` does the same); BENCHMARKS.md has the figures. It needs
several batches per worker: a few big ones leave a worker idle at the end.

Each worker is a spawned interpreter (not a fork: forking a process whose OpenMP and oneDNN
thread pools have run is unsafe) holding its own copy of the model, so start-up costs ~2 s and
memory grows by one process per worker. It pays with small batches (batches of 32 sentences:
1.25-1.6x); a single process given big batches (translate.py's default 4,096 tokens) is about as
fast, its matmuls then being big enough for two threads. Batches go to whichever worker is free. A worker that raises hands the exception to the
caller; one that dies (killed, out of memory) makes the pool raise ``BrokenProcessPool`` instead
of waiting forever.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

import torch

from transformer import Transformer

Item = TypeVar("Item")
Result = TypeVar("Result")

_MODEL: Transformer | None = None  # the worker process's copy of the model


def _start_worker(model: Transformer, threads: int) -> None:
    """Runs once in each worker: keeps the model, packed for inference, at ``threads`` threads."""
    global _MODEL
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    _MODEL = model.eval().pack_for_inference()


def _ready() -> None:
    """A job that only makes a worker start."""


def _call(fn: Callable[..., Any], item: Any) -> Any:  # noqa: ANN401
    """Runs in a worker: ``fn(model, item)``."""
    if _MODEL is None:
        raise RuntimeError("worker process without a model: _start_worker did not run")
    return fn(_MODEL, item)


class WorkerPool:
    """``workers`` spawned CPU processes, each with a copy of ``model`` and ``threads`` threads.

    Use it as a context manager; leaving the block stops the workers (at once after an error).

    Args:
        model: a CPU model; each worker gets a pickled copy (packed weights are not sent: they
            are packed again there).
        workers: number of processes (at least 1).
        threads: torch threads in each process (at least 1).

    Raises:
        ValueError: fewer than one worker or thread, or the model is not on the CPU.
    """

    def __init__(self, model: Transformer, workers: int, threads: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        if threads < 1:
            raise ValueError(f"threads per worker must be at least 1, not {threads}")
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"worker processes decode on the CPU; the model is on {device}")
        self.workers, self.threads = workers, threads
        self._executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=mp.get_context("spawn"),
            initializer=_start_worker,
            initargs=(model, threads),
        )
        # One job each now: the executor starts a process per job that finds none idle, so all
        # of them start at once, while the caller goes on (reading input, tokenizing).
        for _ in range(workers):
            self._executor.submit(_ready)

    def imap_unordered(
        self, fn: Callable[[Transformer, Item], Result], items: Iterable[Item]
    ) -> Iterator[tuple[int, Result]]:
        """``(i, fn(model, items[i]))`` for every item, in the order the workers finish them.

        ``fn`` must be picklable: a function defined at the top level of an importable module
        (or a ``functools.partial`` of one). Every item is handed out at once; a free worker
        takes the next one.

        Raises:
            Whatever ``fn`` raised in a worker (the first one met); ``BrokenProcessPool`` if a
            worker died.
        """
        futures: dict[Future, int] = {
            self._executor.submit(_call, fn, item): i for i, item in enumerate(items)
        }
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()  # after an error or an abandoned loop: drop the batches not started

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers started so far (to watch their memory, for instance)."""
        return sorted(self._executor._processes or {})

    def close(self, wait: bool = True) -> None:
        """Stops the workers; ``wait=False`` does not wait for running batches."""
        self._executor.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: type | None, *_: object) -> None:
        self.close(wait=exc_type is None)
