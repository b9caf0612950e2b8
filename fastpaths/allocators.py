"""oneDNN's kernel caches, the one setting that both programs make (no torch import here).

oneDNN builds and keeps a kernel for every shape of a matrix product it sees (up to 1,024 of them,
and ideep as many again, ~600 KiB each). Bounded at ``KERNEL_CACHE`` kernels each, a process that
translates holds ~100 MiB less and runs as fast (BENCHMARKS.md, "Translation speed within the
memory target"), and a training process stops growing with every new batch shape ("Training
speed and memory"). ``training/memory.py`` sets them with the training process's allocator
settings, before torch is imported; ``packed.bound_kernel_caches`` for a process that translates.
"""

# Kernels each of oneDNN's and ideep's caches keep: a decoding step uses one per weight shape
# (five in a decoder) for its row count. With 16, translate.py ran as fast as with the default
# 1,024, and ~100 MiB smaller at the same batches.
KERNEL_CACHE = 16
# The environment variables oneDNN and ideep read, once, at their first kernel.
KERNEL_CACHE_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
