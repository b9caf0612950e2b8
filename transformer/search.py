"""Greedy and batched beam search over the model's incremental decoder.

Both run the encoder once, project each sentence's cross-attention K/V once (shared by its
beams, never copied per beam), grow and reorder the self-attention cache step by step, and
drop finished sentences from the active batch so that later steps only pay for live ones.
They talk to the model through ``encode``, ``start_decoding``, ``decode_step``, ``logits`` and
the state's ``select`` only (``bench/uncached.py`` offers the same without caches, as the baseline).

:class:`DecodingConfig` holds the decoding defaults (beam size, length penalty, length limit),
written here only: the search functions' keyword defaults, the training module's validation and
test decoding, ``translation.SearchOptions``, ``translate.py``'s options and ``conf/train.yaml``'s
``decoding`` group all take them from it (``tests/training/test_config.py`` checks ``conf/``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from fastpaths.search import top_log_probs
from transformer.constraints import Constraints, prefix_tensor
from transformer.ensemble import Ensemble, combined_log_probs, members_of
from transformer.model import Transformer

R = TypeVar("R")


@dataclass(frozen=True)
class DecodingConfig:
    """How to decode; the field defaults are the project's, and the only place they are written.

    Attributes:
        beam_size: hypotheses kept per sentence by beam search (1 finds greedy search's output).
        alpha: GNMT length penalty exponent: scores are log P / ((5 + |y|) / 6) ** alpha, |y|
            counting EOS; 0 ranks by raw log-probability.
        max_len_a, max_len_b: at most ``max_len_a * source_length + max_len_b`` output tokens
            (EOS excluded).
        min_len: EOS is forbidden before this many output tokens (the length limit still wins).
        no_repeat_ngram: no n-gram of this size occurs twice in an output; 0 allows repeats.
    """

    beam_size: int = 5
    alpha: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10
    min_len: int = 0
    no_repeat_ngram: int = 0

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, not {self.beam_size}")
        if self.min_len < 0:
            raise ValueError(f"min_len must be at least 0, not {self.min_len}")
        if self.no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be at least 0, not {self.no_repeat_ngram}")


_DEFAULTS = DecodingConfig()

# Logits are the largest tensor of a search step, [rows, V] (32 KB a row over 8,000 words), and a
# step needs only a few numbers of each row: they are made for at most this many values at a
# time (2 MiB in fp32), so that a batch's memory is its caches' (BENCHMARKS.md, "Translation
# speed within the memory target").
LOGIT_VALUES = 1 << 19


@dataclass
class Hypothesis:
    """One output: token ids (no BOS/EOS), its length-normalised score and raw log-probability."""

    tokens: list[int]
    score: float
    log_prob: float


def _top_log_probs(logits: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The ``n`` most likely next tokens of each row and their log-probabilities.

    logits: [rows, V] (fp32 or bf16) -> (log_probs fp32, tokens), each [rows, n], best first.
    ``logits`` is overwritten (with the probabilities) when contiguous. The values of
    ``logits.log_softmax(-1).topk(n)``, by the block top-k and one in-place softmax, faster on the
    CPU (``fastpaths/search.py`` says why).
    """
    return top_log_probs(logits, n)


class SearchStep:
    """A search's models with their decoder states, and the next-token scores of each step.

    One model whose search has no constraint that acts after the softmax takes the fast way: its
    logits, made a block of rows at a time, go to ``on_logits`` as they are. Otherwise (an
    ensemble, a prefix, no-repeat n-grams) each block's log-probabilities are combined over the
    models (:func:`~transformer.ensemble.combined_log_probs`), constrained
    (:class:`~transformer.constraints.Constraints`) and go to ``on_log_probs``.

    Args:
        model: a Transformer (or anything with its decoding interface) or an ``Ensemble``, in eval mode.
        src: [n, src_len] source ids, right-padded.
        max_steps: the most decoding steps.
        constraints: what the outputs may not be.
        need_log_probs: always the log-probabilities (sampling reshapes the whole distribution).
    """

    def __init__(
        self,
        model: Transformer | Ensemble,
        src: Tensor,
        max_steps: int,
        constraints: Constraints,
        need_log_probs: bool = False,
    ) -> None:
        self.models, self.weights = members_of(model)
        self.states = []
        for member in self.models:
            memory, src_mask = member.encode(src)
            self.states.append(member.start_decoding(memory, src_mask, max_steps=max_steps))
        self.constraints = constraints
        self.fast = len(self.models) == 1 and not (need_log_probs or constraints.need_log_probs)
        self.vocab = self.models[0].cfg.tgt_vocab_size

    def decode(self, tokens: Tensor) -> list[Tensor]:
        """Feeds ``tokens`` [rows] to every model: per model, its decoder output [rows, d_model]."""
        return [
            m.decode_step(tokens, s, project=False) for m, s in zip(self.models, self.states, strict=True)
        ]

    def select(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Every model's ``DecoderState.select``."""
        for state in self.states:
            state.select(rows, sources)

    @property
    def wants_history(self) -> bool:
        """Whether :meth:`scores` needs the rows' outputs so far (no repeated n-grams)."""
        return self.constraints.no_repeat_ngram > 0

    @property
    def wants_sentences(self) -> bool:
        """Whether :meth:`scores` needs each row's sentence (forced prefixes)."""
        return self.constraints.prefixes is not None

    def scores(
        self,
        hidden: list[Tensor],
        t: int,
        on_logits: Callable[[Tensor, slice], R],
        on_log_probs: Callable[[Tensor, slice], R],
        history: Tensor | None = None,
        sentences: Tensor | None = None,
    ) -> list[R]:
        """The reductions of the next-token scores of each block of rows, in row order.

        Args:
            hidden: from :meth:`decode`.
            t: output tokens so far (EOS is banned while ``t < min_len``).
            on_logits: reduces a block's logits [block_rows, V] (fast way; overwritable) and
                its slice of the rows.
            on_log_probs: the same for a block's constrained fp32 log-probabilities.
            history: [rows, t] the rows' outputs so far, where :attr:`wants_history`.
            sentences: [rows] each row's sentence in the batch, where :attr:`wants_sentences`.
        """
        eos_id = self.constraints.eos_id
        banned = t < self.constraints.min_len
        block = max(1, LOGIT_VALUES // self.vocab)
        results = []
        for start in range(0, hidden[0].size(0), block):
            parts = [h[start : start + block] for h in hidden]
            rows = slice(start, start + parts[0].size(0))
            if self.fast:
                logits = self.models[0].logits(parts[0])  # (block_rows, V), in the model's dtype
                if banned:
                    logits[:, eos_id] = float("-inf")
                results.append(on_logits(logits, rows))
                continue
            log_probs = combined_log_probs(self.models, self.weights, parts, banned, eos_id)
            self.constraints.apply(
                log_probs,
                t,
                history[rows] if history is not None else None,
                sentences[rows] if sentences is not None else None,
            )
            results.append(on_log_probs(log_probs, rows))
        return results


def best_tokens(log_probs: Tensor, eos_id: int) -> Tensor:
    """[rows, V] -> [rows] each row's most likely token; EOS where every token is impossible."""
    best, tokens = log_probs.max(dim=-1)
    return tokens.masked_fill_(best == float("-inf"), eos_id)


def max_output_lengths(
    src: Tensor, pad_id: int, a: float, b: int, cap: int, at_least: Tensor | None = None
) -> Tensor:
    """Per sentence, the most tokens to generate: a * source_length + b, at most ``cap``.

    src: [batch, src_len] -> [batch] long; ``at_least``: [batch] lengths the limit must reach
    (a forced prefix's), still at most ``cap``.
    """
    src_len = (src != pad_id).sum(dim=1).float()
    limits = (a * src_len + b).floor().long()
    if at_least is not None:
        limits = torch.maximum(limits, at_least)
    return limits.clamp(min=1, max=cap)


def search_constraints(
    eos_id: int,
    min_len: int,
    no_repeat_ngram: int,
    prefixes: Sequence[Sequence[int]] | None,
    device: torch.device,
) -> Constraints:
    """The :class:`~transformer.constraints.Constraints` of a search's keyword arguments."""
    return Constraints(eos_id, min_len, no_repeat_ngram, prefix_tensor(prefixes, device))


@torch.no_grad()
def greedy_search(
    model: Transformer | Ensemble,
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
            defaults from :class:`DecodingConfig`.
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
    step = SearchStep(model, src, int(max_lens.max()) + 1, constraints)
    out = src.new_full((n, int(max_lens.max())), eos_id)  # (n, Tmax), EOS-filled
    active = torch.arange(n, device=src.device)  # original index of each live row
    tokens = src.new_full((n,), bos_id)
    for t in range(out.size(1)):
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
        if done.any():
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


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016); 1 when alpha is 0."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Transformer | Ensemble,
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
        beam_size, alpha, max_len_a, max_len_b default to :class:`DecodingConfig`'s.
        min_len: EOS is forbidden before this many output tokens (the length limit still wins).
        no_repeat_ngram: no n-gram of this size is output twice (0: no constraint).
        prefixes: per sentence, target ids every hypothesis starts with ([] forces nothing), at
            the model's log-probabilities; the length limit is raised to a prefix's length.

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
    step = SearchStep(model, src, int(max_lens.max()) + 1, constraints)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    active = torch.arange(n, device=device)  # original index of each live sentence
    n_finished = torch.zeros(n, dtype=torch.long, device=device)  # per live sentence
    # The first step runs one hypothesis per sentence (all k would be the same BOS); after it,
    # every sentence has g = k live beams.
    g = 1
    scores = torch.zeros(n, g, device=device)  # (m, g) log P of each live beam
    history = src.new_empty(n, 0)  # (m*g, t) tokens so far, BOS excluded
    tokens = src.new_full((n,), bos_id)
    per_row = min(2 * k, cfg.tgt_vocab_size)  # candidates kept of each beam

    def top_of_logits(logits: Tensor, _: slice) -> tuple[Tensor, Tensor]:
        return _top_log_probs(logits, per_row)

    def top_of_log_probs(log_probs: Tensor, _: slice) -> tuple[Tensor, Tensor]:
        return log_probs.topk(per_row, dim=-1)

    t = 0
    while active.numel():
        m = active.numel()
        hidden = step.decode(tokens)  # per model (m*g, D)
        # A sentence's 2k best continuations are among the 2k best of each of its beams.
        blocks = step.scores(
            hidden,
            t,
            top_of_logits,
            top_of_log_probs,
            history=history,
            sentences=active.repeat_interleave(g) if step.wants_sentences else None,
        )
        top_log_probs = torch.cat([lp for lp, _ in blocks])  # (m*g, 2k)
        top_tokens = torch.cat([tok for _, tok in blocks])
        cand = (scores[:, :, None] + top_log_probs.view(m, g, per_row)).view(m, g * per_row)
        cand_scores, cand_pos = cand.topk(min(2 * k, g * per_row), dim=1)  # (m, 2k)
        cand_beam = cand_pos // per_row
        cand_token = top_tokens.view(m, g * per_row).gather(1, cand_pos)
        is_eos = cand_token == eos_id
        # EOS candidates ranked inside the beam finish (python loop: a few per step).
        ends = is_eos[:, :k] & (cand_scores[:, :k] > float("-inf"))  # (m, k)
        n_finished += ends.sum(dim=1)
        for i, j in ends.nonzero().tolist():
            row = i * g + cand_beam[i, j].item()
            lp = cand_scores[i, j].item()
            finished[active[i]].append(
                Hypothesis(history[row].tolist(), lp / length_penalty(t + 1, alpha), lp)
            )
        # The k best non-EOS candidates continue (beams at -inf, where a prefix or the n-gram
        # rule leaves fewer than k possible tokens, are never finished).
        cont_scores, pick = cand_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=1)  # (m, k)
        beam = cand_beam.gather(1, pick)  # (m, k)
        rows = (torch.arange(m, device=device)[:, None] * g + beam).view(-1)  # (m*k,) into m*g rows
        next_tokens = cand_token.gather(1, pick).view(-1)
        history = torch.cat([history.index_select(0, rows), next_tokens[:, None]], dim=1)
        scores, t, g = cont_scores, t + 1, k
        at_limit = max_lens[active] <= t
        for i in at_limit.nonzero().squeeze(1).tolist():
            for j in range(k):
                lp = scores[i, j].item()
                if lp > float("-inf"):
                    hyp = history[i * k + j].tolist()
                    finished[active[i]].append(Hypothesis(hyp, lp / length_penalty(t + 1, alpha), lp))
        done = (n_finished >= k) | at_limit
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
            rows, history = rows[keep_rows], history[keep_rows]
            next_tokens, scores, active = next_tokens[keep_rows], scores[keep], active[keep]
            n_finished = n_finished[keep]
            step.select(rows, keep)
        else:
            step.select(rows)
        tokens = next_tokens
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
