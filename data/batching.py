"""Token-budget batches bucketed by length, distributed-aware and resumable; the collate function.

The one token-budget rule, for training and translation alike (:func:`token_budget_batches`):
examples, in an order the caller chose (sorted by length, so that batches pad little), are cut
greedily into consecutive batches whose padded size, ``batch_size * widest``, stays within
``max_tokens``; an example wider than ``max_tokens`` on its own gets a batch of its own. The
sampler cuts shortest first; the translator cuts longest first (:func:`longest_first_batches`), so
that the largest batch runs first and an out-of-memory error comes at once.

How training batches are made (:class:`TokenBucketBatchSampler`):

1. Examples are sorted by ``(max(src_len, tgt_len), src_len, tgt_len)`` (on Multi30k this pads
   less than sorting by source then target: 4.5% against 7% at 4096 tokens). Examples with equal
   lengths are ordered at random per epoch (``seed``, ``epoch``), so batch *membership* varies
   between epochs while the sequence of lengths, hence the batch boundaries and the number of
   batches, stays the same (Lightning reads ``len()`` once).
2. The sorted list is cut by :func:`token_budget_batches` with width ``max(src_len, tgt_len)``:
   padded size ``batch_size * max(src_len, tgt_len)`` within ``max_tokens``. An example longer
   than ``max_tokens`` on its own gets a batch of its own (over budget; filter such pairs with
   ``max_len`` beforehand).
3. Distributed: the number of batches is made divisible by ``num_replicas`` by halving the batches
   with the most examples, so every example is still seen exactly once and every rank gets the same
   number of batches (an uneven count hangs DDP). Only when there are fewer examples than needed
   (a corpus of a handful of lines on many ranks) are batches repeated; then an example can appear
   twice and evaluation must de-duplicate hypotheses by ``ids`` when gathering.
4. With ``shuffle`` the batch order is permuted per epoch; rank ``r`` takes batches
   ``r, r + N, r + 2N, ...``. Without ``shuffle`` (evaluation) the order is fixed: by length.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from data.length_buckets import LengthBuckets
from data.mixing import CorpusMix
from data.tokenized_pairs import PairColumns
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID

# Padded hypothesis tokens (sentences * beam size * padded source length, EOS included) searched at
# once, by translate.py and by validation and test alike: it bounds the decoder state a search
# holds whatever the beam size (a 4,096-token test batch searched whole with beam 5 holds ~1,300
# hypotheses: 1 GiB of the Performer's state). It keeps translate.py with the Multi30k model
# within 400 MiB; larger budgets decode faster and need more memory (BENCHMARKS.md, "Translation
# memory").
DECODING_TOKENS = 3072


def token_budget_batches(widths: Sequence[int], max_tokens: int) -> list[tuple[int, int]]:
    """Cut examples, in the order given, into consecutive batches within a padded-token budget.

    A batch of ``n`` examples whose widest is ``L`` wide costs ``n * L`` padded tokens. Greedy: an
    example joins the current batch unless that would take the batch over ``max_tokens``. An
    example wider than ``max_tokens`` on its own gets a batch of its own.

    Args:
        widths: ``n`` padded widths (tokens per example, e.g. EOS included), in the order to cut;
            sorted by width, batches pad little.
        max_tokens: budget of padded tokens per batch.

    Returns:
        ``[start, end)`` positions into ``widths``: consecutive, covering ``0 .. n`` once.

    Raises:
        ValueError: ``max_tokens`` is below 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
    widths = np.asarray(widths, dtype=np.int64)
    if len(widths) > 1 and (np.diff(widths) >= 0).all():
        return _ascending_budget_batches(widths, max_tokens)
    bounds: list[tuple[int, int]] = []
    start, widest = 0, 0
    for i, width in enumerate(widths.tolist()):
        widest_with = max(widest, width)
        if i > start and (i - start + 1) * widest_with > max_tokens:
            bounds.append((start, i))
            start, widest_with = i, width
        widest = widest_with
    if len(widths):
        bounds.append((start, len(widths)))
    return bounds


def _ascending_budget_batches(widths: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """:func:`token_budget_batches` of ascending widths (the sampler's millions), without a loop per example.

    With widths ascending, a batch from ``start`` takes example ``j`` while ``(j - start + 1) *
    widths[j] <= max_tokens``, i.e. while ``j - cap[j] < start`` with ``cap = max_tokens // width``;
    ``j - cap[j]`` increases with ``j``, so each batch's last example is one binary search.
    """
    n = len(widths)
    cap = np.where(widths > 0, max_tokens // np.maximum(widths, 1), n)
    reach = np.arange(n) - cap
    bounds: list[tuple[int, int]] = []
    start = 0
    while start < n:
        last = int(np.searchsorted(reach, start - 1, side="right")) - 1
        end = max(last, start) + 1  # an example over budget on its own still gets a batch
        bounds.append((start, end))
        start = end
    return bounds


def longest_first_batches(widths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Example indices, longest first, in :func:`token_budget_batches` (the translator's batches).

    Longest first, so that the largest batch runs first and an out-of-memory error comes at once;
    examples of equal width keep their input order.

    Args:
        widths: ``n`` padded widths, e.g. source length + EOS.
        max_tokens: budget of padded tokens per batch.

    Returns:
        Lists of indices into ``widths``; every index appears exactly once.

    Raises:
        ValueError: ``max_tokens`` is below 1.
    """
    order = sorted(range(len(widths)), key=lambda i: -widths[i])
    return [order[s:e] for s, e in token_budget_batches([widths[i] for i in order], max_tokens)]


class BatchIndices(list):
    """A batch's example indices (a list, as ``DataLoader(batch_sampler=...)`` takes), with its epoch.

    The DataLoader hands this object to the dataset's ``__getitems__`` as it is (pickled to a
    worker process, the epoch with it): what :class:`data.sampling.SampledPairs` seeds its
    subword sampling with, so that a batch gets the same segmentation however it is fetched.

    Args:
        indices: the examples of the batch.
        epoch: the epoch whose order the batch comes from.
    """

    def __init__(self, indices: list[int], epoch: int) -> None:
        super().__init__(indices)
        self.epoch = epoch


class TokenBucketBatchSampler(Sampler[list[int]]):
    """Yields lists of example indices, one list per batch, for ``DataLoader(batch_sampler=...)``.

    Args:
        src_lengths: per-example padded source width, e.g. ``len(src_ids)`` (EOS included).
        tgt_lengths: per-example padded target width, e.g. ``len(tgt_ids) + 1``; ``None`` means
            the same as ``src_lengths``.
        max_tokens: budget per batch: ``batch_size * max(src_len, tgt_len)`` over the batch.
        shuffle: random order of batches and of equal-length examples, new for every epoch.
        seed: seed of that randomness; the order depends only on ``(seed, epoch)``.
        num_replicas: number of ranks (world size).
        rank: this rank, ``0 <= rank < num_replicas``.
        mix: which examples each epoch holds when several corpora are mixed by weight
            (:class:`data.mixing.CorpusMix`, built over :meth:`length_keys`); ``None``: each once.
        length_buckets: cut by widths padded up to these buckets (``data.length_buckets``,
            :mod:`data.length_buckets`), as :func:`collate_columns` pads the batches; None: by widths.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int] | None = None,
        max_tokens: int = 4096,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        mix: CorpusMix | None = None,
        length_buckets: LengthBuckets | None = None,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = (
            self.src_lengths if tgt_lengths is None else np.asarray(tgt_lengths, dtype=np.int64)
        )
        if self.src_lengths.shape != self.tgt_lengths.shape:
            raise ValueError("src_lengths and tgt_lengths differ in length")
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.mix = mix
        self.length_buckets = length_buckets
        self.epoch = 0
        # Added to the epoch that seeds the order: a fine-tuned run that continues its checkpoint's
        # data order (training/finetune_reset.py) draws epoch e as the checkpoint's epoch count + e.
        self.epoch_offset = 0
        self._position = 0  # batches of the current pass handed out (this rank)
        self._resume_at = 0  # first batch of the next pass, set by load_state_dict
        self._segments, self._num_repeated = self._plan_segments()

    @property
    def sampler(self) -> TokenBucketBatchSampler:
        # Lightning calls set_epoch on `dataloader.batch_sampler.sampler`, not on the batch sampler
        # itself; pointing it here makes per-epoch shuffling work under the Trainer.
        return self

    @staticmethod
    def length_keys(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
        """``[N]`` int64 key ordering examples by ``(max(src, tgt), src, tgt)`` length."""
        src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
        span = int(max(src.max(initial=0), tgt.max(initial=0))) + 1
        return (np.maximum(src, tgt) * span + src) * span + tgt  # < 2**63 for lengths < 2**21

    def _sorted_order(self, rng: np.random.Generator | None) -> np.ndarray:
        # Sorted by (longest, src, tgt), ties by a random key: as np.lexsort((tie, tgt, src, longest)),
        # but one stable argsort of a single int64 key over the examples taken in tie order
        # (several times faster on millions of examples).
        key = self.length_keys(self.src_lengths, self.tgt_lengths)
        if self.mix is not None:  # the epoch's examples, repeats included
            members = self.mix.examples(rng)
            if rng is None:
                return members[np.argsort(key[members], kind="stable")]
            tie = rng.permutation(len(members))
            by_tie = np.empty(len(members), dtype=np.int64)
            by_tie[tie] = members
            return by_tie[np.argsort(key[by_tie], kind="stable")]
        n = len(self.src_lengths)
        if rng is None:
            return np.argsort(key, kind="stable")
        tie = rng.permutation(n)
        by_tie = np.empty(n, dtype=np.int64)
        by_tie[tie] = np.arange(n)  # the examples in increasing order of their tie key
        return by_tie[np.argsort(key[by_tie], kind="stable")]

    def _plan_segments(self) -> tuple[list[tuple[int, int]], int]:
        """Batch boundaries ``[start, end)`` in sorted order, and how many batches to repeat."""
        # Mixed corpora: the longest example each position can hold in any epoch's draw.
        order = self.mix.widest_order() if self.mix is not None else self._sorted_order(None)
        widths = np.maximum(self.src_lengths, self.tgt_lengths)[order]  # ascending
        if self.length_buckets is not None:  # still ascending: the buckets keep the order
            widths = self.length_buckets.bucket(widths)
        segments = token_budget_batches(widths, self.max_tokens)
        # Halve the batch with the most examples until the count divides evenly across ranks.
        while len(segments) % self.num_replicas:
            k = max(range(len(segments)), key=lambda j: segments[j][1] - segments[j][0])
            s, e = segments[k]
            if e - s < 2:
                break
            mid = (s + e) // 2
            segments[k : k + 1] = [(s, mid), (mid, e)]
        num_repeated = -len(segments) % self.num_replicas
        return segments, num_repeated

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next pass yields (Lightning calls this every epoch).

        A position restored by :meth:`load_state_dict` applies only to its own epoch.
        """
        if epoch != self.epoch:
            self._resume_at = 0
        self.epoch = epoch

    def global_batches(self) -> list[np.ndarray]:
        """All ranks' batches of the current epoch, in order (repeats included).

        Returns:
            Index arrays; rank ``r`` gets items ``r, r + num_replicas, ...``.
        """
        rng = np.random.default_rng([self.seed, self.order_epoch]) if self.shuffle else None
        order = self._sorted_order(rng)
        batches = [order[s:e] for s, e in self._segments]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        for i in range(self._num_repeated):
            batches.append(batches[i % len(batches)])
        return batches

    def __len__(self) -> int:
        """Batches per epoch on this rank (equal on all ranks)."""
        return (len(self._segments) + self._num_repeated) // self.num_replicas

    def __iter__(self) -> Iterator[BatchIndices]:
        mine = self.global_batches()[self.rank :: self.num_replicas]
        start, self._resume_at = self._resume_at, 0
        self._position = start
        for batch in mine[start:]:
            self._position += 1
            yield BatchIndices(batch.tolist(), self.order_epoch)

    @property
    def order_epoch(self) -> int:
        """The epoch whose order (and subword sampling) this pass draws: ``epoch + epoch_offset``."""
        return self.epoch + self.epoch_offset

    def state_dict(self) -> dict[str, int]:
        """Epoch and position (batches already handed out in this epoch on this rank).

        A DataLoader asks for batches ahead of use (prefetching), so under a Trainer prefer the
        count of batches actually trained (see ``TranslationDataModule.state_dict``).
        """
        return {
            "epoch": self.epoch,
            "epoch_offset": self.epoch_offset,
            "position": self._position,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "num_batches": len(self),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: the next pass over ``state["epoch"]`` skips its first ``position`` batches.

        Raises:
            ValueError: the state comes from a sampler with another seed, world size or number of
                batches, so positions would not mean the same batches.
        """
        self.epoch_offset = int(state.get("epoch_offset", 0))  # which orders the run draws
        mine = self.state_dict()
        for key in ("seed", "num_replicas", "num_batches"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"sampler state has {key}={state[key]}, this sampler {mine[key]}")
        self.epoch = int(state["epoch"])
        self._resume_at = int(state["position"])
        self._position = self._resume_at


def padding_fraction(
    batches: Sequence[Sequence[int]], src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> float:
    """Share of padding in the padded source and target tensors of ``batches``.

    Args:
        batches: example indices per batch.
        src_lengths: per-example source width.
        tgt_lengths: per-example target width.

    Returns:
        ``1 - real tokens / padded tokens`` over source and target together.
    """
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    batches = [b for b in batches if len(b)]
    if not batches:
        return 0.0
    idx = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches])
    starts = np.concatenate([[0], np.cumsum(sizes[sizes > 0])[:-1]])
    s, t = src[idx], tgt[idx]
    real = int(s.sum() + t.sum())
    padded = int((sizes[sizes > 0] * (np.maximum.reduceat(s, starts) + np.maximum.reduceat(t, starts))).sum())
    return 1.0 - real / padded if padded else 0.0


def _scatter(values: np.ndarray, lengths: np.ndarray, width: int, offset: int = 0) -> np.ndarray:
    """``[B, width]`` of PAD_ID with row ``b`` holding its ``lengths[b]`` values from column ``offset``."""
    out = np.full((len(lengths), width), PAD_ID, dtype=np.int64)
    cols = np.arange(width)
    out[(cols >= offset) & (cols < lengths[:, None] + offset)] = values
    return out


def collate_columns(
    batch: PairColumns, length_buckets: LengthBuckets | None = None, max_tokens: int = 0
) -> dict[str, torch.Tensor]:
    """Pad a batch of flat columns into model inputs (the layout of :func:`collate_batch`).

    With ``length_buckets`` (:mod:`data.length_buckets`), the lengths are padded up to their
    buckets and the rows up to ``max_tokens`` at the batch's bucketed width, with filler pairs:
    source EOS alone, target all padding (``tgt_in`` BOS alone), ``tgt_lengths`` 0, id -1.
    """
    B = len(batch.ids)
    src_lengths = batch.src_lengths.astype(np.int64)
    tgt_lengths = batch.tgt_lengths.astype(np.int64) + 1  # BOS + ids, or ids + EOS
    ids = batch.ids.astype(np.int64)
    S = int(src_lengths.max()) if B else 0
    T = int(tgt_lengths.max()) if B else 0
    rows = B
    if length_buckets is not None and B:
        rows, S, T = length_buckets.batch_shape(src_lengths, tgt_lengths, max_tokens)
    src = _scatter(batch.src_values, src_lengths, S)  # (B, S)
    tgt_in = _scatter(batch.tgt_values, tgt_lengths - 1, T, offset=1)  # (B, T)
    tgt_in[:, 0] = BOS_ID
    tgt_out = _scatter(batch.tgt_values, tgt_lengths - 1, T)  # (B, T)
    tgt_out[np.arange(B), tgt_lengths - 1] = EOS_ID
    if rows > B:  # filler pairs: they attend to themselves alone and have no target token
        fill = rows - B
        src = np.concatenate([src, np.full((fill, S), PAD_ID, dtype=np.int64)])
        src[B:, 0] = EOS_ID
        tgt_in = np.concatenate([tgt_in, np.full((fill, T), PAD_ID, dtype=np.int64)])
        tgt_in[B:, 0] = BOS_ID
        tgt_out = np.concatenate([tgt_out, np.full((fill, T), PAD_ID, dtype=np.int64)])
        src_lengths = np.concatenate([src_lengths, np.ones(fill, dtype=np.int64)])
        tgt_lengths = np.concatenate([tgt_lengths, np.zeros(fill, dtype=np.int64)])
        ids = np.concatenate([ids, np.full(fill, -1, dtype=np.int64)])
    return {
        "src": torch.from_numpy(src),
        "src_lengths": torch.from_numpy(src_lengths),
        "tgt_in": torch.from_numpy(tgt_in),
        "tgt_out": torch.from_numpy(tgt_out),
        "tgt_lengths": torch.from_numpy(tgt_lengths),
        "ids": torch.from_numpy(ids),
        "tgt_positions": target_positions(tgt_out),
    }


def target_positions(tgt_out: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[N]`` int64 flat positions of ``tgt_out``'s real tokens (not PAD_ID), increasing.

    Made on the host with the batch, so that the loss takes its real rows without asking the
    device which they are (``fastpaths.loss.projected_cross_entropy``), and so that the number
    of target tokens, ``len(tgt_positions)``, is a shape the host knows on any device.
    """
    flat = np.asarray(tgt_out).reshape(-1)
    return torch.from_numpy(np.flatnonzero(flat != PAD_ID).astype(np.int64))


def collate_batch(examples: list[dict]) -> dict[str, torch.Tensor]:
    """Pad tokenized examples into model inputs.

    Args:
        examples: dicts with ``id``, ``src_ids`` (subwords + EOS) and ``tgt_ids`` (subwords).

    Returns:
        ``src`` [B, S] right-padded with PAD_ID; ``src_lengths`` [B];
        ``tgt_in`` [B, T] = BOS + tgt_ids; ``tgt_out`` [B, T] = tgt_ids + EOS, both right-padded;
        ``tgt_lengths`` [B] = ``len(tgt_ids) + 1``; ``ids`` [B] example ids;
        ``tgt_positions`` [N] the flat positions of ``tgt_out``'s N real tokens
        (:func:`target_positions`). All LongTensors.
    """

    def flat(key: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [ex[key] for ex in examples]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        return np.fromiter(
            itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())
        ), lengths

    ids = np.array([int(ex["id"]) for ex in examples], dtype=np.int64)
    return collate_columns(PairColumns(ids, *flat("src_ids"), *flat("tgt_ids")))
