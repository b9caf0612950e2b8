"""Decoding in several single-thread CPU processes at once instead of one multi-thread process.

Decoding runs one small step after another: per step a few matmuls of ``beam * batch`` rows and
dozens of small operators, each too small for two threads to share well. Two processes of one
thread each, every one decoding its own batches, keep two cores busier than one process of two
threads (CTranslate2's ``inter_threads`` does the same). It pays with small batches; with
translate.py's default 4,096-token batches one process's matmuls are big enough for two threads,
and the workers' start-up (a few seconds) is not won back (figures: BENCHMARKS.md, "Decoding
speed"). A worker needs several batches: a few big ones leave one idle at the end.

Each worker is a spawned interpreter (not a fork: forking a process whose OpenMP and oneDNN
thread pools have run is unsafe) that loads its own copy of the model from bytes made with
``torch.save`` (pickling the module itself would move the caller's weights into shared memory).
Memory grows by one process per worker. Batches go to whichever worker is free. A worker that
raises hands the exception to the caller; one that dies (killed, out of memory) makes the pool
raise ``BrokenProcessPool`` instead of waiting forever. Leaving the pool after an error (Ctrl-C
included) kills the workers at once, and a worker whose parent is gone exits by itself.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from multiprocessing.connection import wait
from typing import Any, TypeVar

import torch

from decoding.search import greedy_search
from transformer import Transformer

Item = TypeVar("Item")
Result = TypeVar("Result")

_MODEL: Transformer | None = None  # the worker process's copy of the model


def _exit_with_parent() -> None:
    """Worker: a daemon thread that ends this process once the parent process is gone."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _start_worker(model_bytes: bytes, threads: int, ready: mp.Queue) -> None:
    """Runs once in each worker: loads the model (with the parent's module swaps, made by
    ``fastpaths.optimize``), packs its weights, then reports its pid."""
    global _MODEL
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the pool
    _exit_with_parent()
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    model = torch.load(io.BytesIO(model_bytes), weights_only=False).eval()  # bytes made by our parent
    # One tiny search packs every weight matrix now (packing is lazy), not in the first batch.
    token = (model.cfg.pad_id + 1) % model.cfg.src_vocab_size
    greedy_search(model, torch.tensor([[token, token]]), token, token, max_len_a=0.0, max_len_b=1)
    _MODEL = model
    ready.put(os.getpid())


def _ready() -> None:
    """A job that only makes a worker start."""


def _call(fn: Callable[..., Any], item: Any) -> Any:  # noqa: ANN401
    """Runs in a worker: ``fn(model, item)``."""
    if _MODEL is None:
        raise RuntimeError("worker process without a model: _start_worker did not run")
    return fn(_MODEL, item)


class WorkerPool:
    """``workers`` spawned CPU processes, each with a copy of ``model`` and ``threads`` threads.

    The workers start at once, in the background; :meth:`wait_ready` waits for them. Use the
    pool as a context manager: leaving the block stops the workers, and kills them after an
    error (a Ctrl-C included).

    Args:
        model: a CPU model; each worker loads a copy (packed weights are not sent: each worker
            packs its own). The caller's model is left as it is.
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
        buffer = io.BytesIO()
        torch.save(model, buffer)
        context = mp.get_context("spawn")
        self._ready: mp.Queue = context.Queue()
        self._pids: list[int] = []
        self._executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(buffer.getvalue(), threads, self._ready),
        )
        try:
            # One job each: the executor starts a process for every job that finds no idle
            # worker, so all of them start now, while the caller goes on.
            self._started = [self._executor.submit(_ready) for _ in range(workers)]
        except BaseException:
            self._executor.shutdown(wait=False, cancel_futures=True)
            raise

    def wait_ready(self, timeout: float | None = None) -> list[int]:
        """Waits until every worker has loaded and packed its model; returns their pids.

        Raises:
            TimeoutError: not all ready after ``timeout`` seconds.
            The error of a worker that failed to start (``BrokenProcessPool`` if it died).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._pids) < self.workers:
            try:
                self._pids.append(self._ready.get(timeout=0.5))
                continue
            except queue.Empty:
                pass
            for future in self._started:
                if future.done() and future.exception() is not None:
                    raise future.exception()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{len(self._pids)} of {self.workers} workers ready after {timeout} s")
        return list(self._pids)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (waits until all have started)."""
        return self.wait_ready()

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

    def close(self) -> None:
        """Stops the workers once their running batches are done."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def kill(self) -> None:
        """Stops the workers at once (their running batches are lost)."""
        while True:  # pids of workers that became ready since the last look
            try:
                self._pids.append(self._ready.get_nowait())
            except queue.Empty:
                break
        for pid in self._pids:
            try:
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))  # no SIGKILL on Windows
            except ProcessLookupError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: type | None, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.kill()
