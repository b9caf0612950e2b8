"""The decoding systems ``bench/decode_speed.py`` times side by side, behind one call.

Each system is ``fn(batch, beam) -> output ids per sentence`` (no BOS or EOS), or, where its
workers share the batches out, ``fn(batches, beam)`` marked by :func:`whole_workload`: ours
(:func:`search_job`, cached or not, here or in worker processes), Hugging Face's ``generate`` and
CTranslate2 on our weights (:func:`make_systems`). A :class:`Batch` holds one batch in every
system's input format. :func:`cache_flops` counts what the K/V caches save in arithmetic.
``bench/decode_speed.py``'s docstring says how each is configured.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, register_flop_formula, sdpa_flop_count

from bench.ct2_worker import CT2Worker
from bench.uncached import Recomputing
from decoding.search import beam_search, greedy_search
from fastpaths.cpu import for_cpu_inference
from transformer import Transformer
from translation.export.huggingface import to_marian
from translation.workers import WorkerPool

PAD, BOS, EOS = 0, 2, 3
ALPHA = 0.6


def placeholder_vocabulary(size: int) -> list[str]:
    """CTranslate2 tokens for a model without a SentencePiece model: the specials, then ``w<id>``."""
    return ["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, size)]


class Batch:
    """One batch in every system's input format.

    ``vocabulary``: CTranslate2's source tokens by id; its model appends EOS itself
    (``add_source_eos``), so its sources are ours without the final EOS.
    """

    def __init__(self, sources: list[list[int]], vocabulary: list[str]) -> None:
        width = max(len(s) for s in sources)
        self.src = torch.tensor([s + [PAD] * (width - len(s)) for s in sources])  # (B, S), EOS included
        self.mask = (self.src != PAD).long()
        if any(s[-1] != EOS for s in sources):
            raise ValueError("every source must end with EOS")
        self.ct2 = [[vocabulary[i] for i in s[:-1]] for s in sources]
        self.n = len(sources)
        self.width = width


def batches_of(sources: list[list[int]], size: int, vocabulary: list[str]) -> list[Batch]:
    return [Batch(sources[i : i + size], vocabulary) for i in range(0, len(sources), size)]


def output_limit(batch: Batch, forced: int | None) -> int:
    """Most output tokens of every sentence in the batch, the same in every system."""
    return forced if forced else math.floor(1.5 * batch.width + 10)


def _strip_hf(row: list[int]) -> list[int]:
    row = row[1:]  # decoder start token
    return row[: row.index(EOS)] if EOS in row else [t for t in row if t != PAD]


# ----------------------------------------------------------------------------- systems


def whole_workload(fn: Callable[[list[Batch], int], list[list[int]]]) -> Callable:
    """Marks a system that takes every batch in one call (its workers share them out)."""
    fn.whole_workload = True
    return fn


def search_job(model: Transformer, job: tuple[torch.Tensor, int, int, int, bool]) -> list[list[int]]:
    """Our search, here or as a worker's job.

    job: ``(src, beam, max output tokens, min output tokens, use_cache)`` -> output ids per sentence.
    """
    src, beam, n, least, use_cache = job
    searched = model if use_cache else Recomputing(model)
    if beam == 1:
        return greedy_search(searched, src, BOS, EOS, 0.0, n, min_len=least)
    hyps = beam_search(searched, src, BOS, EOS, beam, 1, ALPHA, 0.0, n, min_len=least)
    return [h[0].tokens for h in hyps]


def make_systems(
    model: Transformer,
    ct2_dir: Path,
    tgt_vocabulary: list[str],
    threads: int,
    forced: int | None,
    extra: list[str],
    skip: list[str] = (),
    closers: list[Callable[[], None]] | None = None,
) -> dict[str, Callable[[Batch, int], list[list[int]]]]:
    """name -> fn(batch, beam) returning output ids per sentence (no BOS/EOS).

    ``tgt_vocabulary``: the CTranslate2 model's target tokens by id; ``skip``: names left out
    (never built); ``closers``: gets a function per worker process group started, to stop them
    once the workload is done.
    """
    closers = [] if closers is None else closers
    tgt_index = {token: i for i, token in enumerate(tgt_vocabulary)}

    def ours_fn(m: Transformer, use_cache: bool = True) -> Callable:
        def run(batch: Batch, beam: int) -> list[list[int]]:
            return search_job(m, (batch.src, beam, output_limit(batch, forced), forced or 0, use_cache))

        return run

    hf = to_marian(model, BOS, EOS) if "HF generate" not in skip else None

    @torch.no_grad()
    def hf_run(batch: Batch, beam: int) -> list[list[int]]:
        n = output_limit(batch, forced)
        out = hf.generate(
            input_ids=batch.src,
            attention_mask=batch.mask,
            num_beams=beam,
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n if forced else 0,
            use_cache=True,
            **({"length_penalty": ALPHA, "early_stopping": True} if beam > 1 else {}),
        )
        return [_strip_hf(row) for row in out.tolist()]

    def ct2_fn(worker: CT2Worker) -> Callable:
        def run(batches: list[Batch], beam: int) -> list[list[int]]:
            # Every batch at once, each with its own length limit: with inter_threads > 1 no
            # replica waits for another's batch.
            requests = [
                (
                    b.ct2,
                    dict(
                        beam_size=beam,
                        length_penalty=ALPHA,
                        max_decoding_length=output_limit(b, forced),
                        min_decoding_length=output_limit(b, forced) if forced else 0,
                    ),
                )
                for b in batches
            ]
            return [
                [tgt_index[t] for t in hyp] for batch in worker.translate_batches(requests) for hyp in batch
            ]

        return whole_workload(run)

    def workers_fn(pool: WorkerPool, use_cache: bool = True) -> Callable:
        def run(batches: list[Batch], beam: int) -> list[list[int]]:
            jobs = [(b.src, beam, output_limit(b, forced), forced or 0, use_cache) for b in batches]
            done = dict(pool.imap_unordered(search_job, jobs))
            return [tokens for i in range(len(batches)) for tokens in done[i]]

        return whole_workload(run)

    pools: dict[int, WorkerPool] = {}  # id(model) -> its workers, shared by its systems

    def pool_of(m: Transformer) -> WorkerPool:
        if id(m) not in pools:
            pools[id(m)] = WorkerPool(m, workers=threads, threads=1)
            closers.append(pools[id(m)].close)
            pools[id(m)].wait_ready()  # started and packed before any timing
        return pools[id(m)]

    def ct2_of(intra: int, inter: int) -> Callable:
        worker = CT2Worker(str(ct2_dir), intra, inter)  # a child process: see bench/ct2_worker.py
        closers.append(worker.close)
        return ct2_fn(worker)

    bf16 = for_cpu_inference(copy.deepcopy(model).to(torch.bfloat16)) if "bf16" in extra else None
    # name -> a function that builds the system (only those not skipped are built)
    builders: dict[str, Callable[[], Callable]] = {
        "ours": lambda: ours_fn(model),
        "ours uncached": lambda: ours_fn(model, use_cache=False),
        "HF generate": lambda: hf_run,
        "CT2 fp32": lambda: ct2_of(threads, 1),
        f"ours {threads}x1": lambda: workers_fn(pool_of(model)),
        f"CT2 fp32 {threads}x1": lambda: ct2_of(1, threads),
        f"ours uncached {threads}x1": lambda: workers_fn(pool_of(model), use_cache=False),
    }
    if bf16 is not None:
        builders["ours bf16"] = lambda: ours_fn(bf16)
        builders[f"ours bf16 {threads}x1"] = lambda: workers_fn(pool_of(bf16))
    if "compile" in extra:
        compiled = copy.deepcopy(model)
        compiled.decoder = torch.compile(compiled.decoder, dynamic=True)
        builders["ours compiled"] = lambda: ours_fn(compiled)
    unknown = set(skip) - set(builders) | ({"ours"} & set(skip))
    if unknown:
        others = sorted(set(builders) - {"ours"})
        raise SystemExit(f"--skip: cannot leave out {sorted(unknown)}; the others are {others}")
    return {name: build() for name, build in builders.items() if name not in skip}


def is_slow(name: str) -> bool:
    """The uncached searches: timed ``--slow-reps`` times only."""
    return name.startswith("ours uncached")


# ----------------------------------------------------------------------------- arithmetic


def _cpu_attention_flops(
    query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size, *args: object, **kwargs: object
) -> int:
    """The CPU's fused attention, counted as ``torch.utils.flop_counter`` counts the GPU's
    (the whole score matrix, causal or not); it has no formula for the CPU kernel."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


_CPU_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
if _CPU_ATTENTION not in flop_registry:  # once per process
    register_flop_formula(_CPU_ATTENTION)(_cpu_attention_flops)


def cache_flops(model: Transformer, batches: list[Batch], beam: int, forced: int | None) -> dict:
    """Floating-point operations of ours with and without caches on ``batches``.

    Their ratio is what the caches save in arithmetic. The measured speed-up could exceed it
    only if the cached search, whose matmuls are the smaller, ran more operations per second
    than the uncached one. Counted with packing off (the counter sees aten's matmuls, not
    oneDNN's packed linear maps); the attention scores count whole, causal or not.
    """
    plain = Transformer(model.cfg).eval()  # without the CPU swaps (a copy of a swapped model keeps them)
    plain.load_state_dict(model.state_dict())
    flops = {}
    for use_cache in (True, False):
        with FlopCounterMode(display=False) as counter:
            for b in batches:
                search_job(plain, (b.src, beam, output_limit(b, forced), forced or 0, use_cache))
        flops["cached" if use_cache else "uncached"] = counter.get_total_flops()
    return {**flops, "ratio": flops["uncached"] / flops["cached"]}
