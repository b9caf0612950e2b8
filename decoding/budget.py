"""How much a search decodes at once, by device: the batch budget and the logits' block.

A search holds, per hypothesis, its decoder state (the self-attention caches of every layer) and,
at each step, its next-token logits. Two budgets bound them:

* **the batch budget**, in padded hypothesis tokens (sentences × hypotheses per sentence ×
  longest source, EOS included; :func:`hypothesis_widths`): a batch of ``n`` sentences searched
  with beam ``k`` keeps ``n * k`` rows of decoder state, so each source counts ``k`` times.
  Sentences are batched longest first under it (``data.batching.longest_first_batches``, the
  rule training's batches follow too);
* **the logits' block**: the logits [rows, V] are the largest tensor of a step, and a step
  needs only a few numbers of each row, so they are made a block of rows at a time.

On the CPU both are small: 3,072 tokens keep ``translate.py`` with the Multi30k model within 400
MiB (a 4,096-token test batch searched whole with beam 5 holds ~1,300 hypotheses: 1 GiB of the
Performer's state; larger budgets decode faster and need more memory, BENCHMARKS.md,
"Translation memory"), and 2 MiB blocks of logits cost at most 5% of the speed. On a GPU, every
decoding step is a few dozen kernel launches whatever its rows, so a step should hold hundreds
of sentences and their logits whole: a small budget there leaves each step bound by the host
(BENCHMARKS.md, "GPU").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Padded hypothesis tokens searched at once on the CPU (module docstring).
CPU_TOKENS = 3072
# ... and on a GPU: beam 5 over Multi30k's ~15-token sources is ~400 sentences a batch, greedy
# search ~2,000; the decoder state of the recipe's model at that size is a few hundred MiB.
ACCELERATOR_TOKENS = 1 << 15
# Logit values made at once on the CPU: 2 MiB in fp32 (512 rows of 1,024 words, 65 of 8,000).
CPU_LOGIT_VALUES = 1 << 19
# ... and on a GPU, 512 MiB in fp32: a batch's logits in one block.
ACCELERATOR_LOGIT_VALUES = 1 << 27


def default_max_tokens(device: torch.device | str) -> int:
    """The batch budget (padded hypothesis tokens) of a search on ``device``."""
    return CPU_TOKENS if torch.device(device).type == "cpu" else ACCELERATOR_TOKENS


def logit_block_rows(device: torch.device | str, vocab: int) -> int:
    """Rows whose logits over a ``vocab``-word output a search step makes at once on ``device``."""
    values = CPU_LOGIT_VALUES if torch.device(device).type == "cpu" else ACCELERATOR_LOGIT_VALUES
    return max(1, values // max(1, vocab))


def hypothesis_widths(source_lengths: Sequence[int], hypotheses: int) -> list[int]:
    """Each source's share of a batch budget: (length + EOS) * the hypotheses searched for it.

    Args:
        source_lengths: ``n`` source lengths without EOS.
        hypotheses: rows of decoder state per sentence (``DecodingConfig.hypotheses``: the beam,
            the samples, 1 for greedy search).
    """
    return [(length + 1) * hypotheses for length in source_lengths]
