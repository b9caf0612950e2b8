"""The one call that applies a device's fast paths to a plain model: :func:`optimize`.

``train.py``'s pipeline and ``translate.py`` call it once, where they start, as a user of IPEX
calls ``ipex.optimize(model)``: nothing inside the model, the Lightning module or the translator
asks which device it runs on. It swaps modules of the model in place (the ``state_dict`` keys and
tied weights stay the plain model's) and returns the components that the trainer and the search
take (:class:`FastPaths`). Every swap computes what the plain path does (``tests/fastpaths/``,
and the model's property tests run on the swapped model too); each was measured to pay where
it is applied (BENCHMARKS.md).

The table, one entry a swap: plain -> fast path (module) | where and when | why, the figure
(BENCHMARKS.md's section in quotes).

* ``nn.Linear``, ``attention.InProjection`` -> packed oneDNN weights (``packed.py``)
  | CPU, autograd off (decoding, validation)
  | a greedy step's decoder products 7.1 -> 2.3 ms ("Decoding speed").
* FFN ``linear1`` then ``nn.ReLU`` -> one packed kernel with the ReLU fused (``cpu.py``)
  | CPU, autograd off | the same.
* ``attention.ScaledDotProduct`` (SDPA) -> written out, with a short-row softmax (``attention.py``)
  | CPU: decoding's <= 16 queries; bf16 over <= 512 keys
  | SDPA 380 us against 160 us a decoding step; bf16 training 1.33x at 256 keys ("Decoding
  speed", "What was tried that did not help").
* ``nn.Dropout`` -> 16-bit masks (``dropout.py``) | CPU, training
  | ``bernoulli_`` took a tenth of a bf16 step ("Training speed and memory").
* the loss, ``F.cross_entropy`` of the logits -> the block loss (``loss.py``) | the CPU; a GPU
  eagerly | a step's peak 368 against 486 MiB and 2-6% faster on the CPU, and no [tokens, V]
  logits kept; compiled on a GPU the plain loss stays, inductor fuses it ("GPU").
* the search step's ``log_softmax(-1).topk(n)`` -> block top-k and in-place softmax
  (``search.py``) | CPU | [160, 8000]: top-k 1.8 -> 1.0 ms, normaliser 1.4 -> 0.5 ms ("Decoding
  speed").
* a search's SDPA backends -> without cuDNN's attention (:func:`decoding_attention_backends`)
  | CUDA, decoding | cuDNN builds and keeps a plan for every new (batch, keys) shape, and a
  search changes both every step: validation decoded slower on an H200 than on a 2-core CPU
  ("GPU"). Training keeps whatever SDPA picks for its shapes.
* allocators and oneDNN's kernel caches (``allocators.py``) | a training process, before
  ``import torch`` | not here: ``train.py`` applies them first thing, ``translate.py`` bounds
  the kernel caches.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from decoding.step import PLAIN, SearchKernels
from fastpaths import search
from fastpaths.cpu import for_cpu_inference, for_cpu_training

MODES = ("train", "inference")

# What the loss functions take: (hidden [..., d], weight [V, d], bias [V] or None, target [...],
# ignore_index, label_smoothing, positions [N] or None) -> [...] fp32 losses.
LossFunction = Callable[..., torch.Tensor]


def decoding_attention_backends() -> AbstractContextManager:
    """SDPA's backends for a search on CUDA: flash, memory-efficient or the math path, never
    cuDNN's attention (the module docstring's table says why)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


CPU_SEARCH = SearchKernels(top_log_probs=search.top_log_probs, name="cpu: block top-k, in-place softmax")
CUDA_SEARCH = SearchKernels(context=decoding_attention_backends, name="cuda: SDPA without cuDNN attention")


@dataclass(frozen=True)
class FastPaths:
    """What :func:`optimize` chose for a model on a device.

    Attributes:
        device: the device type (``cpu``, ``cuda``, ...).
        mode: ``train`` or ``inference``.
        loss: the training loss to run eagerly (``LossFunction``), or None: the plain
            ``training.loss.cross_entropy`` (and for ``inference``, where nothing trains).
        compiled_loss: the same inside ``torch.compile``; None: the plain one (inductor fuses it).
        search: the search's kernels (``decoding.SearchKernels``).
        applied: what was swapped or chosen, one entry each (for the log).
    """

    device: str
    mode: str
    loss: LossFunction | None = None
    compiled_loss: LossFunction | None = None
    search: SearchKernels = PLAIN
    applied: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the log: the device, the mode and what was applied."""
        return f"fast paths for {self.device} {self.mode}: " + (
            "; ".join(self.applied) or "none (plain model)"
        )


def optimize(model: nn.Module, device: torch.device | str, mode: str) -> FastPaths:
    """Applies ``device``'s fast paths to ``model`` (in place) and returns the components to use.

    Args:
        model: a plain ``Transformer`` (or an ``Ensemble``, or any module holding them). Applying
            it again changes nothing.
        device: where the model runs (a device or its name: ``cpu``, ``cuda:0``, ...).
        mode: ``train`` (the model trains, and validates: the inference swaps too, and the
            training loss) or ``inference`` (it only decodes).

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    kind = torch.device(device).type
    train = mode == "train"
    # The loss only for training: its module imports torch's compiler (torch.compiler.disable),
    # ~70 MiB that translate.py does without.
    block_loss = _block_loss() if train and kind in ("cpu", "cuda") else None
    if kind == "cpu":
        if train:
            for_cpu_training(model)
            swaps = "packed weights and written-out attention (autograd off), 16-bit dropout masks"
        else:
            for_cpu_inference(model)
            swaps = "packed weights and written-out attention (autograd off)"
        said = (swaps, "block loss") if train else (swaps,)
        return FastPaths(kind, mode, block_loss, block_loss, CPU_SEARCH, (*said, "search " + CPU_SEARCH.name))
    if kind == "cuda":
        said = ("block loss (eager; compiled: F.cross_entropy)",) if train else ()
        return FastPaths(kind, mode, block_loss, None, CUDA_SEARCH, (*said, "search " + CUDA_SEARCH.name))
    return FastPaths(kind, mode)


def _block_loss() -> LossFunction:
    from fastpaths.loss import projected_cross_entropy

    return projected_cross_entropy
