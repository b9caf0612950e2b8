"""Counting the operations that would make the host wait for a GPU, on any device (the CPU too).

On CUDA, ``torch.cuda.set_sync_debug_mode("error")`` catches a synchronisation as it happens
(``tests/gpu``); on the CPU nothing waits, so :class:`HostSyncs` names the calls that would:

* reading a tensor's value on the host: ``item()``, ``bool()``, ``int()``, ``float()`` (all
  ``aten._local_scalar_dense``), ``tolist()``, ``aten.equal``, ``aten.is_nonzero``;
* operations whose output's shape depends on the values, which the host must learn before it can
  go on: ``nonzero``, ``masked_select``, ``masked_scatter``, ``unique``, indexing with a boolean
  mask (``x[mask]``, ``x[mask] = v``), ``repeat_interleave`` of a tensor of counts;
* host data copied to a device as ``torch.tensor(data, device=...)`` (Lightning's ``self.log`` of
  a Python number does it): on CUDA a blocking copy, which waits for the stream's work first.
  Counted whatever the device, since on the CPU the device is the host.

It records the operations dispatched while it is active, forward and backward, with where in the
caller's code each came from. Host memory read through numpy (a pinned buffer that an asynchronous
copy filled) is not a tensor operation and is not counted: it waits for nothing.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Operations that read a value on the host or whose output shape depends on values.
SYNCING = {
    aten._local_scalar_dense.default,
    aten.equal.default,
    aten.is_nonzero.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.masked_scatter.default,
    aten.masked_scatter_.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}
# Indexing operations that sync when an index is a boolean mask.
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _boolean_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _caller() -> str:
    """The innermost frame of the project's code (not torch's, lightning's or this file's)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename
        if "site-packages" not in name and name != __file__ and "/torch/" not in name:
            return f"{name}:{frame.lineno} {frame.line}"
    return "?"


class HostSyncs(TorchDispatchMode):
    """``with HostSyncs() as syncs: ...``; then ``syncs.calls`` lists ``(operation, caller)``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self._tolist: Any = None
        self._tensor: Any = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204, D105
        if func in SYNCING or (func in INDEXING and _boolean_index(args)):
            self.calls.append((str(func), _caller()))
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostSyncs:
        # tolist() reads the values in C++ without dispatching an operation, and torch.tensor()
        # copies host data without one either: both counted by hand.
        self._tolist, self._tensor = torch.Tensor.tolist, torch.tensor
        real_tolist, real_tensor, calls = self._tolist, self._tensor, self.calls

        def tolist(tensor: torch.Tensor) -> Any:
            calls.append(("Tensor.tolist", _caller()))
            return real_tolist(tensor)

        def tensor(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            if kwargs.get("device") is not None:
                calls.append((f"torch.tensor(device={kwargs['device']})", _caller()))
            return real_tensor(data, *args, **kwargs)

        torch.Tensor.tolist, torch.tensor = tolist, tensor
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        torch.Tensor.tolist, torch.tensor = self._tolist, self._tensor
        return super().__exit__(*exc)
