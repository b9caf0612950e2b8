"""A search step's n best tokens and their log-probabilities over a large vocabulary, on the CPU.

Two speed-ups of ``transformer.search``'s step (BENCHMARKS.md, "Decoding speed" and "What was
tried that did not help"): the block top-k (:func:`row_topk`), and the normaliser from one
softmax written over the logits in place, instead of a log-softmax or logsumexp over the
vocabulary (:func:`top_log_probs`). Both equal the plain calls, ``x.topk(n)`` and
``x.log_softmax(-1)``'s values at those tokens, on every device.
"""

from __future__ import annotations

import torch
from torch import Tensor

TOPK_BLOCK = 64  # vocabulary block of ``row_topk``: a multiple of the CPU's 16-float vectors


def row_topk(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``x.topk(n, dim=-1)`` for rows over a large vocabulary, in two cheap passes.

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


def top_log_probs(logits: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The ``n`` most likely next tokens of each row and their log-probabilities.

    logits: [rows, V] (fp32 or bf16) -> (log_probs fp32, tokens), each [rows, n], best first.
    ``logits`` is overwritten (with the probabilities) when contiguous.

    With m the row's largest logit and p_max its probability, log p(w) = logit(w) - m + log p_max,
    where p_max >= 1 / V loses no precision (in bf16 the softmax sums in fp32 and rounds p_max by
    at most 0.4%, below the logits' own rounding).
    """
    top_logits, top_tokens = row_topk(logits, n)  # (rows, n)
    top_logits = top_logits.float()
    if logits.is_contiguous():  # in place: the logits are not needed after this
        probs = torch.softmax(logits, -1, out=logits)
    else:
        probs = logits.softmax(dim=-1)
    p_max = probs.gather(1, top_tokens[:, :1]).float()  # (rows, 1)
    return top_logits - top_logits[:, :1] + p_max.log(), top_tokens
