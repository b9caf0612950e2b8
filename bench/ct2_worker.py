"""CTranslate2 in a process of its own, for side-by-side timing with PyTorch.

A used ``ctranslate2.Translator`` that lives in the same process as PyTorch slows PyTorch's
later work down, every ATen operator, the small element-wise ones most, until the translator is
deleted (BENCHMARKS.md, "Decoding speed": "CTranslate2 and PyTorch in one process slow each
other down"). Both libraries bring their own OpenMP runtime and thread pools. Nobody deploys
the two in one process, so the benchmark gives CTranslate2 a child process: the parent sends it
batches through a pipe, one at a time, and waits, so the two never run at once and the
comparison stays interleaved. The pipe's cost (a few tokens pickled each way) is inside
CTranslate2's timed calls, well under a millisecond against hundreds per batch.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
from multiprocessing.connection import Connection


def _serve(conn: Connection, model_dir: str, threads: int, workers: int, compute_type: str) -> None:
    """Child: load the model, then translate each request until None arrives.

    A request is a list of ``(batch, options)``: a batch is a list of token lists, its options
    those of ``translate_batch`` (each batch may have its own length limit). All are submitted at
    once (``asynchronous=True``), so with ``workers`` > 1 CTranslate2 runs that many at a time,
    each with ``threads`` threads; the batches are kept as they are (``max_batch_size=0``).
    """
    import ctranslate2

    translator = ctranslate2.Translator(
        model_dir, device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=workers
    )
    conn.send("ready")
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the parent is gone
            return
        if request is None:
            return
        pending = [
            translator.translate_batch(batch, asynchronous=True, max_batch_size=0, **options)
            for batch, options in request
        ]
        conn.send([[r.result().hypotheses[0] for r in batch] for batch in pending])


class CT2Worker:
    """A CTranslate2 ``Translator`` (CPU) running in a spawned child process.

    ``threads``: its ``intra_threads``; ``workers``: its ``inter_threads`` (batches run at once);
    ``compute_type``: its ``compute_type`` (``"default"``: the type the model was saved in).
    """

    def __init__(self, model_dir: str, threads: int, workers: int = 1, compute_type: str = "float32") -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no PyTorch thread pools inherited
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve, args=(child, model_dir, threads, workers, compute_type), daemon=True
        )
        self._process.start()
        if self._conn.recv() != "ready":
            raise RuntimeError("the CTranslate2 worker did not start")
        atexit.register(self.close)

    def translate_batches(self, requests: list[tuple[list[list[str]], dict]]) -> list[list[list[str]]]:
        """Per ``(batch, options)``, the best hypothesis (tokens) per source, all submitted at once."""
        self._conn.send(requests)
        return self._conn.recv()

    def close(self) -> None:
        if self._process.is_alive():
            self._conn.send(None)
            self._process.join(timeout=10)
