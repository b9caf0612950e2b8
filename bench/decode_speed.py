"""Decoding speed: our greedy / beam search against the peers, side by side in one run.

    python bench/decode_speed.py                          # random workload + test_2016_flickr
    python bench/decode_speed.py --workloads random       # random weights only (no checkpoint needed)
    python bench/decode_speed.py --profile                # torch.profiler tables, then exit
    python bench/decode_speed.py --compile                # also torch.compile'd decoder (ours)
    python bench/decode_speed.py --slow-reps 0            # no uncached searches (nor FLOP counts)

Systems (all at ``--threads`` threads, float32, batch 32, the same batches in the same order):

* ``ours``: ``transformer.search.greedy_search`` / ``beam_search`` with the K/V caches;
* ``ours uncached``: the same searches without caches (``bench/uncached.py``: the decoder
  recomputed on the prefix);
* ``HF generate``: ``transformers.MarianMTModel.generate()`` with the same sizes and *our* weights
  copied in (``translation/export/huggingface.py``), its default attention (SDPA), ``use_cache=True``;
* ``CT2 fp32``: ``ctranslate2.Translator`` on our weights converted to a ``TransformerSpec``
  (``compute_type="float32"``, ``intra_threads=threads``, ``inter_threads=1``), in a child
  process of its own (``bench/ct2_worker.py`` says why);
* ``ours 2x1``: ours in ``threads`` worker processes of 1 thread each (``translation/workers.py``,
  ``translate.py --workers``), every batch handed out at once, a free worker taking the next;
* ``ours uncached 2x1``: ``ours uncached`` in the same worker processes;
* ``CT2 fp32 2x1``: CTranslate2 with ``intra_threads=1, inter_threads=threads`` (its own way of
  running batches side by side), every batch submitted at once (``asynchronous=True``);
* optional: ``ours bf16`` (the model's weights in bfloat16, as ``translate.py --dtype bfloat16``
  runs it; beam scores in fp32), ``ours bf16 2x1`` (the same in worker processes) and
  ``ours compiled`` (``torch.compile`` on the decoder).

(``2x1`` stands for ``<threads>x1``.) The worker systems get every batch in one call, so their
timing covers handing the batches out and collecting them; their processes start before timing.

Workloads:

* ``random``: the model of conf/model/small (d 256, 3+3 layers, FFN 1024, 4 heads, vocab 8000)
  with random weights (seed 1234); 200 sources of 19 random subwords + EOS (20 tokens), batch 32;
  exactly 30 output tokens per sentence in every system, EOS made impossible: ours through
  ``min_len=30, max_len_a=0, max_len_b=30``; HF through
  ``min_new_tokens=max_new_tokens=30``; CTranslate2 through
  ``min_decoding_length=max_decoding_length=30``. The script checks every output has 30 tokens.
* ``flickr``: a trained checkpoint (default: the newest ``runs/multi30k_de_en/*/checkpoints/
  averaged.ckpt``) on test_2016_flickr (1,000 sentences) sorted by source length, batches of 32,
  natural lengths (until EOS), at most 1.5 x the batch's longest source + 10 tokens in every
  system (ours ``max_len_a=0, max_len_b=<that>``, HF ``max_new_tokens``, CT2
  ``max_decoding_length``). Greedy outputs are compared with ours. Beam 5 with each system's
  length-penalty knob at 0.6 (ours: GNMT ((5+|y|)/6)^0.6; HF and CT2: their own formulas), HF with
  ``early_stopping=True``. Output lengths differ a little, so the table gives tokens/s too.

Each repetition runs every system once over the whole workload (order rotated); medians are
reported. Timing covers the search calls only (sources are token ids already). For cached
against uncached, the script also counts the floating-point operations of both searches
(``torch.utils.flop_counter``, untimed): their ratio is the most the caches can save, so the
most the measured speed ratio can reach. A separate child process measures the peak memory of
``Translator.translate`` (text in, text out) on the test set.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.decoding_systems import (  # noqa: E402
    EOS,
    Batch,
    batches_of,
    cache_flops,
    is_slow,
    make_systems,
    output_limit,
    placeholder_vocabulary,
)
from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    add_json_option,
    environment,
    find_checkpoint,
    median,
    peak_rss_mib,
    print_config,
    print_table,
    read_gz_lines,
    reset_peak_rss,
    rss_mib,
    set_threads,
    timed,
    write_json,
)
from fastpaths.cpu import for_cpu_inference  # noqa: E402
from transformer import Transformer, TransformerConfig  # noqa: E402
from translation.export.ctranslate2 import to_ctranslate2  # noqa: E402
from translation.workers import WorkerPool  # noqa: E402


def run_workload(
    systems: dict[str, Callable],
    batches: list[Batch],
    beam: int,
    reps: int,
    slow_reps: int,
) -> dict[str, dict]:
    """Interleaved repetitions; per system: median seconds, outputs of the last repetition."""
    names = [n for n in systems if not is_slow(n) or slow_reps > 0]
    times: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[list[int]]] = {}
    # Warm-up (lazy inits, oneDNN kernel choice, torch.compile): a batch each, untimed.
    for name in list(names):
        start = time.perf_counter()
        try:
            whole = getattr(systems[name], "whole_workload", False)
            # A batch or more for every worker; one for the slow ones (their workers are ours').
            systems[name](batches[: 1 if is_slow(name) else 4] if whole else batches[0], beam)
        except Exception as err:  # torch.compile may fail on a machine without a working compiler
            if name != "ours compiled":
                raise
            print(f"  {name} failed, left out: {type(err).__name__}: {str(err).splitlines()[0]}")
            names.remove(name)
            times.pop(name)
            continue
        if name == "ours compiled":
            print(
                f"  warm-up of {name} (includes compiling): {time.perf_counter() - start:.1f} s", flush=True
            )
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            if is_slow(name) and rep >= slow_reps:
                continue
            system = systems[name]
            if getattr(system, "whole_workload", False):
                seconds, outputs[name] = timed(lambda system=system: system(batches, beam))
            else:
                seconds, outputs[name] = timed(
                    lambda system=system: [out for batch in batches for out in system(batch, beam)]
                )
            times[name].append(seconds)
        print(
            f"  rep {rep + 1}/{reps}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items() if t),
            flush=True,
        )
    return {n: {"seconds": median(times[n]), "all_seconds": times[n], "outputs": outputs[n]} for n in names}


def summarise(
    workload: str, beam: int, res: dict[str, dict], n_sentences: int, forced: int | None
) -> tuple[list[list], dict]:
    rows, out = [], {}
    ours = res["ours"]["seconds"]
    for name, r in res.items():
        lengths = [len(o) for o in r["outputs"]]
        if forced and any(n != forced for n in lengths):
            raise RuntimeError(f"{name}: outputs of {sorted(set(lengths))} tokens, not all {forced}")
        tokens = sum(lengths)
        sent_s, tok_s = n_sentences / r["seconds"], tokens / r["seconds"]
        speedup = r["seconds"] / ours  # how many times faster ours is than this system
        rows.append(
            [
                workload,
                "greedy" if beam == 1 else f"beam {beam}",
                name,
                sent_s,
                tok_s,
                tokens / n_sentences,
                len(r["all_seconds"]),
                speedup,
            ]
        )
        out[name] = {
            "sentences_per_s": sent_s,
            "target_tokens_per_s": tok_s,
            "mean_output_tokens": tokens / n_sentences,
            "median_seconds": r["seconds"],
            "all_seconds": r["all_seconds"],
            "ours_speedup_vs_this": speedup,
        }
    return rows, out


def cache_speedups(
    res: dict[str, dict],
    model: Transformer,
    batches: list[Batch],
    beam: int,
    forced: int | None,
    threads: int,
) -> dict | None:
    """Cached against uncached: measured in one process and in worker processes, and the
    ratio of floating-point operations (the ceiling of both); prints them. None (and no
    counting) when no uncached search was timed."""
    if not any(is_slow(name) for name in res):
        return None
    flops = cache_flops(model, batches, beam, forced)
    pairs = {
        "one process": ("ours", "ours uncached"),
        f"{threads}x1": (f"ours {threads}x1", f"ours uncached {threads}x1"),
    }
    out = {
        where: res[slow]["seconds"] / res[fast]["seconds"]
        for where, (fast, slow) in pairs.items()
        if fast in res and slow in res
    }
    out["flops"] = flops["ratio"]
    measured = ", ".join(f"{where} {x:.2f}x" for where, x in out.items() if where != "flops")
    print(
        f"  cached vs uncached: {measured or 'not timed'}; floating-point operations "
        f"{flops['ratio']:.2f}x ({flops['cached'] / 1e9:.0f} against {flops['uncached'] / 1e9:.0f} GFLOP), "
        "the most the caches can give",
        flush=True,
    )
    return out


def agreement(res: dict[str, dict], limits: list[int], reference: str = "ours") -> dict[str, float]:
    """Share of sentences whose output equals ours in the first ``limit - 1`` tokens.

    Cut at limit - 1: at the limit, ours stops without EOS while HF counts EOS in
    ``max_new_tokens``, so the last token may legitimately differ.
    """
    ref = res[reference]["outputs"]
    return {
        name: sum(a[: n - 1] == b[: n - 1] for a, b, n in zip(ref, r["outputs"], limits, strict=True))
        / len(ref)
        for name, r in res.items()
        if name != reference
    }


# ----------------------------------------------------------------------------- workloads


def random_model(seed: int) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        8000,
        8000,
        d_model=256,
        n_heads=4,
        n_encoder_layers=3,
        n_decoder_layers=3,
        d_ff=1024,
        dropout=0.1,
        max_positions=512,
        share_embeddings=True,
        tie_output=True,
    )
    return for_cpu_inference(Transformer(cfg).eval())


def random_sources(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(4, vocab, (n, length - 1), generator=g)
    return [row + [EOS] for row in body.tolist()]


def flickr_sources(translator, limit: int = 0) -> tuple[list[list[int]], list[int], list[str]]:  # noqa: ANN001
    """Test sources (ids + EOS) sorted by length, their original indices and the references."""
    texts = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.de.gz")
    refs = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.en.gz")
    if limit:
        texts, refs = texts[:limit], refs[:limit]
    ids = translator.encode_sources(texts)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [ids[i] + [EOS] for i in order], order, [refs[i] for i in order]


def memory_child(checkpoint: str, threads: int, beam: int, limit: int = 0) -> None:
    """Child process: peak resident memory of Translator.translate on the test set (JSON on stdout)."""
    set_threads(threads)
    from translation import Translator
    from translation.translator import SearchOptions

    base = rss_mib()
    translator = Translator.from_checkpoint(checkpoint)
    texts = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.de.gz")[: limit or None]
    translator.translate(texts[:32], SearchOptions(beam_size=beam))  # warm-up
    loaded = rss_mib()
    reset = reset_peak_rss()
    seconds, _ = timed(lambda: translator.translate(texts, SearchOptions(beam_size=beam)))
    peak = peak_rss_mib()
    # The same with `threads` single-thread worker processes (translate.py --workers), start-up included.
    start = time.perf_counter()
    with WorkerPool(translator.model, workers=threads, threads=1) as pool:
        sources = translator.encode_sources(texts)
        translator.translate_ids(sources, SearchOptions(beam_size=beam), pool=pool)
        pool_seconds = time.perf_counter() - start
        worker_peaks = [peak_rss_mib(pid) for pid in pool.pids]
    print(
        json.dumps(
            {
                "rss_before_load_mib": base,
                "rss_after_load_and_warmup_mib": loaded,
                "peak_rss_mib": peak,
                "peak_is_of_translate_only": reset,
                "seconds": seconds,
                "sentences_per_s_text_to_text": len(texts) / seconds,
                "workers": threads,
                "workers_peak_rss_mib": worker_peaks,
                "workers_seconds_with_startup": pool_seconds,
            }
        )
    )


def profile(model: Transformer, batch: Batch, systems: dict) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for name in ("ours", "HF generate"):
        for beam in (1, 5):
            systems[name](batch, beam)
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                systems[name](batch, beam)
            print(f"== profile: {name}, beam {beam}, one batch {tuple(batch.src.shape)}, 30 tokens forced")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workloads", nargs="+", default=["random", "flickr"], choices=["random", "flickr"])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each system (median reported)")
    parser.add_argument("--slow-reps", type=int, default=1, help="repetitions of 'ours uncached'")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sources", type=int, default=200, help="random workload: sentences")
    parser.add_argument("--src-len", type=int, default=20, help="random workload: tokens incl. EOS")
    parser.add_argument("--out-len", type=int, default=30, help="random workload: forced output tokens")
    parser.add_argument("--flickr-sentences", type=int, default=0, help="first N test sentences (0: all)")
    parser.add_argument("--checkpoint", default=None, help="flickr workload (default: newest de-en averaged)")
    parser.add_argument("--bf16", action="store_true", help="also ours with bfloat16 weights")
    parser.add_argument("--compile", action="store_true", help="also ours with torch.compile'd decoder")
    parser.add_argument(
        "--skip", nargs="+", default=[], metavar="SYSTEM", help='systems to leave out, e.g. "HF generate"'
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory child process")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1234)
    add_json_option(parser, "decode_speed")
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.threads, 5, args.flickr_sentences)
        return

    set_threads(args.threads)
    extra = (["bf16"] if args.bf16 else []) + (["compile"] if args.compile else [])
    tmp = Path(tempfile.mkdtemp(prefix="bench_ct2_"))
    config = {
        **environment(args.threads),
        "batch size": args.batch_size,
        "beams": args.beams,
        "repetitions": f"{args.reps} (ours uncached: {args.slow_reps}), interleaved, median",
        "random workload": (
            f"{args.sources} sources of {args.src_len} tokens, {args.out_len} output tokens forced"
        ),
    }
    rows, results = [], {"config": config}
    cache_vs: dict[str, dict] = {}  # "<workload> beam <n>" -> cached/uncached ratios and ceiling
    results["cached_vs_uncached"] = cache_vs

    if "random" in args.workloads or args.profile:
        model = random_model(args.seed)
        vocabulary = placeholder_vocabulary(model.cfg.tgt_vocab_size)
        to_ctranslate2(model, tmp / "random", vocabulary, vocabulary)
        closers: list[Callable[[], None]] = []
        systems = make_systems(
            model, tmp / "random", vocabulary, args.threads, args.out_len, extra, args.skip, closers
        )
        sources = random_sources(args.sources, args.src_len, 8000, args.seed)
        batches = batches_of(sources, args.batch_size, vocabulary)
        if args.profile:
            print_config("decoding profile", config)
            profile(model, batches[0], systems)
            return
        print_config("decoding speed", config)
        for beam in args.beams:
            print(f"random workload, beam {beam}:", flush=True)
            res = run_workload(systems, batches, beam, args.reps, args.slow_reps)
            r, s = summarise("random", beam, res, args.sources, args.out_len)
            if ratios := cache_speedups(res, model, batches, beam, args.out_len, args.threads):
                cache_vs[f"random beam {beam}"] = ratios
            rows += r
            results[f"random beam {beam}"] = s
        for close in closers:  # the workers of this workload
            close()
    else:
        print_config("decoding speed", config)

    if "flickr" in args.workloads:
        from sacrebleu.metrics import BLEU

        from translation import Translator

        ckpt = (
            args.checkpoint
            or find_checkpoint("multi30k_de_en", "averaged")
            or find_checkpoint("multi30k_de_en", "last")
        )
        if ckpt is None:
            print("flickr workload skipped: no checkpoint under runs/multi30k_de_en/ (train it first)")
        else:
            print(f"flickr workload: checkpoint {ckpt}", flush=True)
            results["config"]["checkpoint"] = str(ckpt)
            translator = Translator.from_checkpoint(ckpt)
            model = translator.model
            sources, _, refs = flickr_sources(translator, args.flickr_sentences)
            src_tok, tgt_tok = translator.src_tokenizer, translator.tgt_tokenizer
            src_vocabulary = src_tok.id_to_piece(range(src_tok.vocab_size))
            tgt_vocabulary = tgt_tok.id_to_piece(range(tgt_tok.vocab_size))
            to_ctranslate2(model, tmp / "trained", src_vocabulary, tgt_vocabulary)
            closers = []
            systems = make_systems(
                model, tmp / "trained", tgt_vocabulary, args.threads, None, extra, args.skip, closers
            )
            batches = batches_of(sources, args.batch_size, src_vocabulary)
            for beam in args.beams:
                print(f"flickr workload, beam {beam}:", flush=True)
                res = run_workload(systems, batches, beam, args.reps, args.slow_reps)
                r, s = summarise("flickr", beam, res, len(sources), None)
                if ratios := cache_speedups(res, model, batches, beam, None, args.threads):
                    cache_vs[f"flickr beam {beam}"] = ratios
                limits = [output_limit(b, None) for b in batches for _ in range(b.n)]
                same = agreement(res, limits)
                for name, row in zip(res, r, strict=True):
                    hyps = translator.tgt_tokenizer.decode(res[name]["outputs"])
                    bleu = BLEU().corpus_score(hyps, [refs]).score
                    s[name]["bleu"] = bleu
                    s[name]["identical_to_ours"] = same.get(name, 1.0)
                    row += [bleu, same.get(name, 1.0)]
                rows += r
                results[f"flickr beam {beam}"] = s
            for close in closers:
                close()
            if not args.no_memory:
                child = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--memory-child",
                        str(ckpt),
                        "--threads",
                        str(args.threads),
                        "--flickr-sentences",
                        str(args.flickr_sentences),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                memory = json.loads(child.stdout.strip().splitlines()[-1])
                results["translate_memory"] = memory
                print(f"Translator.translate, beam 5, test_2016_flickr, own process: {memory}")

    headers = ["workload", "search", "system", "sent/s", "tok/s", "tokens/sent", "reps", "ours is x faster"]
    if any(len(r) > len(headers) for r in rows):
        headers += ["BLEU", "same output as ours"]
        rows = [r + ["", ""] if len(r) == 8 else r for r in rows]
    print_table(headers, rows)
    print("targets: ours beam 5 >= 1.6x HF generate, >= 1.2x CT2 fp32; ours >= 7x ours uncached")
    if cache_vs:
        print("(cached vs uncached: the floating-point ratios printed per workload are their ceilings)")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
