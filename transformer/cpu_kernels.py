"""CPU speed-ups, behind one seam: what the model hands to the CPU's own kernels, and why.

The model (``attention.py``, ``layers.py``, ``model.py``, ``search.py``) reads like the paper and
runs as written on a GPU. Four places hand their work to this module instead, each because the
plain PyTorch call was measured to be slow on the CPU for translation's small shapes; the
measurements are in BENCHMARKS.md, "Decoding speed" (what each change gained), "What was tried
that did not help" and "Found while profiling, and what became of it":

1. **Packed weights** (:class:`PackedLinears`, every linear map, switched on by
   ``Transformer.pack_for_inference()``). ``F.linear`` re-arranges the weight matrix for the CPU's
   matrix kernels on every call. That is free next to a training batch of thousands of tokens,
   but decoding multiplies a few rows (one per hypothesis) by every weight matrix at every step,
   and there the re-arranging dominates: with packed weights the decoder's matmuls of a greedy
   step take a fraction of ``F.linear``'s time ("Decoding speed"). Packed copies are made with
   PyTorch's ``torch.ops.mkldnn`` operators (the ones ``torch.compile`` uses for frozen CPU
   models) and used when packing is on, autograd is off, and the input is on the CPU, float32 or
   bfloat16 (or autocast to bfloat16), with oneDNN available; otherwise it is ``F.linear``. On a
   CPU without native bf16 (:func:`transformer.hardware.native_bf16`: AVX2-only x86 such as AMD
   Zen 3, where oneDNN refuses to pack bf16 weights), bf16 is packed and multiplied in fp32 and
   the result rounded to bf16: bf16 values are exact in fp32, and the native kernel accumulates
   in fp32 too. A
   packed copy is made again when its weight changed in place (an optimizer step,
   ``load_state_dict``), detected through the tensor's version counter. Writes through
   ``weight.data`` bypass that counter: call ``pack_for_inference()`` again after them.
   oneDNN builds and keeps a kernel for every number of rows it sees (~600 KiB each, in its
   primitive cache and in ideep's), and decoding's row count changes at almost every step as
   sentences finish: the kept kernels grew the heap batch after batch ("Translation memory").
   Two remedies. A process that only translates bounds both caches
   (:func:`bound_kernel_caches`, ``translate.py`` does it first thing): a few kernels are kept,
   a new row count costs one kernel's creation (~150 us), and rows are multiplied as they are.
   Otherwise the rows are padded up to one of two sizes per octave (:func:`padded_rows`:
   9..16 -> 12 or 16, 17..32 -> 24 or 32, ...), a few dozen sizes in all, at the price of up
   to half as many rows again in a matmul (a sixth on average).
2. **Written-out attention** (:func:`prefers_written_out`, :func:`attention`) instead of the
   fused ``F.scaled_dot_product_attention``, which is faster on the GPU and for long sequences
   but not here: the CPU flash kernel in bf16 over up to ``LONG_KEYS`` keys (training under bf16
   autocast: "What was tried that did not help"), and decoding's few queries (autograd off, at
   most ``SMALL_QUERY`` queries: one new token per hypothesis against the cache, or a sentence's
   few beams against its source, "Decoding speed"), each ran slower than two batched matmuls.
3. **Softmax over short rows** (:func:`softmax`), inside that written-out attention. PyTorch's CPU
   softmax is vectorised along the softmax dimension and takes a slow path when it is shorter
   than a vector (16 floats), as in the self-attention of hypotheses to fewer than 16 cached
   steps: written out, it is faster there ("Found while profiling").
4. **Block top-k** (:func:`row_topk`) over the 8,000-word vocabulary in beam search: two passes,
   block maxima first, find the same values as one ``topk`` in less time ("Decoding speed").

5. **Dropout masks** (:class:`Dropout`, the model's dropout layers, while training on the CPU).
   PyTorch's CPU dropout draws one number from its generator per element (``bernoulli_``), ~8 ns
   each: a tenth of a bf16 training step of the Multi30k recipe. Here the mask comes from one
   64-bit draw per four elements, each element keeping 16 of the bits: it is kept where those
   16 bits read as an integer are at least ``round(p * 65536)`` from the bottom, so the rate
   ``p`` is rounded to a multiple of 1/65,536 (0.1 -> 0.100006), and what is kept is scaled by
   the inverse of the rounded keep rate, so the expectation is unchanged. The global generator
   draws the bits: seeding and a checkpoint's RNG state reproduce the masks
   (BENCHMARKS.md, "Training speed and memory").

Each has a test that it computes what the plain call computes (``tests/transformer/test_cpu_kernels.py``).
"""

from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer import hardware

SMALL_QUERY = 16  # decoding-sized query lengths (2. above)
# Past this many keys, bf16 goes to the fused kernel: written out, its n x n scores grow
# quadratically. Our softmax layer, forward + backward at d_model 512 under bf16 autocast, ran at
# 1.33x SDPA's speed at 256 keys written out, but 0.81x at 1K and 0.21x at 16K (BENCHMARKS.md,
# "Attention mechanisms", decoder in bf16).
LONG_KEYS = 512
TOPK_BLOCK = 64  # vocabulary block of ``row_topk``: a multiple of the CPU's 16-float vectors
# Kernels each of oneDNN's two caches keeps once bounded (1. above): a decoding step uses one per
# weight shape (five in a decoder) for its row count. With 16, translate.py ran as fast as with
# the default 1,024, and ~100 MiB smaller at the same batches (BENCHMARKS.md, "Translation speed
# within the memory target").
KERNEL_CACHE = 16
# Cache settings the environment may already hold and that still count as bounded.
_BOUNDED_AT_MOST = 64
_CACHE_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's


# ------------------------------------------------------------------- 1. packed weights


@functools.cache  # asked at every linear call while decoding
def packing_available() -> bool:
    """Whether this PyTorch build has the oneDNN operators packing needs."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinears:
    """A module's packed weight matrices, by name, and the linear maps that use them (1. above).

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
        out_dtype = self._packed_dtype(x, weight)
        if out_dtype is None:
            y = F.linear(x, weight, bias)
            return F.relu(y) if relu else y
        # bf16 is packed as bf16 only where the CPU computes it natively (1. above).
        dtype = out_dtype if out_dtype != torch.bfloat16 or hardware.native_bf16() else torch.float32
        packed, packed_bias = self._pack(name, weight, bias, dtype)
        lead = x.shape[:-1]
        attr, scalars = ("relu", [None]) if relu else ("none", [])
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


def bound_kernel_caches(capacity: int = KERNEL_CACHE) -> bool:
    """Bounds oneDNN's kernel caches at ``capacity`` kernels each, so packed matmuls need no padding.

    For a process that translates (1. above): it sets ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and
    ``LRU_CACHE_CAPACITY`` (ideep's), which oneDNN reads once, at its first kernel, so this
    must run before the process's first packed matmul, and process-wide: training is better
    off with the defaults (its shapes repeat every step). Values already in the environment are
    kept. Returns whether the caches are bounded now (both at most 64), which is when
    :class:`PackedLinears` stops padding rows.
    """
    for name in _CACHE_SETTINGS:
        os.environ.setdefault(name, str(capacity))
    kernel_caches_bounded.cache_clear()
    return kernel_caches_bounded()


@functools.cache  # asked at every linear call while decoding
def kernel_caches_bounded() -> bool:
    """Whether the environment bounds both of oneDNN's kernel caches (:func:`bound_kernel_caches`)."""
    values = [os.environ.get(name, "") for name in _CACHE_SETTINGS]
    return all(v.isdigit() and int(v) <= _BOUNDED_AT_MOST for v in values)


def padded_rows(rows: int) -> int:
    """The row count a packed matmul of ``rows`` rows runs with: two sizes per octave (1. above).

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


# ------------------------------------------------------------- 2. and 3. written-out attention


def prefers_written_out(q: Tensor, keys: int) -> bool:
    """Whether :func:`attention` beats the fused kernel for these queries [..., q_len, d_k] over
    ``keys`` keys (2. above): half precision up to ``LONG_KEYS`` keys, and decoding's few queries."""
    return q.device.type == "cpu" and (
        (q.dtype in (torch.bfloat16, torch.float16) and keys <= LONG_KEYS)
        or (q.size(-2) <= SMALL_QUERY and not torch.is_grad_enabled())
    )


def softmax(scores: Tensor) -> Tensor:
    """``scores.softmax(dim=-1)``, written out in place for rows shorter than 16 with autograd off (3.)."""
    # The length is asked last: compiled training (grad on) then makes no guard on it, which would
    # compile the model again for sentences on each side of 16 tokens.
    if torch.is_grad_enabled() or scores.device.type != "cpu" or scores.size(-1) >= 16:
        return scores.softmax(dim=-1)
    weights = (scores - scores.amax(dim=-1, keepdim=True)).exp_()
    return weights.div_(weights.sum(dim=-1, keepdim=True))


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float = 0.0) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V in two batched matmuls, with :func:`softmax` (2. and 3. above).

    The same computation as ``attention.scaled_dot_product_attention``, without the weights.

    Args:
        q: [batch, heads, q_len, d_k]; k: [batch, heads, k_len, d_k]; v: [batch, heads, k_len, d_v].
        mask: bool, broadcastable to [batch, heads, q_len, k_len], True = may attend (any causal
            mask already included), or None.
        dropout_p: dropout on the attention weights (0.0 in eval).

    Returns:
        [batch, heads, q_len, d_v].
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


# ------------------------------------------------------------------------------ 4. block top-k


def row_topk(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``x.topk(n, dim=-1)`` for rows over a large vocabulary, in two cheap passes (4. above).

    The n largest entries of a row lie in the n blocks (of ``TOPK_BLOCK`` entries) with the
    largest maxima: any other block's maximum is at most each of those n maxima. So: the
    maximum of every block (one vectorised pass), the n best blocks, and ``topk`` over their
    n * BLOCK entries (plus the vocabulary's last, partial block). Values are the same as
    ``topk``'s; among exactly equal values the index chosen may differ.

    x: [rows, V] -> (values, indices), each [rows, n], largest first.
    """
    rows, vocab = x.shape
    blocks = vocab // TOPK_BLOCK
    if blocks < 2 * n:  # too few blocks to skip many
        return x.topk(n, dim=-1)
    whole = x[:, : blocks * TOPK_BLOCK].unflatten(1, (blocks, TOPK_BLOCK))  # (rows, blocks, B)
    best = whole.amax(dim=-1).topk(n, dim=-1).indices  # (rows, n) block numbers
    cand = whole.gather(1, best[:, :, None].expand(rows, n, TOPK_BLOCK)).view(rows, n * TOPK_BLOCK)
    index = (best[:, :, None] * TOPK_BLOCK + torch.arange(TOPK_BLOCK, device=x.device)).view(rows, -1)
    if blocks * TOPK_BLOCK < vocab:  # the partial block at the end is always a candidate
        cand = torch.cat([cand, x[:, blocks * TOPK_BLOCK :]], dim=1)
        tail = torch.arange(blocks * TOPK_BLOCK, vocab, device=x.device).expand(rows, -1)
        index = torch.cat([index, tail], dim=1)
    values, pos = cand.topk(n, dim=-1)
    return values, index.gather(1, pos)


# ---------------------------------------------------------------------------- 5. dropout masks


def keep_mask(
    shape: torch.Size, p: float, device: torch.device, dtype: torch.dtype = torch.bool
) -> tuple[Tensor, float]:
    """A mask of ``shape``, 1 (True) with probability ``1 - p`` rounded to 1/65,536 and 0 (False)
    otherwise (5. above), in ``dtype``, and the scale that keeps the expectation: ``1 / P(1)``."""
    n = math.prod(shape)
    drop = round(p * 65536)  # 16-bit values below this are dropped
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    lanes = bits.view(torch.int16)[:n]  # (n,) four 16-bit lanes per draw
    if dtype == torch.bool:
        keep = lanes >= drop - 32768
    else:  # the comparison written straight as 0.0 / 1.0: one vectorised pass, no bool tensor
        keep = torch.ge(lanes, drop - 32768, out=torch.empty(n, dtype=dtype, device=device))
    return keep.view(shape), 65536 / (65536 - drop)


class _MaskedScale(torch.autograd.Function):
    """x * mask * scale, with the same mask and scale on the way back."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:  # noqa: ANN001, D102
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x.mul(mask).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: ANN001, ANN205, D102
        (mask,) = ctx.saved_tensors
        return grad.mul(mask).mul_(ctx.scale), None, None


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose masks, while training on the CPU, come from :func:`keep_mask` (5. above).

    In half precision (bf16 under autocast) the mask is made in x's dtype, 0 and 1: a product
    with a bool mask converts it element by element, ~4x the time of a product of two bf16
    tensors (BENCHMARKS.md, "Training speed and memory"), for one more byte an element. In fp32
    it stays bool: an fp32 mask would be faster by less than 1% of a step and hold three more
    bytes an element until the backward pass. The scale multiplies after the mask, in fp32
    arithmetic, as before: the results are the same either way.

    On other devices, in eval mode, at p 0 or 1, and under ``torch.compile`` (whose compiled code
    draws its own masks; the in-place ``random_`` here would break the graph at every dropout),
    it is ``nn.Dropout``.
    """

    def forward(self, x: Tensor) -> Tensor:
        """x: [...] -> [...]."""
        if (
            not self.training
            or x.device.type != "cpu"
            or not 0.0 < self.p < 1.0
            or self.inplace
            or torch.compiler.is_compiling()
        ):
            return super().forward(x)
        dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bool
        mask, scale = keep_mask(x.shape, self.p, x.device, dtype)
        return _MaskedScale.apply(x, mask, scale)
