"""The CPU's module swaps: a plain model in, the same model computing the same, faster, out.

``optimize.optimize`` applies them for the CPU. :func:`for_cpu_inference` swaps, in place (as
``torch.ao``'s ``swap_module`` and IPEX's ``optimize`` do), and keeping every parameter (the
``state_dict`` keys and tied weights are the plain model's):

==================================== ============================================ ===============
plain module                         swapped for                                  why
==================================== ============================================ ===============
``nn.Linear``                        ``packed.PackedLinear``                      ``packed.py``
``attention.InProjection``           ``packed.PackedProjection``                  ``packed.py``
FFN's ``linear1`` then ``nn.ReLU``   ``PackedLinear(relu=True)``, ``nn.Identity`` ReLU fused
``attention.ScaledDotProduct``       ``attention.CpuScaledDotProduct``            ``attention.py``
==================================== ============================================ ===============

:func:`for_cpu_training` adds ``nn.Dropout`` -> ``dropout.Dropout`` (``dropout.py``). Each swapped
module computes what the plain one does on every device and in every mode, and takes its fast
path only where it was measured to pay (on the CPU; packed weights only with autograd off), so a
model swapped once may move between devices and between training and evaluation.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from fastpaths.attention import CpuScaledDotProduct
from fastpaths.dropout import Dropout
from fastpaths.packed import PackedLinear, PackedProjection
from transformer.attention import InProjection, ScaledDotProduct
from transformer.layers import PositionwiseFeedForward

Swap = Callable[[nn.Module], nn.Module | None]


def for_cpu_inference(model: nn.Module) -> nn.Module:
    """``model`` with the inference swaps of the module docstring made (in place); returns it.

    Applying it again changes nothing.
    """
    _swap(model, _inference_swap)
    return model


def for_cpu_training(model: nn.Module) -> nn.Module:
    """:func:`for_cpu_inference` (the trained model also validates) and the CPU's dropout masks."""
    _swap(model, _training_swap)
    return model


def _inference_swap(module: nn.Module) -> nn.Module | None:
    """The inference replacement of ``module`` (after its children were swapped), or None."""
    if isinstance(module, PackedLinear) or isinstance(module, CpuScaledDotProduct):
        return None
    if isinstance(module, PositionwiseFeedForward) and type(module.activation) is nn.ReLU:
        module.linear1 = PackedLinear.from_linear(module.linear1, relu=True)
        module.activation = nn.Identity()  # in linear1's kernel now
        return None
    if isinstance(module, InProjection):
        return PackedProjection.from_linear(module)
    if type(module) is nn.Linear:
        return PackedLinear.from_linear(module)
    if type(module) is ScaledDotProduct:
        return CpuScaledDotProduct().train(module.training)
    return None


def _training_swap(module: nn.Module) -> nn.Module | None:
    if type(module) is nn.Dropout:
        return Dropout.from_dropout(module)
    return _inference_swap(module)


def _swap(module: nn.Module, swap: Swap) -> None:
    """Replaces, depth first, every descendant of ``module`` that ``swap`` gives a replacement for."""
    for name, child in list(module.named_children()):
        _swap(child, swap)
        new = swap(child)
        if new is not None:
            setattr(module, name, new)
