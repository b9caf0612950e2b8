"""Preparation killed (SIGKILL) or out of disk at each stage: nothing half-done looks complete."""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from data import atomic as atomic_mod
from data import corpus as corpus_mod
from data import lines as lines_mod
from data import prepared as prepared_mod
from data import spm_training
from data.datamodule import TranslationDataModule
from data.tokenizer import SubwordTokenizer

VOCAB = 64


def _datamodule(corpus_dir: Path, cache: Path) -> TranslationDataModule:
    return TranslationDataModule(
        data_dir=str(corpus_dir), vocab_size=VOCAB, max_tokens=300, cache_dir=str(cache)
    )


def _kill_self(*args: object, **kwargs: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _corpus_killed_midway(m: pytest.MonkeyPatch) -> None:
    m.setattr(lines_mod, "_BLOCK_BYTES", 1024)  # several blocks per file
    blocks = corpus_mod.iter_parallel_blocks

    def two_blocks_then_die(*args: object):  # noqa: ANN202
        for n, block in enumerate(blocks(*args)):
            if n == 2:
                _kill_self()
            yield block

    m.setattr(corpus_mod, "iter_parallel_blocks", two_blocks_then_die)


def _sentencepiece_killed(m: pytest.MonkeyPatch) -> None:
    m.setattr(spm_training, "train_sentencepiece", _kill_self)


def _tokenize_killed_midway(m: pytest.MonkeyPatch) -> None:
    encode = SubwordTokenizer.encode
    calls = []

    def die_on_the_third_batch(self: SubwordTokenizer, texts: list[str]) -> list[list[int]]:
        calls.append(1)
        if len(calls) == 3:  # train (src, tgt) done, validation half-way
            _kill_self()
        return encode(self, texts)

    m.setattr(SubwordTokenizer, "encode", die_on_the_third_batch)


def _prepare_in_a_child(corpus_dir: Path, cache: Path, sabotage: Callable[[pytest.MonkeyPatch], None]) -> int:
    def run() -> None:
        with pytest.MonkeyPatch.context() as m:
            sabotage(m)
            _datamodule(corpus_dir, cache).prepare_data()
        os._exit(0)

    child = multiprocessing.get_context("fork").Process(target=run)
    child.start()
    child.join(120)
    return child.exitcode


def _complete_entries(cache: Path) -> dict[str, list[str]]:
    """What a later run would take for complete (hidden temporaries and locks excluded)."""
    return {
        "corpus": sorted(p.parent.name for p in (cache / "corpus").glob("*/complete.json")),
        "spm": sorted(p.name for p in (cache / "spm").glob("[!.]*.model")),
        "tokenized": sorted(p.name for p in (cache / "tokenized").glob("[!.]*.arrow")),
    }


def _count(m: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(module, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)

    m.setattr(module, name, counted)
    return calls


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork")
@pytest.mark.parametrize(
    ("sabotage", "stage"),
    [
        (_corpus_killed_midway, "corpus"),
        (_sentencepiece_killed, "spm"),
        (_tokenize_killed_midway, "tokenized"),
    ],
)
def test_kill_9_at_each_stage_then_the_next_run_redoes_it(
    tiny_corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sabotage: Callable, stage: str
) -> None:
    reference = _datamodule(tiny_corpus_dir, tmp_path / "clean")
    reference.setup("fit")
    complete = _complete_entries(tmp_path / "clean")

    cache = tmp_path / "cache"
    assert _prepare_in_a_child(tiny_corpus_dir, cache, sabotage) == -signal.SIGKILL
    left = _complete_entries(cache)
    stages = ["corpus", "spm", "tokenized"]
    for earlier in stages[: stages.index(stage)]:
        assert left[earlier] == complete[earlier]  # finished before the kill: kept
    assert len(left[stage]) < len(complete[stage])  # the killed stage left nothing complete
    assert all(not left[s] for s in stages[stages.index(stage) + 1 :])

    writes = _count(monkeypatch, prepared_mod, "write_pairs")
    trainings = _count(monkeypatch, spm_training, "train_sentencepiece")
    dm = _datamodule(tiny_corpus_dir, cache)
    dm.setup("fit")
    assert len(writes) == (3 if stage == "corpus" else 0)  # redone only where missing
    assert len(trainings) == (1 if stage in ("corpus", "spm") else 0)
    assert _complete_entries(cache) == complete
    assert not list(cache.rglob(".*.tmp"))  # the killed run's temporaries are gone
    assert dm.src_tokenizer.fingerprint == reference.src_tokenizer.fingerprint
    ids = sorted(i for b in dm.train_dataloader() for i in b["ids"].tolist())
    assert ids == sorted(i for b in reference.train_dataloader() for i in b["ids"].tolist())


def _disk_fills_after(m: pytest.MonkeyPatch, writes: int) -> None:
    """Files opened by the atomic writer accept ``writes`` writes, then fail as on a full disk."""
    fdopen = os.fdopen
    left = [writes]

    def filling_fdopen(*args: object, **kwargs: object):  # noqa: ANN202
        f = fdopen(*args, **kwargs)
        write = f.write

        def write_until_full(payload: bytes) -> int:
            left[0] -= 1
            if left[0] < 0:
                write(bytes(payload)[: len(payload) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(payload)

        f.write = write_until_full
        return f

    m.setattr(atomic_mod.os, "fdopen", filling_fdopen)


def test_full_disk_while_writing_the_corpus_or_the_model(
    tiny_corpus_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr(lines_mod, "_BLOCK_BYTES", 1024)  # several record batches per split
    with monkeypatch.context() as m:
        _disk_fills_after(m, 3)
        with pytest.raises(OSError, match="No space left"):
            _datamodule(tiny_corpus_dir, cache).prepare_data()
    assert _complete_entries(cache)["corpus"] == []
    assert list(cache.rglob(".*.tmp")) == []  # the half-written file was removed at once

    real_train = spm_training.train_sentencepiece

    def train_then_fill_the_disk(*args: object, **kwargs: object) -> SubwordTokenizer:
        tokenizer = real_train(*args, **kwargs)
        _disk_fills_after(monkeypatch, 0)  # the corpus is written; the model finds the disk full
        return tokenizer

    with monkeypatch.context() as m:
        m.setattr(spm_training, "train_sentencepiece", train_then_fill_the_disk)
        with pytest.raises(OSError, match="No space left"):
            _datamodule(tiny_corpus_dir, cache).prepare_data()
    monkeypatch.undo()
    left = _complete_entries(cache)
    assert len(left["corpus"]) == 1 and left["spm"] == []  # corpus kept, no half model
    assert list(cache.rglob(".*.tmp")) == []

    dm = _datamodule(tiny_corpus_dir, cache)
    dm.setup("fit")
    assert dm.src_vocab_size == VOCAB
    assert sorted(i for b in dm.train_dataloader() for i in b["ids"].tolist()) == list(range(400))
