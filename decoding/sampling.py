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
from dataclasses import dataclass
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


@dataclass
class _Samples:
    """The n * N samples being drawn: row ``r`` is sample ``r % N`` of sentence ``r // N``.

    The N samples of a sentence are N decoder rows from the first step on, sharing the sentence's
    encoder output and cross-attention K/V (g = N rows per source). A row that has ended stays
    until its sentence's last one has (its further tokens are not kept), then they all leave.

    Attributes:
        out: [n*N, steps] each sample's tokens, EOS-filled.
        log_prob: [n*N] fp64 each sample's log-probability so far.
        ended: [n*N] whether it has ended (by EOS or at its length limit).
        sentence_of: [n*N] each sample's sentence.
        active: [rows] the sample of each live decoder row.
        tokens: [rows] each live row's latest token (BOS at the first step), fed next.
    """

    out: Tensor
    log_prob: Tensor
    ended: Tensor
    sentence_of: Tensor
    active: Tensor
    tokens: Tensor

    @classmethod
    def start(cls, src: Tensor, nsamples: int, steps: int, bos_id: int, eos_id: int) -> _Samples:
        """``nsamples`` empty samples of each sentence of ``src`` [n, src_len], at BOS."""
        total, device = src.size(0) * nsamples, src.device
        return cls(
            src.new_full((total, steps), eos_id),
            torch.zeros(total, dtype=torch.float64, device=device),
            torch.zeros(total, dtype=torch.bool, device=device),
            torch.arange(src.size(0), device=device).repeat_interleave(nsamples),
            torch.arange(total, device=device),
            src.new_full((total,), bos_id),
        )


def _draw_step(
    step: SearchStep, samples: _Samples, t: int, uniforms: Tensor, config: SamplingConfig
) -> tuple[Tensor, Tensor]:
    """Each live row's next token and its log-probability, each [rows]; ``uniforms``: [n*N, steps]."""
    active = samples.active
    pick = partial(_pick, uniforms=uniforms[active, t], config=config)
    blocks = step.scores(
        step.decode(samples.tokens),
        t,
        pick,
        pick,
        history=samples.out[active, :t] if step.wants_history else None,
        sentences=samples.sentence_of[active],
    )
    return torch.cat([tok for tok, _ in blocks]), torch.cat([lp for _, lp in blocks])


def _record(
    samples: _Samples, t: int, tokens: Tensor, log_probs: Tensor, max_lens: Tensor, eos_id: int
) -> None:
    """Keeps step ``t``'s draws ``tokens`` [rows] and their ``log_probs`` [rows] for the rows that
    had not ended, and marks those that end now (by EOS or at the length limit ``max_lens`` [n])."""
    active = samples.active
    live = ~samples.ended[active]  # (rows,)
    samples.out[active[live], t] = tokens[live]
    samples.log_prob[active[live]] += log_probs[live].double()
    samples.ended[active] |= (tokens == eos_id) | (max_lens[samples.sentence_of[active]] <= t + 1)


def _drop_done(step: SearchStep, samples: _Samples, tokens: Tensor, nsamples: int) -> bool:
    """Drops the sentences whose every sample has ended and feeds the others' draws ``tokens``
    [rows] next; False once no sentence is left."""
    done = samples.ended[samples.active].view(-1, nsamples).all(dim=1)  # (live sentences,)
    if done.any():
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            return False
        keep_rows = (keep[:, None] * nsamples + torch.arange(nsamples, device=keep.device)).view(-1)
        step.select(keep_rows, keep)
        samples.active, tokens = samples.active[keep_rows], tokens[keep_rows]
    samples.tokens = tokens
    return True


def _hypotheses(
    samples: _Samples, max_lens: Tensor, nsamples: int, eos_id: int, alpha: float
) -> list[list[Hypothesis]]:
    """Per sentence, its samples cut at EOS or its limit ``max_lens`` [n], sorted by score."""
    results: list[list[Hypothesis]] = []
    rows, log_probs = samples.out.tolist(), samples.log_prob.tolist()  # read once
    for i, limit in enumerate(max_lens.tolist()):
        hyps = []
        for r in range(i * nsamples, (i + 1) * nsamples):
            row = rows[r][:limit]
            ids = row[: row.index(eos_id)] if eos_id in row else row
            lp = log_probs[r]
            hyps.append(Hypothesis(ids, lp / length_penalty(len(ids) + 1, alpha), lp, r - i * nsamples))
        results.append(sorted(hyps, key=lambda h: -h.score))
    return results


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
    cfg = model.cfg
    constraints = search_constraints(eos_id, min_len, no_repeat_ngram, prefixes, src.device)
    max_lens = max_output_lengths(
        src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions - 1, constraints.prefix_lengths()
    )
    steps = int(max_lens.max())
    sources = [row[row != cfg.pad_id].tolist() for row in src.cpu()]
    seeds = [sample_seed(config.seed, source, j) for source in sources for j in range(nsamples)]
    uniforms = uniform_draws(seeds, steps).to(src.device)  # (n*N, steps): row r's draw of step t
    step = SearchStep(model, src, steps + 1, constraints, need_log_probs=True)
    samples = _Samples.start(src, nsamples, steps, bos_id, eos_id)
    for t in range(steps):
        tokens, log_probs = _draw_step(step, samples, t, uniforms, config)  # (rows,) each
        _record(samples, t, tokens, log_probs, max_lens, eos_id)
        if not _drop_done(step, samples, tokens, nsamples):
            break
    return _hypotheses(samples, max_lens, nsamples, eos_id, alpha)
