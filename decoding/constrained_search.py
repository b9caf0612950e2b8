"""Lexically constrained beam search with dynamic beam allocation (Post & Vilar 2018), vectorised
over the batch as Hu et al. (2019) and fairseq's ``LexicallyConstrainedBeamSearch`` do it.

Every output contains every constraint of its sentence (``lexical_constraints.py``: unordered, or
ordered). Each step, for all live sentences at once:

1. *expand*: EOS is impossible for a hypothesis that has not met all its constraints; the
   candidates are each sentence's 2k best continuations, each beam's best one, and each beam's
   continuation by every token that advances one of its constraints, whatever its probability
   (a constraint must be reached even where the model would not choose it);
2. *bank*: each candidate's progress through the constraints and its bank, the number of
   constraint tokens it has met (duplicates of a beam and token are dropped);
3. *allocate*: the beam is shared round-robin over the banks, highest first: the best candidate
   of the highest bank, the best of the next bank, ..., then the second best of each bank, and so
   on (:func:`allocation_order`), so that hypotheses that have met more of the constraints are
   kept beside likelier ones that have met fewer;
4. *select*, *finish*, *drop*, as ``search.beam_search`` does: the first k candidates in that order
   that do not end go on; those ending by EOS among the first k finish (they have met every
   constraint); at its length limit a sentence's live hypotheses that have met every constraint
   finish, and it is done.

A sentence none of whose hypotheses meets every constraint within its length limit gets no
hypothesis: its caller reports it. Each step keeps the best candidate of the highest bank, and
each beam is offered the tokens that advance its constraints, so the highest bank grows by one
token a step at least: constraints of T tokens in all are met within a limit of T tokens, unless
a forced prefix or the no-repeat rule forbids their tokens.

Everything a sentence's choice depends on (its candidates, their order, ties broken by stable
sorts) is computed per sentence, so its outputs do not depend on the batch it is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from decoding.config import SearchSettings
from decoding.ensemble import Ensemble
from decoding.lexical_constraints import ConstraintTables, SentenceConstraints
from decoding.state import Stepwise
from decoding.step import Hypothesis, SearchStep, length_penalty, max_output_lengths, search_constraints
from transformer import Transformer

_DEFAULTS = SearchSettings()
_NEG_INF = float("-inf")


@dataclass
class _Beams:
    """The live sentences and their beams: rows ``i*g .. i*g+g-1`` are sentence ``i``'s (g = 1 at
    the first step, k after it).

    Attributes:
        active: original index of each live sentence, on the host [m].
        active_index: the same on the device [m].
        tables: the live sentences' constraints.
        scores: [m, g] log P of each beam (-inf: a beam kept only to fill the beam).
        history: [m*g, t] each beam's tokens so far, BOS excluded.
        tokens: [m*g] each beam's latest token (BOS at the first step), fed next.
        matched: [m*g, C] each beam's progress through its sentence's constraints.
        t: output tokens so far.
    """

    active: list[int]
    active_index: Tensor
    tables: ConstraintTables
    scores: Tensor
    history: Tensor
    tokens: Tensor
    matched: Tensor
    t: int = 0

    @property
    def g(self) -> int:
        return self.scores.size(1)

    def progress(self) -> Tensor:
        """[m, g, C] ``matched`` by sentence."""
        return self.matched.view(len(self.active), self.g, self.matched.size(1))


@dataclass
class _Candidates:
    """Each live sentence's candidates [m, N], in the order the beam takes them
    (:func:`allocation_order`): log P of beam and token (-inf: not a candidate), which of the
    sentence's g beams it extends, the token (-1: none), its progress [m, N, C]."""

    scores: Tensor
    beam: Tensor
    token: Tensor
    matched: Tensor

    def take(self, index: Tensor) -> _Candidates:
        """The candidates at ``index`` [m, N'] of each sentence."""
        width = self.matched.size(2)
        return _Candidates(
            self.scores.gather(1, index),
            self.beam.gather(1, index),
            self.token.gather(1, index),
            self.matched.gather(1, index[:, :, None].expand(*index.shape, width)),
        )


def _needs_log_probs(logits: Tensor, rows: slice) -> None:
    raise RuntimeError("constrained search reads log-probabilities: SearchStep(need_log_probs=True)")


def _expand(step: SearchStep, beams: _Beams, k: int, per_row: int, eos_id: int) -> _Candidates:
    """Every sentence's candidates, unordered: its 2k best continuations [m, 2k], each beam's best
    [m, g] and each beam's continuations by the tokens its constraints want [m, g*C]."""
    m, g = len(beams.active), beams.g
    progress = beams.progress()  # (m, g, C)
    width = progress.size(2)
    unfinished = ~beams.tables.finished(progress).view(-1)  # (m*g,)
    wanted = beams.tables.wanted(progress).view(m * g, width)  # (m*g, C), -1: no token

    def reduce(log_probs: Tensor, rows: slice) -> tuple[Tensor, Tensor, Tensor]:
        log_probs[:, eos_id].masked_fill_(unfinished[rows], _NEG_INF)  # no end before the constraints
        top, tokens = log_probs.topk(per_row, dim=-1)  # (rows, per_row)
        want = wanted[rows]  # (rows, C)
        return top, tokens, log_probs.gather(1, want.clamp(min=0)).masked_fill(want < 0, _NEG_INF)

    blocks = step.scores(
        step.decode(beams.tokens),  # per model (m*g, D)
        beams.t,
        _needs_log_probs,
        reduce,
        history=beams.history,
        sentences=beams.active_index.repeat_interleave(g) if step.wants_sentences else None,
    )
    base = beams.scores[:, :, None]  # (m, g, 1)
    top = base + torch.cat([b[0] for b in blocks]).view(m, g, per_row)  # (m, g, per_row)
    top_tokens = torch.cat([b[1] for b in blocks]).view(m, g, per_row)
    wanted_scores = base + torch.cat([b[2] for b in blocks]).view(m, g, width)  # (m, g, C)
    best, pos = top.view(m, g * per_row).topk(min(2 * k, g * per_row), dim=1)  # (m, 2k)
    beam_of_row = torch.arange(g, device=top.device).expand(m, g)
    scores = torch.cat([best, top[:, :, 0], wanted_scores.view(m, g * width)], dim=1)  # (m, N)
    beam = torch.cat([pos // per_row, beam_of_row, beam_of_row.repeat_interleave(width, dim=1)], dim=1)
    token = torch.cat([top_tokens.view(m, -1).gather(1, pos), top_tokens[:, :, 0], wanted.view(m, -1)], dim=1)
    scores = scores.masked_fill(~_first_of_each(beam, token, step.vocab), _NEG_INF)
    parents = progress.gather(1, beam[:, :, None].expand(m, beam.size(1), width))  # (m, N, C)
    return _Candidates(scores, beam, token, beams.tables.advance(parents, token.clamp(min=0)))


def _first_of_each(beam: Tensor, token: Tensor, vocab: int) -> Tensor:
    """bool [m, N]: whether a candidate is the first of its (beam, token) in its sentence (the 2k
    best, each beam's best and the wanted tokens overlap)."""
    key = beam * (vocab + 1) + token + 1  # token -1 (none) has a key of its own
    ordered, order = key.sort(dim=1, stable=True)
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return ~torch.zeros_like(repeat).scatter(1, order, repeat)


def allocation_order(scores: Tensor, banks: Tensor) -> Tensor:
    """The order in which the beam takes each sentence's candidates: round-robin over the banks.

    The best candidate of the highest bank, the best of the next lower bank that has one, ...,
    then the second best of each, and so on (fairseq's "stripes"). Taking the first k shares the
    beam equally among the banks, a bank with fewer candidates leaving its share to the others.

    Args:
        scores: [m, N] log P of each candidate; -inf for none (they come last).
        banks: [m, N] the constraint tokens each has met.

    Returns:
        [m, N] candidate indices.
    """
    m, n = scores.shape
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, banks.gather(1, by_score).argsort(dim=1, descending=True, stable=True))
    bank = banks.gather(1, order)  # (m, N): banks descending, scores descending within each
    place = torch.arange(n, device=scores.device).expand(m, n)
    starts = torch.ones_like(bank, dtype=torch.bool)
    starts[:, 1:] = bank[:, 1:] != bank[:, :-1]
    rank = place - torch.where(starts, place, 0).cummax(dim=1).values  # 0: the best of its bank
    rank = rank.masked_fill(scores.gather(1, order) == _NEG_INF, n)
    return order.gather(1, rank.argsort(dim=1, stable=True))  # by rank, banks descending within one


def _select(beams: _Beams, cand: _Candidates, eos_id: int, k: int) -> tuple[_Beams, Tensor]:
    """The next beams: each sentence's first k candidates, in allocation order, that do not end
    (-inf where fewer than k can go on).

    Returns:
        The new beams (k per sentence), and the rows [m*k] of the old m*g that they extend.
    """
    m, g = len(beams.active), beams.g
    goes_on = (cand.scores > _NEG_INF) & (cand.token != eos_id)  # (m, N)
    pick = (~goes_on).to(torch.uint8).argsort(dim=1, stable=True)[:, :k]  # (m, k): the first k that go on
    chosen = cand.take(pick)
    scores = chosen.scores.masked_fill(~goes_on.gather(1, pick), _NEG_INF)
    rows = (torch.arange(m, device=pick.device)[:, None] * g + chosen.beam).view(-1)  # (m*k,) into m*g
    tokens = chosen.token.clamp(min=0).view(-1)  # (m*k,)
    history = torch.cat([beams.history.index_select(0, rows), tokens[:, None]], dim=1)  # (m*k, t+1)
    extended = _Beams(
        beams.active,
        beams.active_index,
        beams.tables,
        scores,
        history,
        tokens,
        chosen.matched.reshape(m * k, chosen.matched.size(2)),
        beams.t + 1,
    )
    return extended, rows


def _read(scores: Tensor, tokens: Tensor) -> list[tuple[float, list[int]]]:
    """Hypotheses' log-probabilities [r] and tokens [r, t], read by the host in one transfer."""
    packed = torch.cat([scores[:, None].double(), tokens.double()], dim=1).tolist()
    return [(row[0], [int(x) for x in row[1:]]) for row in packed]


def _finish_ended(
    finished: list[list[Hypothesis]], beams: _Beams, cand: _Candidates, eos_id: int, k: int, alpha: float
) -> None:
    """Finishes the candidates that end by EOS among each sentence's first k (EOS was impossible
    before every constraint was met); ``beams`` are the ones they extend."""
    m, g = len(beams.active), beams.g
    ends = (cand.token[:, :k] == eos_id) & (cand.scores[:, :k] > _NEG_INF)  # (m, k)
    ended = [(i, j) for i, row in enumerate(ends.tolist()) for j, end in enumerate(row) if end]  # one read
    if not ended:
        return
    where = torch.tensor([i * k + j for i, j in ended], device=ends.device)
    end_rows = (torch.arange(m, device=ends.device)[:, None] * g + cand.beam[:, :k]).view(-1)
    found = _read(
        cand.scores[:, :k].reshape(-1).index_select(0, where),
        beams.history.index_select(0, end_rows.index_select(0, where)),
    )
    for (i, _), (lp, hyp) in zip(ended, found, strict=True):
        finished[beams.active[i]].append(Hypothesis(hyp, lp / length_penalty(beams.t + 1, alpha), lp))


def _finish_at_limit(
    finished: list[list[Hypothesis]], beams: _Beams, limits: list[int], alpha: float
) -> list[bool]:
    """Finishes the beams that have met every constraint of the sentences at their length limit;
    returns which live sentences those are [m]."""
    k = beams.g
    at_limit = [limits[s] <= beams.t for s in beams.active]
    if any(at_limit):
        complete = (beams.scores > _NEG_INF) & beams.tables.finished(beams.progress())  # (m, k)
        stopped = [i for i in range(len(at_limit)) if at_limit[i]]
        where = torch.tensor([i * k + j for i in stopped for j in range(k)], device=beams.scores.device)
        kept = complete.view(-1).index_select(0, where).tolist()
        found = _read(beams.scores.view(-1).index_select(0, where), beams.history.index_select(0, where))
        for (lp, hyp), i, ok in zip(found, [i for i in stopped for _ in range(k)], kept, strict=True):
            if ok:
                finished[beams.active[i]].append(Hypothesis(hyp, lp / length_penalty(beams.t + 1, alpha), lp))
    return at_limit


def _drop_done(
    step: SearchStep, beams: _Beams, rows: Tensor, finished: list[list[Hypothesis]], at_limit: list[bool]
) -> _Beams:
    """Drops the sentences that are done (k hypotheses finished, or at their length limit) and moves
    the decoder states to the beams that go on: ``rows`` [m*k] of the step's m*g."""
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
        beams.tables.select(keep),
        beams.scores[keep],
        beams.history[keep_rows],
        beams.tokens[keep_rows],
        beams.matched[keep_rows],
        beams.t,
    )


@torch.no_grad()
def constrained_beam_search(
    model: Transformer | Ensemble | Stepwise,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    constraints: Sequence[SentenceConstraints],
    ordered: bool = False,
    beam_size: int = _DEFAULTS.beam_size,
    nbest: int = 1,
    alpha: float = _DEFAULTS.alpha,
    max_len_a: float = _DEFAULTS.max_len_a,
    max_len_b: int = _DEFAULTS.max_len_b,
    min_len: int = _DEFAULTS.min_len,
    no_repeat_ngram: int = _DEFAULTS.no_repeat_ngram,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search whose every output contains every constraint of its sentence (module docstring).

    Args:
        model: in eval mode; an ``Ensemble`` searches with its members' combined log-probabilities.
        src: [batch, src_len] source ids, right-padded.
        bos_id, eos_id: target begin/end-of-sentence ids.
        constraints: per sentence, its constraints: target id sequences of one id or more ([]: none).
        ordered: the constraints must occur in their order (default: in any order).
        beam_size, nbest, alpha, max_len_a, max_len_b, min_len, no_repeat_ngram, prefixes: as
            ``search.beam_search``'s; the length limit is not raised for the constraints.

    Returns:
        Per sentence, up to ``nbest`` hypotheses sorted by score, best first, each with every
        constraint; none for a sentence whose constraints were not all met within its length limit.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be between 1 and beam_size={beam_size}")
    if len(constraints) != src.size(0):
        raise ValueError(f"constraints for {len(constraints)} sentences, but {src.size(0)} sources")
    cfg = model.cfg
    if beam_size > cfg.tgt_vocab_size:
        raise ValueError(f"beam_size={beam_size} exceeds the {cfg.tgt_vocab_size}-word target vocabulary")
    k, n = beam_size, src.size(0)
    forced = search_constraints(eos_id, min_len, no_repeat_ngram, prefixes, src.device)
    limits = max_output_lengths(
        src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions - 1, forced.prefix_lengths()
    ).tolist()  # per sentence, read once
    step = SearchStep(model, src, max(limits) + 1, forced, need_log_probs=True)
    per_row = min(2 * k, cfg.tgt_vocab_size)
    tables = ConstraintTables.of(constraints, ordered, src.device)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    beams = _Beams(
        list(range(n)),
        torch.arange(n, device=src.device),
        tables,
        torch.zeros(n, 1, device=src.device),
        src.new_empty(n, 0),
        src.new_full((n,), bos_id),
        tables.start(1),
    )
    while beams.active:
        cand = _expand(step, beams, k, per_row, eos_id)  # (m, N) continuations
        cand = cand.take(allocation_order(cand.scores, beams.tables.banks(cand.matched)))
        extended, rows = _select(beams, cand, eos_id, k)  # m*k beams of t+1 tokens
        _finish_ended(finished, beams, cand, eos_id, k, alpha)
        at_limit = _finish_at_limit(finished, extended, limits, alpha)
        beams = _drop_done(step, extended, rows, finished, at_limit)
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
