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
from dataclasses import dataclass

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


@dataclass
class _Beams:
    """The live sentences of a beam search and their beams: rows ``i*g .. i*g+g-1`` are sentence
    ``i``'s (g = 1 at the first step, where all k beams would be the same BOS; k after it).

    Attributes:
        active: original index of each live sentence, on the host [m].
        active_index: the same on the device [m].
        scores: [m, g] log P of each beam.
        history: [m*g, t] each beam's tokens so far, BOS excluded.
        tokens: [m*g] each beam's latest token (BOS at the first step), fed next.
        t: output tokens so far.
    """

    active: list[int]
    active_index: Tensor
    scores: Tensor
    history: Tensor
    tokens: Tensor
    t: int = 0

    @classmethod
    def start(cls, src: Tensor, bos_id: int) -> _Beams:
        """One beam per sentence of ``src`` [n, src_len], at BOS with log P 0."""
        n = src.size(0)
        return cls(
            list(range(n)),
            torch.arange(n, device=src.device),
            torch.zeros(n, 1, device=src.device),
            src.new_empty(n, 0),
            src.new_full((n,), bos_id),
        )

    @property
    def g(self) -> int:
        return self.scores.size(1)


@dataclass
class _Candidates:
    """Each live sentence's best continuations, best first, each [m, 2k] (fewer where the beams
    offer fewer): log P of beam and token, which of the sentence's g beams it extends, the token."""

    scores: Tensor
    beam: Tensor
    token: Tensor


def _expand(step: SearchStep, beams: _Beams, k: int, per_row: int, kernels: SearchKernels) -> _Candidates:
    """Scores every continuation of every live beam and keeps each sentence's 2k best.

    A sentence's 2k best continuations are among the ``per_row`` (2k) best of each of its beams,
    so the step reduces each row of next-token scores to those (a block of rows at a time).
    """
    m, g = len(beams.active), beams.g
    blocks = step.scores(
        step.decode(beams.tokens),  # per model (m*g, D)
        beams.t,
        lambda logits, _: kernels.top_log_probs(logits, per_row),
        lambda log_probs, _: log_probs.topk(per_row, dim=-1),
        history=beams.history,
        sentences=beams.active_index.repeat_interleave(g) if step.wants_sentences else None,
    )
    top_log_probs = torch.cat([lp for lp, _ in blocks]).view(m, g, per_row)  # (m, g, per_row)
    top_tokens = torch.cat([tok for _, tok in blocks]).view(m, g * per_row)
    cand = (beams.scores[:, :, None] + top_log_probs).view(m, g * per_row)  # log P of beam + token
    scores, pos = cand.topk(min(2 * k, g * per_row), dim=1)  # (m, 2k)
    return _Candidates(scores, pos // per_row, top_tokens.gather(1, pos))


def _select(beams: _Beams, cand: _Candidates, eos_id: int, k: int) -> tuple[_Beams, Tensor]:
    """The next beams: each sentence's k best candidates that do not end by EOS (beams at -inf,
    where a prefix or the n-gram rule leaves fewer than k possible tokens, are never finished).

    Returns:
        The new beams (k per sentence), and the rows [m*k] of the old m*g that they extend.
    """
    m, g = len(beams.active), beams.g
    cont_scores, pick = cand.scores.masked_fill(cand.token == eos_id, float("-inf")).topk(k, dim=1)  # (m, k)
    beam = cand.beam.gather(1, pick)  # (m, k)
    rows = (torch.arange(m, device=beam.device)[:, None] * g + beam).view(-1)  # (m*k,) into m*g rows
    tokens = cand.token.gather(1, pick).view(-1)  # (m*k,)
    history = torch.cat([beams.history.index_select(0, rows), tokens[:, None]], dim=1)  # (m*k, t+1)
    return _Beams(beams.active, beams.active_index, cont_scores, history, tokens, beams.t + 1), rows


def _finish_ended(
    finished: list[list[Hypothesis]], beams: _Beams, cand: _Candidates, eos_id: int, k: int, alpha: float
) -> None:
    """Finishes the candidates that end by EOS and rank inside their sentence's beam (its k best);
    ``beams`` are the ones the candidates extend."""
    m, g = len(beams.active), beams.g
    ends = (cand.token[:, :k] == eos_id) & (cand.scores[:, :k] > float("-inf"))  # (m, k)
    end_rows = torch.arange(m, device=ends.device)[:, None] * g + cand.beam[:, :k]  # (m, k) into m*g rows
    # The step's one read: which candidates ended.
    ended = [(i, j) for i, row in enumerate(ends.tolist()) for j, end in enumerate(row) if end]
    if not ended:
        return
    where = torch.tensor([i * k + j for i, j in ended], device=ends.device)
    found = _read(
        cand.scores[:, :k].reshape(-1).index_select(0, where),
        beams.history.index_select(0, end_rows.reshape(-1).index_select(0, where)),
    )
    for (i, _), (lp, hyp) in zip(ended, found, strict=True):
        finished[beams.active[i]].append(Hypothesis(hyp, lp / length_penalty(beams.t + 1, alpha), lp))


def _finish_at_limit(
    finished: list[list[Hypothesis]], beams: _Beams, limits: list[int], alpha: float
) -> list[bool]:
    """Finishes as they are the beams of the sentences at their length limit (those at -inf
    never); returns which live sentences those are [m]."""
    k = beams.g
    at_limit = [limits[s] <= beams.t for s in beams.active]
    if any(at_limit):
        stopped = [i for i in range(len(at_limit)) if at_limit[i]]
        where = torch.tensor([i * k + j for i in stopped for j in range(k)], device=beams.scores.device)
        found = _read(beams.scores.reshape(-1).index_select(0, where), beams.history.index_select(0, where))
        for (lp, hyp), i in zip(found, [i for i in stopped for _ in range(k)], strict=True):
            if lp > float("-inf"):
                finished[beams.active[i]].append(Hypothesis(hyp, lp / length_penalty(beams.t + 1, alpha), lp))
    return at_limit


def _drop_done(
    step: SearchStep,
    beams: _Beams,
    rows: Tensor,
    finished: list[list[Hypothesis]],
    at_limit: list[bool],
) -> _Beams:
    """Drops the sentences that are done (k hypotheses ended by EOS, or at their length limit) and
    moves the decoder states to the beams that go on: ``rows`` [m*k] of the step's m*g.

    A live sentence's finished list holds its EOS-ended hypotheses only until its limit, where
    it is done anyway: its length says whether it has k."""
    k = beams.g
    done = [at_limit[i] or len(finished[s]) >= k for i, s in enumerate(beams.active)]
    if not any(done):
        step.select(rows)
        return beams
    keep_list = [i for i in range(len(done)) if not done[i]]
    keep = torch.tensor(keep_list, dtype=torch.long, device=rows.device)  # (m',)
    keep_rows = (keep[:, None] * k + torch.arange(k, device=rows.device)).view(-1)  # (m'*k,)
    step.select(rows[keep_rows], keep)
    return _Beams(
        [beams.active[i] for i in keep_list],
        beams.active_index[keep],
        beams.scores[keep],
        beams.history[keep_rows],
        beams.tokens[keep_rows],
        beams.t,
    )


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

    Each step, as fairseq's ``SequenceGenerator`` takes it: *expand* scores every continuation of
    every live beam and keeps each sentence's 2 * beam_size best; *select* continues with the
    beam_size best of those that do not end; *finish* moves the EOS-ending candidates that rank
    inside the beam to the sentence's finished list, and at a sentence's length limit its live
    beams as they are; *drop* removes the sentences that are done (beam_size finished
    hypotheses, or at the limit) from the batch.

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
    k = beam_size
    constraints = search_constraints(eos_id, min_len, no_repeat_ngram, prefixes, src.device)
    max_lens = max_output_lengths(
        src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions - 1, constraints.prefix_lengths()
    )
    limits = max_lens.tolist()  # per sentence, read once
    step = SearchStep(model, src, max(limits) + 1, constraints)
    per_row = min(2 * k, cfg.tgt_vocab_size)  # candidates kept of each beam
    finished: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]  # per sentence
    beams = _Beams.start(src, bos_id)
    while beams.active:
        cand = _expand(step, beams, k, per_row, kernels)  # (m, 2k) continuations
        extended, rows = _select(beams, cand, eos_id, k)  # m*k beams of t+1 tokens
        _finish_ended(finished, beams, cand, eos_id, k, alpha)
        at_limit = _finish_at_limit(finished, extended, limits, alpha)
        beams = _drop_done(step, extended, rows, finished, at_limit)
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
