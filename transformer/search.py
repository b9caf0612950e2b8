"""Greedy and batched beam search over the model's incremental decoder.

Both run the encoder once, project each sentence's cross-attention K/V once (shared by its
beams, never copied per beam), grow and reorder the self-attention cache step by step, and
drop finished sentences from the active batch so that later steps only pay for live ones.
``use_cache=False`` recomputes the decoder (and the cross-attention K/V) on the whole prefix
at every step instead: slow, for tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.model import DecoderState, Transformer


@dataclass
class Hypothesis:
    """One output: token ids (no BOS/EOS), its length-normalised score and raw log-probability."""

    tokens: list[int]
    score: float
    log_prob: float


class _RecomputeState:
    """Stand-in for ``DecoderState`` that keeps the token prefix and recomputes everything."""

    def __init__(self, memory: Tensor, src_mask: Tensor, bos: Tensor) -> None:
        self.memory = memory  # (n_src, S, D)
        self.src_mask = src_mask  # (n_src, 1, 1, S)
        self.prefix = bos.new_empty(bos.size(0), 0)  # (rows, steps) tokens fed so far

    def select(self, rows: Tensor, sources: Tensor | None = None) -> None:
        self.prefix = self.prefix.index_select(0, rows)
        if sources is not None:
            self.memory = self.memory.index_select(0, sources)
            self.src_mask = self.src_mask.index_select(0, sources)


def _start(model: Transformer, src: Tensor, use_cache: bool, rows: int) -> DecoderState | _RecomputeState:
    memory, src_mask = model.encode(src)
    if use_cache:
        return model.start_decoding(memory, src_mask)
    return _RecomputeState(memory, src_mask, src.new_zeros(rows))


def _step(model: Transformer, tokens: Tensor, state: DecoderState | _RecomputeState) -> Tensor:
    """tokens: [rows] -> next-token logits [rows, V] (fp32)."""
    if isinstance(state, DecoderState):
        logits = model.decode_step(tokens, state)
    else:
        state.prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)
        logits, _ = model.decode(state.prefix, model.project_memory(state.memory), state.src_mask)
        logits = logits[:, -1]
    return logits.float()


def max_output_lengths(src: Tensor, pad_id: int, a: float, b: int, cap: int) -> Tensor:
    """Per sentence, the most tokens to generate: a * source_length + b, at most ``cap``.

    src: [batch, src_len] -> [batch] long.
    """
    src_len = (src != pad_id).sum(dim=1).float()
    return (a * src_len + b).floor().long().clamp(min=1, max=cap)


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[int]]:
    """Most likely next token at each step until EOS or the length limit.

    Args:
        model: in eval mode.
        src: [batch, src_len] source ids, right-padded with the model's pad id.
        bos_id, eos_id: target begin/end-of-sentence ids.
        max_len_a, max_len_b: at most a * source_length + b output tokens (EOS excluded).
        use_cache: False recomputes the decoder on the whole prefix each step (slow).

    Returns:
        For each sentence, its output ids without BOS and EOS.
    """
    n = src.size(0)
    max_lens = max_output_lengths(src, model.cfg.pad_id, max_len_a, max_len_b, model.cfg.max_positions - 1)
    state = _start(model, src, use_cache, n)
    out = src.new_full((n, int(max_lens.max())), eos_id)  # (n, Tmax), EOS-filled
    active = torch.arange(n, device=src.device)  # original index of each live row
    tokens = src.new_full((n,), bos_id)
    for t in range(out.size(1)):
        next_tokens = _step(model, tokens, state).argmax(dim=-1)  # (rows,); argmax needs no softmax
        out[active, t] = next_tokens
        done = (next_tokens == eos_id) | (max_lens[active] <= t + 1)
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            state.select(keep, keep)
            active, next_tokens = active[keep], next_tokens[keep]
        tokens = next_tokens
    results = []
    for row, limit in zip(out.tolist(), max_lens.tolist(), strict=True):
        row = row[:limit]
        results.append(row[: row.index(eos_id)] if eos_id in row else row)
    return results


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016); 1 when alpha is 0."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = 5,
    nbest: int = 1,
    alpha: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Batched beam search with GNMT length penalty.

    Each step scores every continuation of every live beam, keeps for each sentence the
    2 * beam_size best, moves EOS-ending candidates that rank inside the beam to the finished
    list, and continues with the beam_size best others. A sentence is done once it has
    beam_size finished hypotheses or reaches its length limit (its live beams are then
    finished as they are); done sentences leave the batch.

    Args:
        model: in eval mode.
        src: [batch, src_len] source ids, right-padded.
        bos_id, eos_id: target begin/end-of-sentence ids.
        beam_size: hypotheses kept per sentence.
        nbest: how many finished hypotheses to return per sentence (<= beam_size).
        alpha: length penalty exponent; scores are log P / ((5 + |y|) / 6) ** alpha, |y|
            counting EOS.
        max_len_a, max_len_b: at most a * source_length + b output tokens (EOS excluded).
        use_cache: False recomputes the decoder on the whole prefix each step (slow).

    Returns:
        Per sentence, ``nbest`` hypotheses sorted by score, best first.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be between 1 and beam_size={beam_size}")
    n, k, device = src.size(0), beam_size, src.device
    max_lens = max_output_lengths(src, model.cfg.pad_id, max_len_a, max_len_b, model.cfg.max_positions - 1)
    memory, src_mask = model.encode(src)
    if use_cache:
        state: DecoderState | _RecomputeState = model.start_decoding(memory, src_mask)
    else:
        state = _RecomputeState(memory, src_mask, src.new_zeros(n * k))
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    active = torch.arange(n, device=device)  # original index of each live sentence
    # Only the first beam is live at the start, so the k copies of BOS do not fill the beam.
    scores = torch.full((n, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    history = src.new_empty(n * k, 0)  # (rows, t) tokens so far, BOS excluded
    tokens = src.new_full((n * k,), bos_id)
    t = 0
    while active.numel():
        m = active.numel()
        logits = _step(model, tokens, state)  # (m*k, V)
        # The sentence's 2k best continuations are among the 2k best of each beam: take those per
        # row, normalise them with the row's logsumexp, and never materialise log_softmax over V.
        per_row = min(2 * k, logits.size(-1))
        top_logits, top_tokens = logits.topk(per_row, dim=-1)  # (m*k, 2k)
        top_log_probs = top_logits - logits.logsumexp(dim=-1, keepdim=True)
        cand = (scores[:, :, None] + top_log_probs.view(m, k, per_row)).view(m, k * per_row)
        cand_scores, cand_pos = cand.topk(min(2 * k, k * per_row), dim=1)  # (m, 2k)
        cand_beam = cand_pos // per_row
        cand_token = top_tokens.view(m, k * per_row).gather(1, cand_pos)
        is_eos = cand_token == eos_id
        # EOS candidates ranked inside the beam finish (python loop: a few per step).
        for i, j in (is_eos[:, :k] & (cand_scores[:, :k] > float("-inf"))).nonzero().tolist():
            row = i * k + cand_beam[i, j].item()
            lp = cand_scores[i, j].item()
            finished[active[i]].append(
                Hypothesis(history[row].tolist(), lp / length_penalty(t + 1, alpha), lp)
            )
        # The k best non-EOS candidates continue.
        cont_scores, pick = cand_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=1)  # (m, k)
        beam = cand_beam.gather(1, pick)  # (m, k)
        rows = (torch.arange(m, device=device)[:, None] * k + beam).view(-1)  # (m*k,)
        next_tokens = cand_token.gather(1, pick).view(-1)
        history = torch.cat([history.index_select(0, rows), next_tokens[:, None]], dim=1)
        scores, t = cont_scores, t + 1
        at_limit = max_lens[active] <= t
        for i in at_limit.nonzero().squeeze(1).tolist():
            for j in range(k):
                lp = scores[i, j].item()
                if lp > float("-inf"):
                    hyp = history[i * k + j].tolist()
                    finished[active[i]].append(Hypothesis(hyp, lp / length_penalty(t + 1, alpha), lp))
        n_done = torch.tensor([len(finished[i]) for i in active.tolist()], device=device)
        done = (n_done >= k) | at_limit
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
            rows, history = rows[keep_rows], history[keep_rows]
            next_tokens, scores, active = next_tokens[keep_rows], scores[keep], active[keep]
            state.select(rows, keep)
        else:
            state.select(rows)
        tokens = next_tokens
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
