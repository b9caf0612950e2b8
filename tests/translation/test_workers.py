"""WorkerPool: batches searched in spawned processes give what one process gives, in input order.

Each pool spawns interpreters that import torch (~2-3 s), so one module-scoped pool serves the
tests that translate.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
import torch

from data.tokenizer import SubwordTokenizer
from decoding import PLAIN
from decoding.search import greedy_search
from decoding.service import search_batch
from tests.toy_text import toy_pairs, train_word_spm
from tests.transformer.helpers import tiny_model
from translation.translator import SearchOptions, Translator
from translation.workers import WorkerPool

TEXTS = [s for s, _ in toy_pairs(40, seed=5)] + ["", "  ", "hund"]


@pytest.fixture(scope="module")
def translator() -> Translator:
    pairs = toy_pairs(50, seed=0)
    src = SubwordTokenizer(train_word_spm([s for s, _ in pairs]))
    tgt = SubwordTokenizer(train_word_spm([t for _, t in pairs]))
    torch.manual_seed(0)
    model = tiny_model(src_vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size, max_positions=16)
    return Translator(model, src, tgt, bos_id=2, eos_id=3, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def pool(translator: Translator) -> Iterator[WorkerPool]:
    with WorkerPool(translator.model, workers=2, threads=1) as workers:
        workers.wait_ready(timeout=120)  # both up, so that jobs are shared from the start
        yield workers


@pytest.mark.parametrize("options", [SearchOptions(greedy=True), SearchOptions(beam_size=3, nbest=2)])
def test_pool_translates_like_one_process(
    translator: Translator, pool: WorkerPool, options: SearchOptions
) -> None:
    sources = translator.encode_sources(TEXTS)
    here = translator.translate_ids(sources, options, max_tokens=12)
    done: list[int] = []
    there = translator.translate_ids(sources, options, max_tokens=12, pool=pool, progress=done.append)
    assert len(done) > 2  # several batches, so the two workers shared them
    assert sum(done) == sum(1 for s in sources if s)
    assert len(there) == len(TEXTS)
    for a, b in zip(here, there, strict=True):
        assert [(h.text, h.tokens) for h in a] == [(h.text, h.tokens) for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5, nan_ok=True)
    assert there[-3] == there[-2] == []  # empty lines stay empty, in place


def greedy_ids(model: torch.nn.Module, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """A job defined in a test module: the workers import this module to run it."""
    with torch.no_grad():
        return greedy_search(model, src, 2, 3, max_len_a=0.0, max_len_b=max_len)


def echo_after(model: torch.nn.Module, job: tuple[str, float]) -> tuple[str, int]:
    """Returns the job's name and the worker's pid after sleeping the job's delay."""
    time.sleep(job[1])
    return job[0], os.getpid()


def test_out_of_order_results_keep_their_index(pool: WorkerPool) -> None:
    jobs = [("slow", 1.0), ("a", 0.0), ("b", 0.0), ("c", 0.0)]
    finished = list(pool.imap_unordered(echo_after, jobs))
    assert [i for i, _ in finished] != [0, 1, 2, 3]  # the slow first job came back last
    assert sorted((i, name) for i, (name, _) in finished) == [(0, "slow"), (1, "a"), (2, "b"), (3, "c")]
    assert {pid for _, (_, pid) in finished} == set(pool.pids)  # both workers took jobs


def test_results_come_back_with_their_index(translator: Translator, pool: WorkerPool) -> None:
    src = [torch.tensor([[5 + i, 6, 3]]) for i in range(6)]
    fn = functools.partial(greedy_ids, max_len=4)
    results = dict(pool.imap_unordered(fn, src))
    assert sorted(results) == list(range(6))
    assert [results[i] for i in range(6)] == [fn(translator.model, s) for s in src]


def test_an_error_in_a_worker_reaches_the_caller(pool: WorkerPool) -> None:
    bad_job = (torch.tensor([[5, 6, 3]]), SearchOptions(), 2, 3, None)  # the kernels missing
    with pytest.raises(ValueError, match="not enough values to unpack"):
        list(pool.imap_unordered(search_batch, [bad_job]))
    # The pool still works afterwards.
    good_job = (torch.tensor([[5, 6, 3]]), SearchOptions(greedy=True), 2, 3, None, PLAIN, None)
    assert [i for i, _ in pool.imap_unordered(search_batch, [good_job])] == [0]


def test_bad_settings_are_errors(translator: Translator) -> None:
    with pytest.raises(ValueError, match="workers must be at least 1"):
        WorkerPool(translator.model, workers=0)
    with pytest.raises(ValueError, match="threads per worker must be at least 1"):
        WorkerPool(translator.model, workers=2, threads=0)


def exit_process(model: torch.nn.Module, code: int) -> None:
    """A job that kills its worker, as the out-of-memory killer would."""
    os._exit(code)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or reaped during the read
        return False
    return "\nState:\tZ" not in status


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_dead_worker_is_an_error_not_a_hang(translator: Translator) -> None:
    def run() -> None:
        with WorkerPool(translator.model, workers=1) as dying:  # its own pool: this one breaks
            list(dying.imap_unordered(exit_process, [3]))

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        with pytest.raises(BrokenProcessPool):
            thread.submit(run).result(timeout=120)  # a hang fails the test instead of CI


def test_leaving_after_an_error_kills_the_workers(translator: Translator) -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match="non-negative"):
        with WorkerPool(translator.model, workers=2) as workers:
            pids = workers.wait_ready(timeout=120)
            # One worker sleeps for a minute while the other fails: the pool must not wait.
            list(workers.imap_unordered(echo_after, [("slow", 60.0), ("bad", -1.0)]))
    assert time.monotonic() - start < 45
    assert gone_within(pids, 10)


def test_the_callers_model_stays_out_of_shared_memory(translator: Translator, pool: WorkerPool) -> None:
    # Pickling the module for the workers would have moved its weights to /dev/shm.
    assert not any(p.is_shared() for p in translator.model.parameters())


ORPHAN_SCRIPT = """
import os, signal, sys
import torch
from tests.transformer.helpers import tiny_model
from translation.workers import WorkerPool

if __name__ == "__main__":
    pool = WorkerPool(tiny_model(src_vocab_size=20, tgt_vocab_size=20), workers=2)
    print(*pool.wait_ready(timeout=120), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no clean-up at all
"""


def test_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, str(script)], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2, result.stderr
    assert gone_within(pids, 10)
