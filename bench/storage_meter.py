"""Peak tensor memory counted exactly: every storage an operator makes, until it is freed.

    with StorageMeter() as meter:
        loss = model(x).sum()
        loss.backward()
    meter.peak_bytes   # the most bytes of tensor storage alive at once, made inside the block

A ``TorchDispatchMode`` sees every operator's outputs (forward, backward and custom autograd
functions alike, on the calling thread); each new storage is counted with its size and uncounted
when Python frees it (a ``weakref.finalize`` on the storage, which PyTorch keeps as one object
for as long as the storage lives). Views and in-place results share a storage and count once.
Unlike the resident set size it does not depend on the allocator, the thread count or what the
machine is doing: the same code gives the same figure, so a test may bound it.

Storages made before the block (the inputs, the parameters) are not counted; nor is scratch
memory an operator frees before it returns.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class StorageMeter(TorchDispatchMode):
    """Counts the bytes of tensor storage made inside the block: ``live_bytes``, ``peak_bytes``."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}  # id of a counted storage -> its bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
                self._count(t.untyped_storage())
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        nbytes = storage.nbytes()
        if key in self._live:
            if nbytes != self._live[key]:  # resized in place (an out= operator)
                self.live_bytes += nbytes - self._live[key]
                self._live[key] = nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            return
        self._live[key] = nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)
