"""Sampling outputs instead of searching for the best: temperature, top-k and nucleus (top-p).

At each step a row draws its next token from the model's distribution, reshaped as asked:

    p_T(y) ∝ p(y) ** (1 / T)                                  (temperature T)
    top-k: p_T restricted to the k most likely tokens
    top-p: p_T restricted to the fewest most likely tokens whose probability reaches p
           (Holtzman et al. 2020)

then renormalised. This is how back-translation makes varied synthetic sources from monolingual
text (Edunov et al. 2018; fairseq's ``--sampling``, Marian's ``--output-sampling``).

**Reproducible by sentence.** Each sample draws from its own random stream, seeded by the seed
the user gives, the sentence's source ids and the sample's number (:func:`sample_seed`), and uses
its step-t number at step t (inverse-CDF sampling: one uniform draw per step). A sentence's
samples are therefore the same whatever batch it lands in, whatever the token budget or the
number of worker processes, and identical sources with the same seed get the same samples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor

from decoding.config import SamplingConfig, SearchSettings
from decoding.ensemble import Ensemble
from decoding.state import Stepwise
from decoding.step import Hypothesis, SearchStep, length_penalty, max_output_lengths, search_constraints
from transformer import Transformer

_DEFAULTS = SearchSettings()


def sample_seed(seed: int, source: Sequence[int], sample: int) -> int:
    """The random stream of one sample: a 63-bit hash of the seed, the source ids and the number."""
    text = f"{seed}|{sample}|{','.join(map(str, source))}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def uniform_draws(seeds: Sequence[int], steps: int) -> Tensor:
    """[len(seeds), steps] fp64 uniforms in [0, 1): row r is stream ``seeds[r]``'s first ``steps``."""
    rows = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        rows.append(torch.rand(steps, generator=generator, dtype=torch.float64))
    return torch.stack(rows)


def draw(log_probs: Tensor, uniforms: Tensor, config: SamplingConfig) -> Tensor:
    """One token per row by inverse-CDF sampling of the reshaped distribution.

    Args:
        log_probs: [rows, V] fp32 next-token log-probabilities (-inf: impossible).
        uniforms: [rows] fp64 in [0, 1), one per row.
        config: temperature, top-k, top-p.

    Returns:
        [rows] token ids; a row whose every token is impossible gets token 0 (the caller's
        constraints never leave one so).
    """
    scaled = log_probs / config.temperature
    k = min(config.topk, scaled.size(1)) if config.topk else scaled.size(1)
    values, tokens = scaled.topk(k, dim=-1) if config.topk else scaled.sort(dim=-1, descending=True)
    probs = torch.softmax(values.double(), dim=-1)  # (rows, k), most likely first
    if config.topp < 1.0:
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
        probs = probs.masked_fill(before >= config.topp, 0.0)  # the first token always stays
    cdf = probs.cumsum(dim=-1)  # (rows, k)
    target = uniforms[:, None].to(cdf) * cdf[:, -1:]
    pick = torch.searchsorted(cdf, target, right=True).clamp_(max=k - 1)  # first cdf > target
    return tokens.gather(1, pick).squeeze(1)


def _pick(log_probs: Tensor, rows: slice, uniforms: Tensor, config: SamplingConfig) -> tuple[Tensor, Tensor]:
    """A block's draws and their log-probabilities, each [block_rows]; ``uniforms``: [rows]."""
    chosen = draw(log_probs, uniforms[rows], config)
    return chosen, log_probs.gather(1, chosen[:, None]).squeeze(1)


@torch.no_grad()
def sample(
    model: Transformer | Ensemble | Stepwise,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    config: SamplingConfig,
    nsamples: int = 1,
    alpha: float = _DEFAULTS.alpha,
    max_len_a: float = _DEFAULTS.max_len_a,
    max_len_b: int = _DEFAULTS.max_len_b,
    min_len: int = _DEFAULTS.min_len,
    no_repeat_ngram: int = _DEFAULTS.no_repeat_ngram,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """``nsamples`` sampled outputs per sentence, each until EOS or the length limit.

    Args:
        model: in eval mode; an ``Ensemble`` samples from its combined distribution.
        src: [n, src_len] source ids, right-padded.
        bos_id, eos_id: target begin/end-of-sentence ids.
        config: temperature, top-k, top-p and seed.
        nsamples: samples per sentence (each from its own stream).
        alpha: length penalty exponent of the samples' scores (as beam search's).
        max_len_a, max_len_b, min_len, no_repeat_ngram, prefixes: as in
            :func:`~decoding.search.beam_search`.

    Returns:
        Per sentence, ``nsamples`` hypotheses sorted by score, best first. ``log_prob`` is the
        sample's log-probability under the model (the constraints applied, before temperature,
        top-k and top-p).
    """
    if nsamples < 1:
        raise ValueError(f"nsamples must be at least 1, not {nsamples}")
    n, device = src.size(0), src.device
    cfg = model.cfg
    constraints = search_constraints(eos_id, min_len, no_repeat_ngram, prefixes, device)
    max_lens = max_output_lengths(
        src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions - 1, constraints.prefix_lengths()
    )
    steps = int(max_lens.max())
    sources = [row[row != cfg.pad_id].tolist() for row in src.cpu()]
    seeds = [sample_seed(config.seed, sources[i], j) for i in range(n) for j in range(nsamples)]
    uniforms = uniform_draws(seeds, steps).to(device)  # (n*N, steps): row r's draw of step t
    # The N samples of a sentence are N rows from the first step on, sharing the sentence's
    # encoder output and cross-attention K/V (g = N rows per source). A row that has ended stays
    # until its sentence's last one has (its further tokens are not kept), then they all leave.
    step = SearchStep(model, src, steps + 1, constraints, need_log_probs=True)
    total = n * nsamples
    sentence_of = torch.arange(n, device=device).repeat_interleave(nsamples)  # (n*N,)
    out = src.new_full((total, steps), eos_id)  # (n*N, steps), EOS-filled
    log_prob = torch.zeros(total, dtype=torch.float64, device=device)
    ended = torch.zeros(total, dtype=torch.bool, device=device)
    active = torch.arange(total, device=device)  # original row of each live row
    tokens = src.new_full((total,), bos_id)
    for t in range(steps):
        hidden = step.decode(tokens)
        pick = partial(_pick, uniforms=uniforms[active, t], config=config)
        blocks = step.scores(
            hidden,
            t,
            pick,
            pick,
            history=out[active, :t] if step.wants_history else None,
            sentences=sentence_of[active],
        )
        next_tokens = torch.cat([tok for tok, _ in blocks])  # (rows,)
        live = ~ended[active]
        out[active[live], t] = next_tokens[live]
        log_prob[active[live]] += torch.cat([lp for _, lp in blocks])[live].double()
        ended[active] |= (next_tokens == eos_id) | (max_lens[sentence_of[active]] <= t + 1)
        done = ended[active].view(-1, nsamples).all(dim=1)  # (live sentences,)
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            keep_rows = (keep[:, None] * nsamples + torch.arange(nsamples, device=device)).view(-1)
            step.select(keep_rows, keep)
            active, next_tokens = active[keep_rows], next_tokens[keep_rows]
        tokens = next_tokens
    results: list[list[Hypothesis]] = []
    rows, log_probs = out.tolist(), log_prob.tolist()  # read once
    for i, limit in enumerate(max_lens.tolist()):
        hyps = []
        for r in range(i * nsamples, (i + 1) * nsamples):
            row = rows[r][:limit]
            ids = row[: row.index(eos_id)] if eos_id in row else row
            lp = log_probs[r]
            hyps.append(Hypothesis(ids, lp / length_penalty(len(ids) + 1, alpha), lp, r - i * nsamples))
        results.append(sorted(hyps, key=lambda h: -h.score))
    return results
