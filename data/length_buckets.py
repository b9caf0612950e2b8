"""Training batches of a few shapes only (``data.length_buckets``), for CUDA graphs.

Token-budget batches come in as many shapes as there are sentence lengths: a compiled step then
compiles for dynamic shapes, and it cannot be replayed as a CUDA graph (``torch.compile``'s
``mode: reduce-overhead`` or ``max-autotune`` records one graph per shape). With a few bucket
lengths, say ``[16, 32, 48, 64, 96, 128, 256]``, each batch is padded up to one of them:

* its source length up to the smallest bucket that holds it, and its target length likewise;
* its rows up to ``max_tokens // width``, where ``width`` is the bucket of its longest side, with
  filler pairs: a source of EOS alone and no target token (the target all padding), so they add
  no loss and no gradient (every row attends only to itself);
* the sampler cuts the batches by the same bucketed widths (:class:`~data.batching.
  TokenBucketBatchSampler`), so a batch of a bucket holds what fits ``max_tokens`` at its width.

A length beyond the largest bucket is padded up to a multiple of it. The shapes are then at most
the pairs of a source and a target bucket, one row count per widest bucket; their price is the
padding, which the data module prints at set-up beside the padding without buckets
(:func:`bucketed_padding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The setting's name in messages.
SETTING = "data.length_buckets"


@dataclass(frozen=True)
class LengthBuckets:
    """Ascending lengths that batch lengths are padded up to.

    Attributes:
        lengths: the bucket lengths, positive and strictly ascending.
    """

    lengths: tuple[int, ...]

    @classmethod
    def parse(cls, value: Sequence[int] | None) -> LengthBuckets | None:
        """The setting's value as buckets; None (or an empty list) means no buckets.

        Raises:
            ValueError: not a list of positive, strictly ascending integers, naming the setting.
        """
        if value is None or len(value) == 0:
            return None
        if isinstance(value, (str, bytes)) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ValueError(f"{SETTING} must be a list of integers, e.g. [16, 32, 64, 128], not {value!r}")
        lengths = tuple(value)
        if lengths[0] < 1 or any(b <= a for a, b in zip(lengths, lengths[1:], strict=False)):
            raise ValueError(f"{SETTING} must be positive and strictly ascending, not {list(lengths)}")
        return cls(lengths)

    def bucket(self, lengths: np.ndarray | int) -> np.ndarray:
        """The padded length of each length: the smallest bucket at least as long, or beyond the
        largest, the next multiple of the largest. Shape as ``lengths``; int64."""
        lengths = np.asarray(lengths, dtype=np.int64)
        table = np.asarray(self.lengths, dtype=np.int64)
        at = np.searchsorted(table, lengths, side="left")  # first bucket >= length
        largest = table[-1]
        beyond = -(-lengths // largest) * largest  # ceil to a multiple of the largest
        return np.where(at < len(table), table[np.minimum(at, len(table) - 1)], beyond)

    def batch_shape(
        self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int
    ) -> tuple[int, int, int]:
        """(rows, source length, target length) of a batch padded to the buckets.

        Args:
            src_lengths: [B] source widths (EOS included); tgt_lengths: [B] target widths (BOS or
                EOS included), B at least 1.
            max_tokens: the batch budget, ``rows * width``.

        Returns:
            ``rows`` = at least B and ``max_tokens // width`` (``width`` the bucket of the longest
            side); the source and the target length, each its own bucket.
        """
        S = int(self.bucket(int(np.max(src_lengths))))
        T = int(self.bucket(int(np.max(tgt_lengths))))
        rows = max(len(src_lengths), max_tokens // max(S, T))
        return rows, S, T


def bucketed_padding(
    batches: Sequence[Sequence[int]],
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    buckets: LengthBuckets,
    max_tokens: int,
) -> tuple[float, float, int]:
    """What the buckets cost over ``batches``: padding, filler rows and shapes.

    Args:
        batches: example indices per batch (cut with the buckets, as the sampler cuts them).
        src_lengths, tgt_lengths: per-example widths.
        buckets: the bucket lengths; max_tokens: the batch budget.

    Returns:
        The share of padding in the padded source and target tensors (filler rows included), the
        share of rows that are fillers, and the number of distinct (rows, S, T) shapes.
    """
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    real = padded = rows = fillers = 0
    shapes = set()
    for batch in batches:
        if len(batch) == 0:
            continue
        idx = np.asarray(batch, dtype=np.int64)
        shape = buckets.batch_shape(src[idx], tgt[idx], max_tokens)
        shapes.add(shape)
        real += int(src[idx].sum() + tgt[idx].sum())
        padded += shape[0] * (shape[1] + shape[2])
        rows += shape[0]
        fillers += shape[0] - len(idx)
    if padded == 0:
        return 0.0, 0.0, 0
    return 1.0 - real / padded, fillers / rows, len(shapes)


def distinct_shapes(
    batches: Sequence[Sequence[int]], src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> int:
    """The number of distinct (rows, S, T) shapes of ``batches`` padded to their own longest pair
    (no buckets): how many shapes a compiled step meets in an epoch."""
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    return len({(len(b), int(src[list(b)].max()), int(tgt[list(b)].max())) for b in batches if len(b)})
