"""Sentence pairs streamed into Arrow in bounded blocks: never a whole corpus as Python lists.

:func:`write_pairs` takes blocks of ``(ids, sources, targets)`` (from files read block by block, or
from a hub split iterated in batches), drops blank training pairs, and appends each block to an
Arrow stream file as one record batch. The file is then memory-mapped by ``datasets``, so a corpus
of tens of millions of pairs costs page cache, not Python strings. A digest of the written
columns identifies the content for the caches built on it (SentencePiece, tokenization) without
another pass over the text.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from datasets.table import InMemoryTable

from data.atomic import atomic_write
from data.filters import PairFilter

# The columns of every split: the row's line number (0-based, before filtering), source, target.
FEATURES = datasets.Features(
    {"id": datasets.Value("int64"), "src": datasets.Value("string"), "tgt": datasets.Value("string")}
)


@dataclass
class SplitStats:
    """What :func:`write_pairs` did to one split.

    Attributes:
        rows: pairs read.
        kept: pairs written.
        empty: pairs dropped for an empty side.
        blank: pairs dropped for a whitespace-only side.
        filtered: pairs dropped by ``data.filters``, by reason (:mod:`data.filters`).
        digest: sha256 (hex) of the written ``id``, ``src`` and ``tgt`` columns.
        seconds: wall time per stage, ``{"read": ..., "filter": ...}``; ``read`` includes decoding
            and writing, ``filter`` only the blank-pair checks.
    """

    rows: int = 0
    kept: int = 0
    empty: int = 0
    blank: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    digest: str = ""
    seconds: dict[str, float] = field(default_factory=lambda: {"read": 0.0, "filter": 0.0})


def blank_mask(sources: Sequence[str], targets: Sequence[str]) -> tuple[np.ndarray, int, int]:
    """Which pairs to keep: both sides non-empty and not whitespace-only (``str.strip``).

    Returns:
        ``(keep [n] bool, number with an empty side, number with a whitespace-only side)``.
    """
    keep = np.ones(len(sources), dtype=bool)
    empty = blank = 0
    for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
        if not s or not t:
            keep[i] = False
            empty += 1
        elif not s.strip() or not t.strip():
            keep[i] = False
            blank += 1
    return keep, empty, blank


def _hash_array(h: hashlib._Hash, array: pa.Array) -> None:
    # Offsets and data of a freshly built array start at zero: equal columns, equal bytes.
    for buf in array.buffers():
        if buf is not None:
            h.update(buf)


def write_pairs(
    blocks: Iterable[tuple[np.ndarray | None, list[str], list[str]]],
    path: Path | None,
    drop_blank: bool,
    src_prefix: str = "",
    pair_filter: PairFilter | None = None,
) -> tuple[datasets.Dataset, SplitStats]:
    """Write blocks of pairs to an Arrow stream file (or an in-memory table) and open it.

    Args:
        blocks: ``(ids or None, sources, targets)`` per block, aligned; ``None`` ids number the
            rows consecutively from 0.
        path: the Arrow file to write (its directory must exist), written whole or not at all
            (:func:`data.atomic.atomic_write`); ``None``: keep the table in memory (small
            corpora, tests).
        drop_blank: drop pairs with an empty or whitespace-only side (training split).
        src_prefix: text put before every source kept (tags such as ``"<2fr> "``), after the
            blank check.
        pair_filter: ``data.filters`` applied after the blank check (training split), counted.

    Returns:
        The split, memory-mapped from ``path`` where given, and its :class:`SplitStats`.
    """
    stats = SplitStats()
    tick = time.perf_counter()
    if path is None:
        in_memory: list[pa.RecordBatch] = []
        _write_blocks(blocks, in_memory.append, drop_blank, stats, src_prefix, pair_filter)
        dataset = datasets.Dataset(
            InMemoryTable(pa.Table.from_batches(in_memory, schema=FEATURES.arrow_schema))
        )
    else:
        with atomic_write(path) as f, pa.ipc.new_stream(f, FEATURES.arrow_schema) as writer:
            _write_blocks(blocks, writer.write_batch, drop_blank, stats, src_prefix, pair_filter)
        dataset = datasets.Dataset.from_file(str(path))
    stats.seconds["read"] = time.perf_counter() - tick - stats.seconds["filter"]
    return dataset, stats


def _write_blocks(
    blocks: Iterable[tuple[np.ndarray | None, list[str], list[str]]],
    write: Callable[[pa.RecordBatch], None],
    drop_blank: bool,
    stats: SplitStats,
    src_prefix: str = "",
    pair_filter: PairFilter | None = None,
) -> None:
    """Filter, hash and hand each block to ``write`` as one record batch; fill in ``stats``."""
    schema = FEATURES.arrow_schema
    h = hashlib.sha256()
    for ids, sources, targets in blocks:
        n = len(sources)
        if ids is None:
            ids = np.arange(stats.rows, stats.rows + n, dtype=np.int64)
        stats.rows += n
        if drop_blank:
            t0 = time.perf_counter()
            keep, empty, blank = blank_mask(sources, targets)
            stats.empty += empty
            stats.blank += blank
            if pair_filter is not None:  # on what the blank check kept
                keep[keep] = pair_filter.keep(
                    [s for s, k in zip(sources, keep, strict=True) if k],
                    [t for t, k in zip(targets, keep, strict=True) if k],
                )
            if not keep.all():
                ids = np.asarray(ids)[keep]
                sources = [s for s, k in zip(sources, keep, strict=True) if k]
                targets = [t for t, k in zip(targets, keep, strict=True) if k]
            stats.seconds["filter"] += time.perf_counter() - t0
        if src_prefix:
            sources = [src_prefix + s for s in sources]
        columns = [
            pa.array(np.asarray(ids, dtype=np.int64)),
            pa.array(sources, type=pa.string()),
            pa.array(targets, type=pa.string()),
        ]
        for column in columns:
            _hash_array(h, column)
        batch = pa.RecordBatch.from_arrays(columns, schema=schema)
        stats.kept += n if not drop_blank else len(sources)
        write(batch)
    stats.digest = h.hexdigest()
    if pair_filter is not None:
        stats.filtered = {k: v for k, v in pair_filter.counts.items() if v}


def iter_record_batches(dataset: datasets.Dataset) -> Iterator[pa.RecordBatch]:
    """The record batches of a split, read from its Arrow file rather than through its memory map.

    Reading a file through the memory map leaves every page touched counted in the process's
    resident memory (a 36M-pair corpus is 6 GB of them); read batch by batch, only the batch being
    used is resident, and the kernel keeps the file in its page cache all the same.

    Args:
        dataset: a split; one written to a single Arrow file (the corpus cache) is streamed from
            it, any other (in memory, several files, a ``select``) yields its table's batches.

    Yields:
        Record batches, in row order.
    """
    files = dataset.cache_files
    if len(files) != 1 or dataset._indices is not None:
        yield from dataset.data.table.to_batches()
        return
    with pa.OSFile(files[0]["filename"]) as source:
        yield from pa.ipc.open_stream(source)


class StreamedColumn:
    """One column of a split, its chunks read from the file one at a time (:func:`iter_record_batches`).

    What :func:`data.tokenizer.sample_sentences` takes in place of a list: ``len()`` and
    ``chunks``, without the whole column ever resident.

    Args:
        dataset: the split.
        name: the column.
    """

    def __init__(self, dataset: datasets.Dataset, name: str) -> None:
        self.dataset, self.name = dataset, name

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def chunks(self) -> Iterator[pa.Array]:
        for batch in iter_record_batches(self.dataset):
            yield batch.column(self.name)
