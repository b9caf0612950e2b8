"""The rows of a tokenized split served a whole batch at a time, as flat columns.

What the data module's loaders fetch from: :class:`TokenizedPairs` takes a batch's rows from the
memory-mapped Arrow split that :func:`data.tokenized.tokenize_split` wrote, and hands them over as
:class:`PairColumns`, which :func:`data.batching.collate_columns` pads into model inputs.
:class:`data.sampling.SampledPairs` serves the training split the same way, segmented afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # imported lazily: translate.py imports data.batching, which imports this module
    import datasets
    import pyarrow as pa


@dataclass(frozen=True)
class PairColumns:
    """A batch of tokenized pairs as flat columns (what :class:`TokenizedPairs` fetches).

    Attributes:
        ids: ``[B]`` example ids.
        src_values: the source ids of all examples, concatenated (each with its EOS).
        src_lengths: ``[B]`` source lengths.
        tgt_values: the target ids of all examples, concatenated (no BOS / EOS).
        tgt_lengths: ``[B]`` target lengths (``len(tgt_ids)``, without the added BOS / EOS).
    """

    ids: np.ndarray
    src_values: np.ndarray
    src_lengths: np.ndarray
    tgt_values: np.ndarray
    tgt_lengths: np.ndarray


def _list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    column = table.column(name).combine_chunks()
    return column.flatten().to_numpy(), column.value_lengths().to_numpy()


class TokenizedPairs(torch.utils.data.Dataset):
    """The rows of a tokenized split, fetched a whole batch at a time straight from Arrow.

    ``DataLoader(batch_sampler=...)`` calls :meth:`__getitems__` with a batch's indices: the rows
    are taken from the (memory-mapped) table's record batches, one ``take`` per record batch
    touched, and handed over as flat numpy columns, no per-row Python lists;
    :func:`collate_columns` pads them. (One ``take`` on the whole table is slow: Arrow then
    concatenates the chunks of its list columns.) Pickled for worker processes by file
    reference, as ``datasets`` pickles a memory-mapped table.

    Args:
        dataset: a tokenized split (columns ``id``, ``src_ids``, ``tgt_ids``).
        rows: positions of the rows served, e.g. those within ``max_len``; ``None``: all, in order.
            Index ``i`` of this dataset is row ``rows[i]``.
    """

    # The split's columns fetched: ids, and the subword ids of each side.
    COLUMNS = ("id", "src_ids", "tgt_ids")

    def __init__(self, dataset: datasets.Dataset, rows: np.ndarray | None = None) -> None:
        if dataset._indices is not None:  # .data would be the unselected table
            raise ValueError("pass the split without select()/filter() and the kept positions as rows")
        self.table = dataset.select_columns(list(self.COLUMNS)).data
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self._batches: list[pa.RecordBatch] | None = None  # views of the table, rebuilt after pickling
        self._starts: np.ndarray | None = None  # first row of each record batch, and the row count

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_batches": None, "_starts": None}

    def __len__(self) -> int:
        return self.table.num_rows if self.rows is None else len(self.rows)

    def _take(self, positions: np.ndarray) -> pa.Table:
        import pyarrow as pa

        if self._batches is None:
            self._batches = self.table.table.to_batches()
            self._starts = np.cumsum([0] + [b.num_rows for b in self._batches])
        chunk = np.searchsorted(self._starts, positions, side="right") - 1
        order = np.argsort(chunk, kind="stable")  # the rows grouped by record batch
        grouped = chunk[order]
        cuts = np.flatnonzero(np.diff(grouped)) + 1
        parts = [
            self._batches[grouped[lo]].take(pa.array(positions[order[lo:hi]] - self._starts[grouped[lo]]))
            for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True)
        ]
        if not parts:
            return self.table.table.slice(0, 0)
        return pa.Table.from_batches(parts).combine_chunks().take(pa.array(np.argsort(order)))

    def _rows(self, indices: list[int]) -> pa.Table:
        """The table's rows of dataset indices ``indices``, in that order."""
        positions = np.asarray(indices, dtype=np.int64)
        if self.rows is not None:
            positions = self.rows[positions]
        return self._take(positions)

    def __getitems__(self, indices: list[int]) -> PairColumns:
        batch = self._rows(indices)
        src_values, src_lengths = _list_column(batch, "src_ids")
        tgt_values, tgt_lengths = _list_column(batch, "tgt_ids")
        ids = batch.column("id").to_numpy()
        return PairColumns(ids, src_values, src_lengths, tgt_values, tgt_lengths)

    def __getitem__(self, index: int) -> dict:
        cols = self.__getitems__([index])
        return {
            "id": int(cols.ids[0]),
            "src_ids": cols.src_values.tolist(),
            "tgt_ids": cols.tgt_values.tolist(),
        }
