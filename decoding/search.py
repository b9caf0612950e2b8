"""Greedy and batched beam search over the model's incremental decoder.

Both run the encoder once, project each sentence's cross-attention K/V once (shared by its
beams, never copied per beam), grow and reorder the self-attention states step by step, and
drop finished sentences from the active batch so that later steps only pay for live ones.
They drive the model through ``state.CachedDecoder`` and a :class:`~decoding.step.SearchStep`
only (``bench/uncached.py`` offers the same without caches, as the baseline).

The host reads what the device computed once per step (greedy: whether a sentence ended; beam:
which hypotheses finished, with their scores and tokens, in one transfer), never per sentence
or per hypothesis.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from decoding.config import SearchSettings
from decoding.ensemble import Ensemble
from decoding.state import Stepwise
from decoding.step import (
    PLAIN,
    Hypothesis,
    SearchKernels,
    SearchStep,
    best_tokens,
    length_penalty,
    max_output_lengths,
    search_constraints,
)
from transformer import Transformer

_DEFAULTS = SearchSettings()


@torch.no_grad()
def greedy_search(
    model: Transformer | Ensemble | Stepwise,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_len_a: float = _DEFAULTS.max_len_a,
    max_len_b: int = _DEFAULTS.max_len_b,
    min_len: int = _DEFAULTS.min_len,
    no_repeat_ngram: int = _DEFAULTS.no_repeat_ngram,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[int]]:
    """Most likely next token at each step until EOS or the length limit.

    Args:
        model: in eval mode; an ``Ensemble`` searches with its members' combined log-probabilities.
        src: [batch, src_len] source ids, right-padded with the model's pad id.
        bos_id, eos_id: target begin/end-of-sentence ids.
        max_len_a, max_len_b: at most a * source_length + b output tokens (EOS excluded);
            defaults from :class:`~decoding.config.SearchSettings`.
        min_len: EOS is forbidden before this many output tokens (the length limit still wins).
        no_repeat_ngram: no n-gram of this size is output twice (0: no constraint).
        prefixes: per sentence, target ids its output must start with ([] forces nothing); the
            length limit is raised to a prefix's length where it is shorter.

    Returns:
        For each sentence, its output ids without BOS and EOS.
    """
    n = src.size(0)
    constraints = search_constraints(eos_id, min_len, no_repeat_ngram, prefixes, src.device)
    cfg = model.cfg
    max_lens = max_output_lengths(
        src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions - 1, constraints.prefix_lengths()
    )
    longest = int(max_lens.max())
    step = SearchStep(model, src, longest + 1, constraints)
    out = src.new_full((n, longest), eos_id)  # (n, Tmax), EOS-filled
    active = torch.arange(n, device=src.device)  # original index of each live row
    tokens = src.new_full((n,), bos_id)
    for t in range(longest):
        hidden = step.decode(tokens)  # per model (rows, D)
        # (rows,); argmax needs no softmax
        blocks = step.scores(
            hidden,
            t,
            lambda logits, _: logits.argmax(dim=-1),
            lambda log_probs, _: best_tokens(log_probs, eos_id),
            history=out[active, :t] if step.wants_history else None,
            sentences=active,
        )
        next_tokens = torch.cat(blocks)
        out[active, t] = next_tokens
        done = (next_tokens == eos_id) | (max_lens[active] <= t + 1)
        if done.any():  # the step's one read
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            step.select(keep, keep)
            active, next_tokens = active[keep], next_tokens[keep]
        tokens = next_tokens
    results = []
    for row, limit in zip(out.tolist(), max_lens.tolist(), strict=True):
        row = row[:limit]
        results.append(row[: row.index(eos_id)] if eos_id in row else row)
    return results


def _read(scores: Tensor, tokens: Tensor) -> list[tuple[float, list[int]]]:
    """Hypotheses' log-probabilities [r] and tokens [r, t], read by the host in one transfer."""
    packed = torch.cat([scores[:, None].double(), tokens.double()], dim=1).tolist()
    return [(row[0], [int(x) for x in row[1:]]) for row in packed]


@torch.no_grad()
def beam_search(
    model: Transformer | Ensemble | Stepwise,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = _DEFAULTS.beam_size,
    nbest: int = 1,
    alpha: float = _DEFAULTS.alpha,
    max_len_a: float = _DEFAULTS.max_len_a,
    max_len_b: int = _DEFAULTS.max_len_b,
    min_len: int = _DEFAULTS.min_len,
    no_repeat_ngram: int = _DEFAULTS.no_repeat_ngram,
    prefixes: Sequence[Sequence[int]] | None = None,
    kernels: SearchKernels = PLAIN,
) -> list[list[Hypothesis]]:
    """Batched beam search with GNMT length penalty.

    Each step scores every continuation of every live beam, keeps for each sentence the
    2 * beam_size best, moves EOS-ending candidates that rank inside the beam to the finished
    list, and continues with the beam_size best others. A sentence is done once it has
    beam_size finished hypotheses or reaches its length limit (its live beams are then
    finished as they are); done sentences leave the batch.

    Args:
        model: in eval mode; an ``Ensemble`` searches with its members' combined log-probabilities.
        src: [batch, src_len] source ids, right-padded.
        bos_id, eos_id: target begin/end-of-sentence ids.
        beam_size: hypotheses kept per sentence.
        nbest: how many finished hypotheses to return per sentence (<= beam_size).
        alpha: length penalty exponent; scores are log P / ((5 + |y|) / 6) ** alpha, |y|
            counting EOS.
        max_len_a, max_len_b: at most a * source_length + b output tokens (EOS excluded).
        beam_size, alpha, max_len_a, max_len_b default to :class:`~decoding.config.SearchSettings`'s.
        min_len: EOS is forbidden before this many output tokens (the length limit still wins).
        no_repeat_ngram: no n-gram of this size is output twice (0: no constraint).
        prefixes: per sentence, target ids every hypothesis starts with ([] forces nothing), at
            the model's log-probabilities; the length limit is raised to a prefix's length.
        kernels: the step's top-k and normaliser (``SearchKernels``; faster ones from ``fastpaths``).

    Returns:
        Per sentence, ``nbest`` hypotheses sorted by score, best first.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be between 1 and beam_size={beam_size}")
    cfg = model.cfg
    if beam_size > cfg.tgt_vocab_size:
        raise ValueError(f"beam_size={beam_size} exceeds the {cfg.tgt_vocab_size}-word target vocabulary")
    n, k, device = src.size(0), beam_size, src.device
    constraints = search_constraints(eos_id, min_len, no_repeat_ngram, prefixes, device)
    max_lens = max_output_lengths(
        src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions - 1, constraints.prefix_lengths()
    )
    limits = max_lens.tolist()  # per sentence, read once
    step = SearchStep(model, src, max(limits) + 1, constraints)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    active = list(range(n))  # original index of each live sentence (on the host)
    active_index = torch.arange(n, device=device)  # the same on the device
    n_finished = [0] * n  # per live sentence
    # The first step runs one hypothesis per sentence (all k would be the same BOS); after it,
    # every sentence has g = k live beams.
    g = 1
    scores = torch.zeros(n, g, device=device)  # (m, g) log P of each live beam
    history = src.new_empty(n, 0)  # (m*g, t) tokens so far, BOS excluded
    tokens = src.new_full((n,), bos_id)
    per_row = min(2 * k, cfg.tgt_vocab_size)  # candidates kept of each beam

    def top_of_logits(logits: Tensor, _: slice) -> tuple[Tensor, Tensor]:
        return kernels.top_log_probs(logits, per_row)

    def top_of_log_probs(log_probs: Tensor, _: slice) -> tuple[Tensor, Tensor]:
        return log_probs.topk(per_row, dim=-1)

    t = 0
    while active:
        m = len(active)
        hidden = step.decode(tokens)  # per model (m*g, D)
        # A sentence's 2k best continuations are among the 2k best of each of its beams.
        blocks = step.scores(
            hidden,
            t,
            top_of_logits,
            top_of_log_probs,
            history=history,
            sentences=active_index.repeat_interleave(g) if step.wants_sentences else None,
        )
        top_log_probs = torch.cat([lp for lp, _ in blocks])  # (m*g, 2k)
        top_tokens = torch.cat([tok for _, tok in blocks])
        cand = (scores[:, :, None] + top_log_probs.view(m, g, per_row)).view(m, g * per_row)
        cand_scores, cand_pos = cand.topk(min(2 * k, g * per_row), dim=1)  # (m, 2k)
        cand_beam = cand_pos // per_row
        cand_token = top_tokens.view(m, g * per_row).gather(1, cand_pos)
        is_eos = cand_token == eos_id
        # EOS candidates ranked inside the beam finish.
        ends = is_eos[:, :k] & (cand_scores[:, :k] > float("-inf"))  # (m, k)
        end_rows = torch.arange(m, device=device)[:, None] * g + cand_beam[:, :k]  # (m, k) into m*g rows
        ended_history = history
        # The k best non-EOS candidates continue (beams at -inf, where a prefix or the n-gram
        # rule leaves fewer than k possible tokens, are never finished).
        cont_scores, pick = cand_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=1)  # (m, k)
        beam = cand_beam.gather(1, pick)  # (m, k)
        rows = (torch.arange(m, device=device)[:, None] * g + beam).view(-1)  # (m*k,) into m*g rows
        next_tokens = cand_token.gather(1, pick).view(-1)
        history = torch.cat([history.index_select(0, rows), next_tokens[:, None]], dim=1)
        scores, t, g = cont_scores, t + 1, k
        # The step's one read: which candidates ended (each sentence's live beams end too at its limit).
        ended = [(i, j) for i, row in enumerate(ends.tolist()) for j, end in enumerate(row) if end]
        for i, _ in ended:
            n_finished[i] += 1
        if ended:
            where = torch.tensor([i * k + j for i, j in ended], device=device)
            found = _read(
                cand_scores[:, :k].reshape(-1).index_select(0, where),
                ended_history.index_select(0, end_rows.reshape(-1).index_select(0, where)),
            )
            for (i, _), (lp, hyp) in zip(ended, found, strict=True):
                finished[active[i]].append(Hypothesis(hyp, lp / length_penalty(t, alpha), lp))
        at_limit = [limits[s] <= t for s in active]
        if any(at_limit):
            stopped = [i for i in range(m) if at_limit[i]]
            where = torch.tensor([i * k + j for i in stopped for j in range(k)], device=device)
            found = _read(scores.reshape(-1).index_select(0, where), history.index_select(0, where))
            for (lp, hyp), i in zip(found, [i for i in stopped for _ in range(k)], strict=True):
                if lp > float("-inf"):
                    finished[active[i]].append(Hypothesis(hyp, lp / length_penalty(t + 1, alpha), lp))
        done = [n_finished[i] >= k or at_limit[i] for i in range(m)]
        if any(done):
            keep_list = [i for i in range(m) if not done[i]]
            keep = torch.tensor(keep_list, dtype=torch.long, device=device)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
            rows, history = rows[keep_rows], history[keep_rows]
            next_tokens, scores = next_tokens[keep_rows], scores[keep]
            active = [active[i] for i in keep_list]
            active_index = active_index[keep]
            n_finished = [n_finished[i] for i in keep_list]
            step.select(rows, keep)
        else:
            step.select(rows)
        tokens = next_tokens
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
