"""Packed weights: ``nn.Linear`` swapped for a module that multiplies by oneDNN-packed copies.

``F.linear`` re-arranges the weight matrix for the CPU's matrix kernels on every call. That is free
next to a training batch of thousands of tokens, but decoding multiplies a few rows (one per
hypothesis) by every weight matrix at every step, and there the re-arranging dominates: with
packed weights the decoder's matmuls of a greedy step take a fraction of ``F.linear``'s time
(BENCHMARKS.md, "Decoding speed"). Packed copies are made with PyTorch's ``torch.ops.mkldnn``
operators (the ones ``torch.compile`` uses for frozen CPU models) and used when autograd is off
and the input is on the CPU, float32 or bfloat16 (or autocast to bfloat16), with oneDNN
available; otherwise :class:`PackedLinear` is ``nn.Linear``. On a CPU without native bf16
(:func:`fastpaths.hardware.native_bf16`: AVX2-only x86 such as AMD Zen 3, where oneDNN refuses to
pack bf16 weights), bf16 is packed and multiplied in fp32 and the result rounded to bf16: bf16
values are exact in fp32, and the native kernel accumulates in fp32 too.

A packed copy is made again when its weight changed in place (an optimizer step,
``load_state_dict``), detected through the tensor's version counter, and dropped at every
``train()`` / ``eval()``: a fused optimizer (``torch.optim.Adam(fused=True)``, the trainer's
default) writes parameters without bumping their version counters, and training and evaluation
alternate through those calls (Lightning's validation does). Writes through ``weight.data``
bypass both: call ``eval()`` again after them.

oneDNN builds and keeps a kernel for every number of rows it sees (~600 KiB each, in its primitive
cache and in ideep's), and decoding's row count changes at almost every step as sentences finish:
the kept kernels grew the heap batch after batch ("Translation memory"). Two remedies. A process
that only translates bounds both caches (:func:`bound_kernel_caches`, ``translate.py`` does it
first thing): a few kernels are kept, a new row count costs one kernel's creation (~150 us), and
rows are multiplied as they are. Otherwise the rows are padded up to one of two sizes per octave
(:func:`padded_rows`: 9..16 -> 12 or 16, 17..32 -> 24 or 32, ...), a few dozen sizes in all, at
the price of up to half as many rows again in a matmul (a sixth on average).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastpaths import hardware
from fastpaths.allocators import KERNEL_CACHE, KERNEL_CACHE_SETTINGS
from transformer.attention import InProjection

# Cache settings the environment may already hold and that still count as bounded.
_BOUNDED_AT_MOST = 64


@functools.cache  # asked at every linear call while decoding
def packing_available() -> bool:
    """Whether this PyTorch build has the oneDNN operators packing needs."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Linear):
    """``nn.Linear`` (then ReLU if ``relu``, fused into the kernel) with packed inference weights.

    Made from a plain ``nn.Linear`` by :meth:`from_linear`, holding the same parameters (ties and
    an optimizer's references stay), so its ``state_dict`` is the plain one's. The packed copies
    are not part of it; copies (``copy.deepcopy``, pickling) start without them.
    """

    # Packing takes a hint of the number of rows; any hint above 1 gave the same speed from 32
    # to 1,000 rows in the measurements above.
    ROWS_HINT = 64

    relu: bool
    _packs: dict

    @classmethod
    def from_linear(cls, linear: nn.Linear, relu: bool = False) -> PackedLinear:
        """The packed form of ``linear`` (its parameters, not copies); ``relu``: ReLU after it."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.register_parameter("weight", linear.weight)
        new.register_parameter("bias", linear.bias)
        new.relu = relu
        new.training = linear.training
        new._packs = {}
        return new

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_packs": {}}

    def train(self, mode: bool = True) -> PackedLinear:
        """``nn.Module.train``, dropping the packed copies (see the module docstring)."""
        self._packs.clear()
        return super().train(mode)

    def forward(self, x: Tensor) -> Tensor:
        """x: [..., in_features] -> [..., out_features]."""
        return self._linear(x, self.weight, self.bias, None)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", relu=True" if self.relu else "")

    def _linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, name: object) -> Tensor:
        """``x @ weight.T + bias`` (then ReLU if ``self.relu``), packed when possible; ``weight``
        may be rows of ``self.weight``, packed under ``name``."""
        out_dtype = self._packed_dtype(x, weight)
        if out_dtype is None:
            y = F.linear(x, weight, bias)
            return F.relu(y) if self.relu else y
        # bf16 is packed as bf16 only where the CPU computes it natively (module docstring).
        dtype = out_dtype if out_dtype != torch.bfloat16 or hardware.native_bf16() else torch.float32
        packed, packed_bias = self._pack(name, weight, bias, dtype)
        lead = x.shape[:-1]
        attr, scalars = ("relu", [None]) if self.relu else ("none", [])
        rows = x.numel() // x.size(-1)
        size = rows if kernel_caches_bounded() else padded_rows(rows)
        # Each call below is a tensor operation, and decoding makes ~20 of these calls a step: the
        # conversions only where the dtype changes, the padding in one operation.
        x = x.reshape(rows, x.size(-1))
        if x.dtype != dtype:
            x = x.to(dtype)
        if size != rows:
            x = F.pad(x, (0, 0, 0, size - rows))  # (size, in), zero rows after the real ones
        y = torch.ops.mkldnn._linear_pointwise(x, packed, packed_bias, attr, scalars, "")
        if size != rows:
            y = y[:rows]  # the first rows: contiguous
        y = y.view(*lead, y.size(-1))
        return y if y.dtype == out_dtype else y.to(out_dtype)

    def _packed_dtype(self, x: Tensor, weight: Tensor) -> torch.dtype | None:
        """The dtype to compute in with packed weights, or None for ``F.linear``."""
        if torch.is_grad_enabled() or x.device.type != "cpu" or x.numel() == 0:
            return None
        if torch.is_autocast_enabled("cpu"):
            dtype = torch.get_autocast_dtype("cpu")
        elif x.dtype == weight.dtype:
            dtype = x.dtype
        else:
            return None
        if dtype not in (torch.float32, torch.bfloat16) or not packing_available():
            return None
        return dtype

    def _pack(
        self, name: object, weight: Tensor, bias: Tensor | None, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor | None]:
        key = (_version(weight), weight.data_ptr(), _version(bias), dtype)
        cached = self._packs.get(name)
        if cached is None or cached[0] != key:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype).contiguous(), self.ROWS_HINT)
            cached = (key, packed, None if bias is None else bias.to(dtype).contiguous())
            self._packs[name] = cached
        return cached[1], cached[2]


class PackedProjection(PackedLinear, InProjection):
    """``attention.InProjection`` (W_Q, W_K, W_V stacked) with packed weights: each block of rows
    that attention multiplies on its own (the queries, the keys and values) packed by itself."""

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """``x`` times rows ``start:stop`` of the matrix: [..., in_features] -> [..., stop - start]."""
        bias = None if self.bias is None else self.bias[start:stop]
        return self._linear(x, self.weight[start:stop], bias, (start, stop))


def bound_kernel_caches(capacity: int = KERNEL_CACHE) -> bool:
    """Bounds oneDNN's kernel caches at ``capacity`` kernels each, so packed matmuls need no padding.

    For a process that translates (module docstring): it sets ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``
    and ``LRU_CACHE_CAPACITY`` (ideep's), which oneDNN reads once, at its first kernel, so this
    must run before the process's first packed matmul, and process-wide. Values already in the
    environment are kept. Returns whether the caches are bounded now (both at most 64), which is
    when :class:`PackedLinear` stops padding rows.
    """
    for name in KERNEL_CACHE_SETTINGS:
        os.environ.setdefault(name, str(capacity))
    kernel_caches_bounded.cache_clear()
    return kernel_caches_bounded()


@functools.cache  # asked at every linear call while decoding
def kernel_caches_bounded() -> bool:
    """Whether the environment bounds both of oneDNN's kernel caches (:func:`bound_kernel_caches`)."""
    values = [os.environ.get(name, "") for name in KERNEL_CACHE_SETTINGS]
    return all(v.isdigit() and int(v) <= _BOUNDED_AT_MOST for v in values)


def padded_rows(rows: int) -> int:
    """The row count a packed matmul of ``rows`` rows runs with: two sizes per octave.

    Up to 8 rows stay as they are; above, ``rows`` is rounded up to a multiple of half the
    largest power of two at most ``rows`` (e.g. 9..12 -> 12, 13..16 -> 16, 100 -> 128, 129 -> 192).
    """
    if rows <= 8:
        return rows
    unit = 1 << (rows.bit_length() - 2)  # half of the largest power of two <= rows
    return -(-rows // unit) * unit


def _version(t: Tensor | None) -> int:
    """In-place writes so far to ``t`` (or to the parameter it is a slice of)."""
    if t is None:
        return -1
    return (t if t._base is None else t._base)._version
