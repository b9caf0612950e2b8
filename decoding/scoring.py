"""Forced decoding: the log-probability of a given target under the model (or an ensemble).

    log P(y | x) = sum_t log p(y_t | x, y_<t),   y ending with EOS

in one teacher-forced pass, as training computes its loss: the mean over the target's tokens is
the training NLL of the pair without label smoothing. Corpora are filtered and outputs rescored
this way (fairseq's ``--score-reference``, ``marian-scorer``, ``sockeye-score``). An ensemble
scores with its members' weighted log-probabilities, as its search does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from decoding.budget import logit_block_rows
from decoding.ensemble import Ensemble, members_of
from transformer import Transformer


@torch.no_grad()
def target_log_probs(model: Transformer | Ensemble, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
    """Each target token's log-probability.

    Args:
        model: in eval mode.
        src: [batch, src_len] source ids with EOS, right-padded.
        tgt_in: [batch, tgt_len] BOS then the target (right-padded).
        tgt_out: [batch, tgt_len] the target then EOS (right-padded with the pad id).

    Returns:
        [batch, tgt_len] fp32 log p(tgt_out[b, t] | src[b], tgt_in[b, :t+1]); 0 at padding.
    """
    models, weights = members_of(model)
    pad_id = models[0].cfg.pad_id
    total = torch.zeros(tgt_out.shape, dtype=torch.float32, device=tgt_out.device)
    flat_out = tgt_out.reshape(-1)  # (batch*tgt_len,)
    for member, weight in zip(models, weights, strict=True):
        hidden = member(src, tgt_in, project=False).reshape(flat_out.size(0), -1)  # (batch*tgt_len, D)
        picked = []
        # The logits [tokens, V] a block of rows at a time, as the search makes them.
        block = logit_block_rows(hidden.device, member.cfg.tgt_vocab_size)
        for rows, targets in zip(hidden.split(block), flat_out.split(block), strict=True):
            log_probs = torch.log_softmax(member.logits(rows).float(), dim=-1)
            picked.append(log_probs.gather(1, targets[:, None]).squeeze(1))
        total += weight * torch.cat(picked).view(tgt_out.shape)
    return total.masked_fill_(tgt_out == pad_id, 0.0)
