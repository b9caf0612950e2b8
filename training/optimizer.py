"""The optimizer, chosen by name: Adam with L2 weight decay, or AdamW with decoupled weight decay.

- ``adam`` (the paper's, the default): ``torch.optim.Adam``; ``weight_decay`` is an L2 penalty
  added to every gradient before Adam's scaling, so it also reaches biases and LayerNorm gains.
  One parameter group, as checkpoints written before AdamW hold.
- ``adamw`` (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"): ``torch.optim.AdamW``
  shrinks the weights by ``lr * weight_decay`` apart from the gradient step. Two parameter groups:
  the matrices (every parameter of two or more dimensions: the linear maps and the embedding
  tables, which with tied embeddings are also the output projection) decay; the vectors (biases
  and LayerNorm gains) do not, as nanoGPT and Hugging Face exempt them: decaying a gain or a bias
  towards 0 does not regularise the function, it only shifts it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# The names ``optimizer.name`` takes, and the classes they build.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}

# Marks the parameter group that never decays (AdamW's vectors): ``on_train_start`` sets the
# configured weight decay on every other group, and 0 on this one, after a resume.
NO_DECAY = "no_weight_decay"


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's groups: matrices with ``weight_decay``, vectors (biases, norm gains) without.

    Args:
        model: the module whose parameters are trained.
        weight_decay: the decoupled weight decay of the matrices.

    Returns:
        Two groups, the decaying one first; each parameter once (tied weights are one parameter).
    """
    params = list(model.parameters())  # unique: a tied embedding and output matrix appear once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, NO_DECAY: True},
    ]


def group_weight_decay(group: dict[str, Any], weight_decay: float) -> float:
    """The weight decay a parameter group takes under the configured ``weight_decay``."""
    return 0.0 if group.get(NO_DECAY, False) else weight_decay


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    fused: bool,
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``model``'s parameters.

    Args:
        model: the module trained.
        name: ``"adam"`` (L2 decay, one group) or ``"adamw"`` (decoupled decay, vectors exempt).
        lr: peak learning rate (the schedule multiplies it).
        betas, eps: Adam's moment decays and denominator epsilon.
        weight_decay: Adam's L2 coefficient, or AdamW's decoupled decay of the matrices.
        fused: one fused kernel per step for all parameters (CUDA, or the CPU since PyTorch 2.4).

    Raises:
        ValueError: an unknown ``name``, naming the setting and the known ones.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name={name!r} is not one of {', '.join(OPTIMIZERS)}")
    params: Any = model.parameters() if name == "adam" else parameter_groups(model, weight_decay)
    return OPTIMIZERS[name](params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
