"""Speed-ups for one kind of hardware, applied to the plain model from outside it.

The model (``transformer/``) reads like the paper: ``nn.Linear``, ``nn.Dropout``, SDPA or the
written-out softmax; training's loss is ``F.cross_entropy`` over its logits; a search step's
scores are ``log_softmax(-1).topk(n)``. Each speed-up here was measured to pay on the device it
is applied to, and :func:`fastpaths.optimize.optimize` applies them, in one call made where a
program starts (``train.py``'s pipeline, ``translate.py``), as IPEX's ``optimize(model)`` and
``torch.ao``'s module swaps are applied; its docstring has the table of every swap (what, where,
when, why, the figure). Hardware detection lives here too (``hardware.py``).

* module swaps: ``cpu.py`` (packed weights, ``packed.py``; written-out attention,
  ``attention.py``; dropout masks, ``dropout.py``);
* components the trainer and the search take: the block loss (``loss.py``), the search step's
  block top-k and in-place normaliser (``search.py``), decoding's attention backends on CUDA;
* a process's allocator and kernel-cache settings (``allocators.py``).

The plain model is the contract: every swap's test is that the outputs equal the plain path's
(``tests/fastpaths/``), and the model's property tests run on both. The model and the decoding
package never import this package.

This module imports nothing (not torch): ``train.py`` reads ``fastpaths.allocators`` before
``import torch``.
"""
