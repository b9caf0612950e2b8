"""Speed-ups for one kind of hardware, applied to the plain model from outside it.

The model (``transformer/``) reads like the paper: ``nn.Linear``, ``nn.Dropout``, SDPA or the
written-out softmax, and training's reference loss is ``F.cross_entropy`` over its logits. Each
speed-up here was measured to pay for the CPU's small shapes (BENCHMARKS.md, "Decoding speed",
"Training speed and memory", "Found while profiling, and what became of it") and is applied in
one of three ways, as IPEX's ``optimize(model)`` and ``torch.ao``'s module swaps are:

* :func:`fastpaths.cpu.for_cpu_inference` swaps modules of a plain model for ones that compute the
  same on the CPU faster: packed weights (``packed.py``), written-out attention with a short-row
  softmax (``attention.py``). ``Translator``, the evaluation stages and the exporters' checks
  apply it;
* :func:`fastpaths.cpu.for_cpu_training` adds the CPU's dropout masks (``dropout.py``); the
  trainer applies it to the model it trains (which also validates: the inference swaps too);
* components that the trainer and the search choose by device: the block loss (``loss.py``),
  the block top-k and in-place normaliser of a search step (``search.py``), the allocator and
  kernel-cache settings of a process (``allocators.py``).

A top-level package, not a part of ``transformer/``: the model never imports it, and it serves
both programs (``train.py`` and ``translate.py``) and the training loss. The plain model is the
contract: every swap's test is that the outputs equal the plain model's
(``tests/fastpaths/``), and the model's property tests run on both.

This module imports nothing (not torch): ``train.py`` reads ``fastpaths.allocators`` before
``import torch``.
"""
