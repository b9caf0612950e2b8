"""The decoder self-attention's keys and values of the decoding steps so far (softmax's decoding state).

``decoding.state.new_state`` makes one for every decoder layer whose mechanism keeps its keys and
values (softmax's ``caches_keys_values``), and ``CachedDecoder.start`` has the layers' caches
share one spare storage for beam search's reorders. It is what ``SoftmaxAttention.forward``
extends (``transformer.attention.KeysValues``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


class SpareStorage:
    """A free flat storage that ``KVCache.select`` copies into (or None): one for a decoder's layers."""

    __slots__ = ("tensor",)

    def __init__(self) -> None:
        self.tensor: Tensor | None = None


class KVCache:
    """One self-attention layer's keys and values of the decoding steps so far.

    The steps live in a buffer [2, rows, heads, room, d_head] (keys, values), a view of a flat
    storage tensor, filled in place, so a step appends without copying the earlier ones
    (``torch.cat`` would copy them all, every step); a full buffer gets ``GROWTH`` more steps.

    Reordering rows for beam search copies the filled part once, into a spare storage that is
    then swapped in, and leaves room for exactly one more step there: after the next step's
    ``extend`` the buffer is full, so attention reads one contiguous block. (With spare room
    after each (row, head), every 64-float key is 1-2 pages away from the next (row, head)'s,
    and attention over a cache not in the CPU cache was slower that way: BENCHMARKS.md, "Found
    while profiling, and what became of it".) The caches of a decoder's layers share one
    :class:`SpareStorage` (:meth:`share_spare`): each ``select`` copies into it and leaves the
    storage it frees there for the next layer, so all of them together hold one extra storage,
    not one each.
    """

    # Steps of room added when full. Small: every layer's storage (and the spare) carries this
    # room for every row, and outputs mostly end long before the length limit; 4 held the speed
    # of 16 (BENCHMARKS.md, "Translation memory").
    GROWTH = 4

    def __init__(self, capacity: int = GROWTH) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self.length = 0  # steps stored
        self._store: Tensor | None = None  # flat storage of _buf
        self._buf: Tensor | None = None  # [2, rows, heads, room, d_head]
        self.spare = SpareStorage()  # shared with the other layers' caches by share_spare

    @staticmethod
    def share_spare(states: Sequence[object]) -> None:
        """Gives the ``KVCache`` among ``states`` (a decoder's layers) one spare storage."""
        spare = SpareStorage()
        for state in states:
            if isinstance(state, KVCache):
                state.spare = spare

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Appends new steps and returns all of them.

        Args:
            k, v: [rows, heads, new_steps, d_head].

        Returns:
            (k, v) of every step so far, each [rows, heads, length, d_head] (views of the buffer).
        """
        end = self.length + k.size(2)
        if self._buf is None or end > self._buf.size(3):
            self._grow(k, max(end, self.length + self.GROWTH, self.capacity))
        self._buf[0, :, :, self.length : end] = k
        self._buf[1, :, :, self.length : end] = v
        self.length = end
        return self._buf[0, :, :, :end], self._buf[1, :, :, :end]

    def select(self, rows: Tensor) -> None:
        """Keeps rows ``rows`` ([new_rows] indices), in that order, with room for one more step.

        Copies into the spare storage if it is big enough (else allocates one), and leaves the
        storage this frees as the spare, for the next layer's ``select``.
        """
        if self._buf is None:
            return
        old, old_store = self._buf, self._store
        if old.requires_grad:  # out= below does not differentiate
            self._buf = old.index_select(1, rows)
            self._store = None
            return
        shape = (2, rows.numel(), old.size(2), self.length + 1, old.size(4))
        numel = math.prod(shape)
        spare = self.spare.tensor
        if spare is None or spare.numel() < numel or spare.dtype != old.dtype:
            # Room for GROWTH more steps, so that the spare is not reallocated every step.
            spare = old.new_empty(numel // (self.length + 1) * (self.length + self.GROWTH))
        new = spare[:numel].view(shape)
        torch.index_select(old[:, :, :, : self.length], 1, rows, out=new[:, :, :, : self.length])
        self._buf, self._store = new, spare
        self.spare.tensor = old_store

    def _grow(self, like: Tensor, room: int) -> None:
        """A buffer for ``room`` steps, shaped after ``like``, holding the steps so far."""
        rows, heads, _, d_head = like.shape
        store = like.new_empty(2 * rows * heads * room * d_head)
        new = store.view(2, rows, heads, room, d_head)
        if self._buf is not None:
            new[:, :, :, : self.length] = self._buf[:, :, :, : self.length]
        self._buf, self._store = new, store
