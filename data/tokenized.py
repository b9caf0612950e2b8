"""Whole splits tokenized into Arrow: subword ids and lengths, cached by content, memory-mapped.

A split's ``id, src, tgt`` rows are encoded a block at a time by the source and target
:class:`data.tokenizer.SubwordTokenizer` into ``<cache_dir>/tokenized/<key>.arrow``, ``key``
hashing the split's content and both models' bytes; the file is written whole or not at all, and
the same text with the same models is mapped instead of re-encoded.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from data.atomic import atomic_write
from data.spm_training import CACHE_VERSION, hash_texts
from data.tokenizer import EOS_ID, SubwordTokenizer

if TYPE_CHECKING:  # imported in the functions that use them: importing this module stays cheap
    import datasets
    import pyarrow as pa

logger = logging.getLogger(__name__)

# Encoded blocks of ``batch_size`` rows per record batch of a tokenized cache file: the loader
# takes a batch's rows record batch by record batch (data.tokenized_pairs.TokenizedPairs), and with
# 36M pairs in 50,000-row record batches a 1,000-row batch touched ~700 of them (BENCHMARKS.md,
# "Data preparation at WMT scale").
_BLOCKS_PER_RECORD_BATCH = 10


def tokenize_split(
    dataset: datasets.Dataset,
    src_tokenizer: SubwordTokenizer,
    tgt_tokenizer: SubwordTokenizer,
    cache_dir: str | Path | None = None,
    batch_size: int = 50_000,
    content_key: str | None = None,
) -> datasets.Dataset:
    """Add subword ids and lengths, a block of rows at a time, into a memory-mapped Arrow file.

    The cache file is keyed by the split's content (``id``, ``src``, ``tgt``) and both models'
    bytes, so the same text with the same models is read back instead of re-encoded. It is written
    whole or not at all (:func:`data.atomic.atomic_write`), and one process at a time encodes a
    given split (:func:`data.cache.exclusive`); the others wait and map the file.

    Args:
        dataset: columns ``id``, ``src``, ``tgt``.
        src_tokenizer: source model.
        tgt_tokenizer: target model.
        cache_dir: cache root (``<cache_dir>/tokenized/<key>.arrow``); ``None`` keeps it in memory.
        batch_size: rows encoded at a time; the cache file's record batches hold ten times as
            many (few, large record batches keep the loader's gathers few:
            :class:`data.tokenized_pairs.TokenizedPairs`).
        content_key: identifies the split's content (e.g. its corpus digest), so that it need
            not be hashed; ``None``: hashed here, one pass over the text.

    Returns:
        Columns ``id``, ``src_ids`` (subwords + EOS), ``tgt_ids`` (subwords, no BOS/EOS),
        ``src_len`` (``len(src_ids)``, the padded source width it needs) and ``tgt_len``
        (``len(tgt_ids) + 1``, the width of the decoder input and target).
    """
    import datasets  # noqa: F811 (lazy: see the module's imports)
    import pyarrow as pa
    from datasets.table import InMemoryTable

    from data.cache import exclusive, remove_temporaries

    key = _content_key(dataset, src_tokenizer, tgt_tokenizer, content_key)
    encoded = _encoded(dataset, src_tokenizer, tgt_tokenizer, batch_size)
    if cache_dir is None:
        table = pa.Table.from_batches(list(encoded), schema=_TOKENIZED_FEATURES().arrow_schema)
        return datasets.Dataset(InMemoryTable(table))
    path = Path(cache_dir) / "tokenized" / f"{key}.arrow"
    if not path.is_file():
        with exclusive(path):
            if not path.is_file():
                remove_temporaries(path)
                logger.info("tokenizing %d pairs into %s", len(dataset), path)
                _write(encoded, path)
    return datasets.Dataset.from_file(str(path))


def _content_key(
    dataset: datasets.Dataset,
    src_tokenizer: SubwordTokenizer,
    tgt_tokenizer: SubwordTokenizer,
    content_key: str | None,
) -> str:
    """The cache file's name: a hash of both models and the split's content (``content_key``, or
    the ``id``, ``src`` and ``tgt`` columns hashed here)."""
    h = hashlib.sha256(f"{CACHE_VERSION}|{src_tokenizer.fingerprint}|{tgt_tokenizer.fingerprint}".encode())
    if content_key is not None:
        h.update(content_key.encode())
    else:
        for batch in dataset.iter(batch_size=10_000):
            h.update(json.dumps(batch["id"]).encode())
            hash_texts(h, batch["src"])
            hash_texts(h, batch["tgt"])
    return h.hexdigest()[:32]


def _encoded(
    dataset: datasets.Dataset,
    src_tokenizer: SubwordTokenizer,
    tgt_tokenizer: SubwordTokenizer,
    batch_size: int,
) -> Iterator[pa.RecordBatch]:
    """The split's rows encoded ``batch_size`` at a time: ``id``, ``src_ids``, ``tgt_ids``, lengths."""
    import pyarrow as pa

    from data.arrow_pairs import iter_record_batches

    schema = _TOKENIZED_FEATURES().arrow_schema
    blocks = (
        rb.slice(i, batch_size) for rb in iter_record_batches(dataset) for i in range(0, len(rb), batch_size)
    )
    for batch in blocks:
        src = _id_lists(src_tokenizer.encode(batch.column("src").to_pylist()), append=EOS_ID)
        tgt = _id_lists(tgt_tokenizer.encode(batch.column("tgt").to_pylist()))
        columns = [batch.column("id"), src, tgt]
        lengths = [src.value_lengths(), pa.array(tgt.value_lengths().to_numpy() + 1, type=pa.int32())]
        yield pa.RecordBatch.from_arrays(columns + lengths, schema=schema)


def _write(encoded: Iterator[pa.RecordBatch], path: Path) -> None:
    """Writes the encoded blocks to ``path`` whole or not at all, :data:`_BLOCKS_PER_RECORD_BATCH`
    blocks to a record batch."""
    import pyarrow as pa

    with atomic_write(path) as f, pa.ipc.new_stream(f, _TOKENIZED_FEATURES().arrow_schema) as writer:
        pending: list[pa.RecordBatch] = []
        for i, record_batch in enumerate(encoded, start=1):
            pending.append(record_batch)
            if i % _BLOCKS_PER_RECORD_BATCH == 0:
                writer.write_table(pa.Table.from_batches(pending).combine_chunks())
                pending = []
        if pending:
            writer.write_table(pa.Table.from_batches(pending).combine_chunks())


def _TOKENIZED_FEATURES() -> datasets.Features:  # noqa: N802 (a constant, built lazily)
    import datasets  # noqa: F811

    return datasets.Features(
        {
            "id": datasets.Value("int64"),
            "src_ids": datasets.List(datasets.Value("int32")),
            "tgt_ids": datasets.List(datasets.Value("int32")),
            "src_len": datasets.Value("int32"),
            "tgt_len": datasets.Value("int32"),
        }
    )


def _id_lists(ids: list[list[int]], append: int | None = None) -> pa.ListArray:
    """Lists of ids as an Arrow ``list<int32>`` column, ``append`` added to each, without per-id Python work.

    Args:
        ids: ``batch`` lists of ids.
        append: an id added at the end of every list (EOS), or ``None``.

    Returns:
        ``[batch]`` list array.
    """
    import pyarrow as pa

    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    if append is not None:
        ends = np.cumsum(lengths + 1) - 1  # where each list's extra id goes
        out = np.empty(len(flat) + len(ids), dtype=np.int32)
        keep = np.ones(len(out), dtype=bool)
        keep[ends] = False
        out[keep] = flat
        out[ends] = append
        flat, lengths = out, lengths + 1
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
