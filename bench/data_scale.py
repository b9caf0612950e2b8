"""Data preparation at WMT scale: synthetic corpora of 1M, 4.5M (and 36M) pairs through the real path.

For each size: a corpus made from a local one (default Multi30k's training files, repeated with the
line number appended so that every line is distinct for SentencePiece and the caches), prepared by
``TranslationDataModule`` as ``train.py`` builds it (``conf/data/multi30k.yaml`` with ``data_dir``
and ``cache_dir`` set), each start in a fresh process:

* first start (empty cache): wall time per stage (read, filter, SentencePiece, tokenize, bucket),
  time to the first training batch, peak RSS, the cache's size on disk;
* second start (the cache reused): time to the first training batch, peak RSS;
* the training loader with the ``gpu`` experiments' settings (``max_tokens=25000``, 4 workers,
  pinned batches and a copy to the GPU where CUDA exists): target tokens per second.

Usage:
    python3 bench/data_scale.py                         # 1M and 4.5M pairs
    python3 bench/data_scale.py --with-36m              # also 36M pairs (~5 GB of text)
    python3 bench/data_scale.py --pairs 20000 --loader-batches 5   # a quick check

Corpora and caches go under ``--work-dir`` (default ``/tmp/data_scale``) and are deleted after
each size unless ``--keep``. Not a test: nothing here runs in CI. Results: BENCHMARKS.md,
"Data preparation at WMT scale".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python bench/x.py`
from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    ROOT,
    environment,
    peak_rss_mib,
    print_config,
    print_table,
    timed,
    write_json,
)

STAGES = ("read", "filter", "sentencepiece", "tokenize", "bucket")


def make_corpus(source_dir: Path, out_dir: Path, pairs: int, src_lang: str, tgt_lang: str) -> None:
    """Write ``train.{src,tgt}`` of ``pairs`` lines (line ``i`` is source line ``i mod n`` + `` i``).

    Validation and test files are copied unchanged. Written 100,000 lines at a time.
    """
    from data.corpus import find_split_file
    from data.lines import LineMode, read_lines

    out_dir.mkdir(parents=True, exist_ok=True)
    for lang in (src_lang, tgt_lang):
        base = read_lines(find_split_file(source_dir, "train", lang), LineMode.STRICT)
        with open(out_dir / f"train.{lang}", "w", encoding="utf-8") as f:
            for start in range(0, pairs, 100_000):
                stop = min(pairs, start + 100_000)
                f.write("".join(f"{base[i % len(base)]} {i}\n" for i in range(start, stop)))
        for split in ("val", "test_2016_flickr"):
            path = find_split_file(source_dir, split, lang)
            shutil.copy(path, out_dir / path.name)


def _datamodule(data_dir: str, cache_dir: str, overrides: list[str]):  # noqa: ANN202
    """``TranslationDataModule`` composed from ``conf/`` as ``train.py`` does."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=[f"data.data_dir={data_dir}", f"data.cache_dir={cache_dir}", *overrides],
        )
    return instantiate(cfg.data, run_dir=str(Path(cache_dir).parent / "run"))


def child_start(data_dir: str, cache_dir: str, started: float) -> dict:
    """One start in this process: prepare (or reuse), set up, bucket, first training batch."""
    dm = _datamodule(data_dir, cache_dir, [])
    setup_s, _ = timed(lambda: (dm.prepare_data(), dm.setup("fit")))
    seconds = dict(dm.stage_seconds)
    seconds["bucket"], n_batches = timed(lambda: len(list(dm.batch_sampler("train"))))
    next(iter(dm.train_dataloader()))
    return {
        "seconds": seconds,
        "setup_s": setup_s,
        "first_batch_s": time.time() - started,
        "train_pairs": len(dm.tokenized["train"]),
        "train_batches": n_batches,
        "peak_rss_mib": peak_rss_mib(),
    }


def child_loader(data_dir: str, cache_dir: str, batches: int, workers: int, max_tokens: int) -> dict:
    """Target tokens per second of the training loader (sampling, collate, pinned copy)."""
    import torch

    cuda = torch.cuda.is_available()
    dm = _datamodule(data_dir, cache_dir, [f"data.num_workers={workers}", f"data.max_tokens={max_tokens}"])
    dm.pin_memory = cuda
    dm.setup("fit")
    available = len(dm.batch_sampler("train"))
    if batches >= available:  # one epoch is timed: the first batch is untimed
        sys.exit(
            f"--loader-batches {batches}: the corpus makes {available} batches of {max_tokens} tokens, "
            f"and one is untimed; ask for fewer, or for more --pairs"
        )
    loader = dm.train_dataloader()
    it = iter(loader)
    next(it)  # workers started, first batch made
    tokens = padded = 0
    tick = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        if cuda:
            batch = {k: v.to("cuda", non_blocking=True) for k, v in batch.items()}
        tokens += int(batch["tgt_lengths"].sum())
        padded += batch["tgt_out"].numel()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - tick
    return {
        "batches": batches,
        "workers": workers,
        "max_tokens": max_tokens,
        "pinned_copy": cuda,
        "tgt_tokens_per_s": tokens / elapsed,
        "padded_tgt_tokens_per_s": padded / elapsed,
    }


def _run_child(args: list[str]) -> dict:
    # The child's clock starts here: its time to the first batch includes starting Python.
    # ROOT before any PYTHONPATH already set (the GPU machine's carried wheels are on it).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, DATA_SCALE_STARTED=repr(time.time()))
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"data_scale.py: {' '.join(args[:2])} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _du_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def run_size(pairs: int, args: argparse.Namespace) -> dict:
    work = Path(args.work_dir) / f"pairs_{pairs}"
    shutil.rmtree(work, ignore_errors=True)
    corpus, cache = work / "corpus", work / "cache"
    made, _ = timed(lambda: make_corpus(Path(args.corpus_dir), corpus, pairs, args.src_lang, args.tgt_lang))
    text_mib = sum(p.stat().st_size for p in corpus.glob("train.*")) / 2**20
    print(f"{pairs:,} pairs: corpus written in {made:.0f} s ({text_mib:,.0f} MiB of text)", flush=True)
    common = [str(corpus), str(cache)]
    first = _run_child(["--child", "start", *common])
    print(f"  first start: {json.dumps(first)}", flush=True)
    cache_mib = _du_mib(cache)
    second = _run_child(["--child", "start", *common])
    print(f"  second start: {json.dumps(second)}", flush=True)
    loader = _run_child(
        ["--child", "loader", *common, str(args.loader_batches), str(args.workers), str(args.max_tokens)]
    )
    print(f"  loader: {json.dumps(loader)}", flush=True)
    if not args.keep:
        shutil.rmtree(work)
    return {
        "pairs": pairs,
        "text_mib": text_mib,
        "cache_mib": cache_mib,
        "first": first,
        "second": second,
        "loader": loader,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_500_000])
    parser.add_argument("--with-36m", action="store_true", help="also 36M pairs (~5 GB of text)")
    parser.add_argument("--corpus-dir", default=str(MULTI30K_DIR), help="corpus the lines are taken from")
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--work-dir", default="/tmp/data_scale")
    parser.add_argument("--keep", action="store_true", help="keep corpora and caches")
    parser.add_argument("--loader-batches", type=int, default=200, help="batches timed per loader run")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (the gpu experiments')")
    parser.add_argument("--max-tokens", type=int, default=25000, help="batch budget (the gpu experiments')")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        kind, *rest = args.child
        if kind == "start":
            result = child_start(rest[0], rest[1], float(os.environ["DATA_SCALE_STARTED"]))
        else:
            result = child_loader(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]))
        print(json.dumps(result))
        return

    sizes = args.pairs + ([36_000_000] if args.with_36m else [])
    print_config(
        "data_scale", {**environment(threads=1), **{k: v for k, v in vars(args).items() if k != "child"}}
    )
    results = [run_size(n, args) for n in sizes]
    rows = []
    for r in results:
        s = r["first"]["seconds"]
        rows.append(
            [
                f"{r['pairs']:,}",
                *(s.get(k, float("nan")) for k in STAGES),
                r["first"]["first_batch_s"],
                r["first"]["peak_rss_mib"],
                r["cache_mib"],
                r["second"]["first_batch_s"],
                r["second"]["peak_rss_mib"],
                r["loader"]["tgt_tokens_per_s"],
            ]
        )
    print_table(
        [
            "pairs",
            *(f"{k} s" for k in STAGES),
            "1st start to batch s",
            "peak RSS MiB",
            "cache MiB",
            "2nd start s",
            "2nd RSS MiB",
            "loader tgt tok/s",
        ],
        rows,
    )
    if len(results) >= 2:
        import math

        a, b = results[0], results[1]
        prep = [sum(r["first"]["seconds"].values()) for r in (a, b)]
        exponent = math.log(prep[1] / prep[0]) / math.log(b["pairs"] / a["pairs"])
        print(f"preparation time exponent from {a['pairs']:,} to {b['pairs']:,} pairs: {exponent:.2f}")
    name = "data_scale_" + "_".join(str(n) for n in sizes)
    write_json(name, {"environment": environment(threads=1), "results": results})


if __name__ == "__main__":
    main()
