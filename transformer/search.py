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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from fastpaths.search import top_log_probs
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
    """

    beam_size: int = 5
    alpha: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, not {self.beam_size}")


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


def _next_token_scores(
    model: Transformer, hidden: Tensor, t: int, min_len: int, eos_id: int, reduce: Callable[[Tensor], R]
) -> list[R]:
    """``reduce`` of the next-token logits of each block of rows, the logits made block by block.

    hidden: [rows, d_model] from ``decode_step(..., project=False)``; the logits of a block,
    [block_rows, V] with EOS forbidden while ``t < min_len``, are overwritable by ``reduce``.
    Returns the results in row order, one per block of at most ``LOGIT_VALUES // V`` rows.
    """
    results = []
    for part in hidden.split(max(1, LOGIT_VALUES // model.cfg.tgt_vocab_size)):
        logits = model.logits(part)  # (block_rows, V), in the model's dtype
        if t < min_len:
            logits[:, eos_id] = float("-inf")
        results.append(reduce(logits))
    return results


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
    max_len_a: float = _DEFAULTS.max_len_a,
    max_len_b: int = _DEFAULTS.max_len_b,
    min_len: int = 0,
) -> list[list[int]]:
    """Most likely next token at each step until EOS or the length limit.

    Args:
        model: in eval mode.
        src: [batch, src_len] source ids, right-padded with the model's pad id.
        bos_id, eos_id: target begin/end-of-sentence ids.
        max_len_a, max_len_b: at most a * source_length + b output tokens (EOS excluded);
            defaults from :class:`DecodingConfig`.
        min_len: EOS is forbidden before this many output tokens (the length limit still wins).

    Returns:
        For each sentence, its output ids without BOS and EOS.
    """
    n = src.size(0)
    max_lens = max_output_lengths(src, model.cfg.pad_id, max_len_a, max_len_b, model.cfg.max_positions - 1)
    memory, src_mask = model.encode(src)
    state = model.start_decoding(memory, src_mask, max_steps=int(max_lens.max()) + 1)
    out = src.new_full((n, int(max_lens.max())), eos_id)  # (n, Tmax), EOS-filled
    active = torch.arange(n, device=src.device)  # original index of each live row
    tokens = src.new_full((n,), bos_id)
    for t in range(out.size(1)):
        hidden = model.decode_step(tokens, state, project=False)  # (rows, D)
        # (rows,); argmax needs no softmax
        next_tokens = torch.cat(
            _next_token_scores(model, hidden, t, min_len, eos_id, lambda x: x.argmax(dim=-1))
        )
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
    beam_size: int = _DEFAULTS.beam_size,
    nbest: int = 1,
    alpha: float = _DEFAULTS.alpha,
    max_len_a: float = _DEFAULTS.max_len_a,
    max_len_b: int = _DEFAULTS.max_len_b,
    min_len: int = 0,
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
        beam_size, alpha, max_len_a, max_len_b default to :class:`DecodingConfig`'s.
        min_len: EOS is forbidden before this many output tokens (the length limit still wins).

    Returns:
        Per sentence, ``nbest`` hypotheses sorted by score, best first.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be between 1 and beam_size={beam_size}")
    if beam_size > model.cfg.tgt_vocab_size:
        vocab = model.cfg.tgt_vocab_size
        raise ValueError(f"beam_size={beam_size} exceeds the {vocab}-word target vocabulary")
    n, k, device = src.size(0), beam_size, src.device
    max_lens = max_output_lengths(src, model.cfg.pad_id, max_len_a, max_len_b, model.cfg.max_positions - 1)
    memory, src_mask = model.encode(src)
    state = model.start_decoding(memory, src_mask, max_steps=int(max_lens.max()) + 1)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    active = torch.arange(n, device=device)  # original index of each live sentence
    n_finished = torch.zeros(n, dtype=torch.long, device=device)  # per live sentence
    # The first step runs one hypothesis per sentence (all k would be the same BOS); after it,
    # every sentence has g = k live beams.
    g = 1
    scores = torch.zeros(n, g, device=device)  # (m, g) log P of each live beam
    history = src.new_empty(n, 0)  # (m*g, t) tokens so far, BOS excluded
    tokens = src.new_full((n,), bos_id)
    per_row = min(2 * k, model.cfg.tgt_vocab_size)  # candidates kept of each beam

    def top_of_block(logits: Tensor) -> tuple[Tensor, Tensor]:
        return _top_log_probs(logits, per_row)

    t = 0
    while active.numel():
        m = active.numel()
        hidden = model.decode_step(tokens, state, project=False)  # (m*g, D)
        # A sentence's 2k best continuations are among the 2k best of each of its beams.
        blocks = _next_token_scores(model, hidden, t, min_len, eos_id, top_of_block)
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
        # The k best non-EOS candidates continue.
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
            state.select(rows, keep)
        else:
            state.select(rows)
        tokens = next_tokens
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]
