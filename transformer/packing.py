"""Linear layers with weights pre-packed for oneDNN, for CPU inference.

``F.linear`` re-arranges the weight matrix for the CPU's matrix kernels on every call. That is
free next to a training batch of thousands of tokens, but decoding multiplies a few rows (one per
hypothesis) by every weight matrix at every step, and there the re-arranging dominates: on the
2-core AVX-512 machine of BENCHMARKS.md the decoder's matmuls of one greedy step (32 rows) take
7.1 ms through ``F.linear`` and 2.3 ms with packed weights. ``PackedLinears`` keeps packed copies
(PyTorch's ``torch.ops.mkldnn`` operators, the ones ``torch.compile`` uses for frozen CPU models)
and uses them when all of these hold:

* packing was switched on (``Transformer.pack_for_inference()``); it is off by default;
* autograd is off (``torch.no_grad`` / ``torch.inference_mode``): packed weights have no gradient;
* the input is on the CPU, float32 or bfloat16 (or autocast to bfloat16), and oneDNN is available.

Otherwise it is ``F.linear``. A packed copy is made again when its weight changed in place
(an optimizer step, ``load_state_dict``), detected through the tensor's version counter. Writes
through ``weight.data`` bypass that counter: call ``pack_for_inference()`` again after them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor


@functools.cache  # asked at every linear call while decoding
def packing_available() -> bool:
    """Whether this PyTorch build has the oneDNN operators packing needs."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinears:
    """A module's packed weight matrices, by name, and the linear maps that use them.

    Not part of the module's ``state_dict``; copies (``copy.deepcopy``, pickling) start empty.
    """

    # Packing takes a hint of the number of rows; any hint above 1 gave the same speed from 32
    # to 1,000 rows in the measurements above.
    ROWS_HINT = 64

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self._packs: dict[str, tuple[tuple, Tensor, Tensor | None]] = {}

    def clear(self) -> None:
        """Drops the packed copies (they are made again on the next packed call)."""
        self._packs.clear()

    def __deepcopy__(self, memo: dict) -> PackedLinears:
        return PackedLinears(self.enabled)

    def __getstate__(self) -> dict:
        return {"enabled": self.enabled, "_packs": {}}

    def linear(self, name: str, x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False) -> Tensor:
        """``x @ weight.T + bias`` (then ReLU if asked), packed when possible.

        Args:
            name: which of the module's matrices this is (``weight`` may be a slice of a
                parameter, e.g. the query rows of a fused Q/K/V matrix).
            x: [..., in_features].
            weight: [out_features, in_features]; bias: [out_features] or None.
            relu: apply ReLU to the result (fused into the packed kernel).

        Returns:
            [..., out_features].
        """
        dtype = self._packed_dtype(x, weight)
        if dtype is None:
            y = F.linear(x, weight, bias)
            return F.relu(y) if relu else y
        packed, packed_bias = self._pack(name, weight, bias, dtype)
        attr, scalars = ("relu", [None]) if relu else ("none", [])
        return torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed, packed_bias, attr, scalars, "")

    def _packed_dtype(self, x: Tensor, weight: Tensor) -> torch.dtype | None:
        """The dtype to compute in with packed weights, or None for ``F.linear``."""
        if not self.enabled or torch.is_grad_enabled() or x.device.type != "cpu" or x.numel() == 0:
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
        self, name: str, weight: Tensor, bias: Tensor | None, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor | None]:
        key = (_version(weight), weight.data_ptr(), _version(bias), dtype)
        cached = self._packs.get(name)
        if cached is None or cached[0] != key:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype).contiguous(), self.ROWS_HINT)
            cached = (key, packed, None if bias is None else bias.to(dtype).contiguous())
            self._packs[name] = cached
        return cached[1], cached[2]


def _version(t: Tensor | None) -> int:
    """In-place writes so far to ``t`` (or to the parameter it is a slice of)."""
    if t is None:
        return -1
    return (t if t._base is None else t._base)._version
