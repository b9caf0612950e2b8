"""The exports against ours on test_2016_flickr: identical greedy outputs, int8 BLEU, speed side by side.

    python bench/export.py                        # newest runs/multi30k_de_en/*/checkpoints/averaged.ckpt
    python bench/export.py --checkpoint CKPT --threads 2 --reps 3

What it runs, in one process (CTranslate2 in child processes of its own, see bench/ct2_worker.py):

1. ``python3 -m translation.export`` three times, as a user runs it: ``--format ctranslate2``
   (float32), ``--format ctranslate2 --quantization int8`` and ``--format huggingface``.
2. ``translate.py --greedy`` and ``translate.py --beam-size 5`` on the test sources, as a user
   runs them (``--threads``); their outputs are the reference. The sentences/s each reports is
   printed too (start-up and model loading excluded, like the timings below).
3. Greedy agreement with ``translate.py --greedy``, with nothing of ours on the peers' side:
   CTranslate2 float32 (pieces from ``source.spm`` in, pieces decoded with ``target.spm`` out,
   ``min_decoding_length=0``) and ``MarianMTModel.generate(num_beams=1, do_sample=False)`` with
   ``MarianTokenizer`` (decoded with ``skip_special_tokens=True``). Sentences are grouped by
   source length, so each batch has exactly our per-sentence length limit
   (``floor(max_len_a * (subwords + 1) + max_len_b)``, translate.py's defaults): CTranslate2
   ``max_decoding_length`` = limit, HF ``max_length`` = limit + 1 (it counts the decoder's start
   token). Counted on texts and on ids.
4. Beam 5, text in and text out, ``--reps`` interleaved repetitions (median): ours is
   ``Translator.translate(texts, beam_size=5)`` (what ``translate.py --beam-size 5`` runs: batches of
   its default budget of hypothesis tokens, sorted by length); CTranslate2 float32 and int8
   (``compute_type="default"``: the saved type) get the same batches, each with the length limit
   of its longest source, ``length_penalty=0.6`` (their own formula, ours is GNMT's), at
   ``intra_threads=threads``; the timing covers SentencePiece encoding and decoding. sacreBLEU of
   every system against the references.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402

from bench.ct2_worker import CT2Worker  # noqa: E402
from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    ROOT,
    add_json_option,
    environment,
    find_checkpoint,
    median,
    print_config,
    print_table,
    read_gz_lines,
    set_threads,
    timed,
    write_json,
)
from common.metrics import corpus_scores  # noqa: E402
from data.batching import longest_first_batches  # noqa: E402
from decoding.budget import hypothesis_widths  # noqa: E402
from decoding.config import SearchSettings  # noqa: E402
from translation import SearchOptions, Translator  # noqa: E402
from translation.translator import DEFAULT_MAX_TOKENS  # noqa: E402

BEAM = 5
ALPHA = 0.6


def limit(n_subwords: int) -> int:
    """Our longest output for a source of ``n_subwords`` (+ EOS), translate.py's defaults."""
    defaults = SearchSettings()
    return math.floor(defaults.max_len_a * (n_subwords + 1) + defaults.max_len_b)


def run_export(checkpoint: Path, out: Path, fmt: str, quantization: str | None = None) -> Path:
    """``python3 -m translation.export``, as README gives it; returns the folder."""
    cmd = [sys.executable, "-m", "translation.export", "--checkpoint", str(checkpoint)]
    cmd += ["--format", fmt, "--output", str(out), "--force"]
    cmd += ["--quantization", quantization] if quantization else []
    seconds, _ = timed(lambda: subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True))
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"  {' '.join(cmd[1:])}: {seconds:.1f} s, {size:.1f} MiB", flush=True)
    return out


def run_translate(checkpoint: Path, source: Path, threads: int, *options: str) -> tuple[list[str], float]:
    """``translate.py`` on ``source``: its output lines and the sentences/s it reports."""
    cmd = [sys.executable, "translate.py", "--checkpoint", str(checkpoint), "--input", str(source)]
    cmd += ["--threads", str(threads), *options]
    done = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    speed = re.search(r"([\d.]+) sentences/s", done.stderr.decode())
    lines = done.stdout.decode("utf-8").split("\n")[:-1]
    print(f"  translate.py {' '.join(options)}: {speed.group(1) if speed else '?'} sentences/s", flush=True)
    return lines, float(speed.group(1)) if speed else math.nan


def by_length(sources: list[list], size: int = 32) -> list[list[int]]:
    """Indices grouped by source length, at most ``size`` per group: each group has one limit."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, source in enumerate(sources):
        if source:
            groups[len(source)].append(i)
    return [ids[j : j + size] for _, ids in sorted(groups.items()) for j in range(0, len(ids), size)]


def ct2_greedy(model_dir: Path, texts: list[str], threads: int) -> tuple[list[str], list[list[str]]]:
    """Greedy texts and pieces of the CTranslate2 export, per text."""
    source = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
    target = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
    pieces = source.encode(texts, out_type=str)
    groups = by_length(pieces)
    worker = CT2Worker(str(model_dir), threads, 1, compute_type="default")
    options = dict(beam_size=1, min_decoding_length=0)
    requests = [
        ([pieces[i] for i in g], dict(options, max_decoding_length=limit(len(pieces[g[0]])))) for g in groups
    ]
    found = worker.translate_batches(requests)
    worker.close()
    out: list[list[str]] = [[] for _ in texts]
    for group, hyps in zip(groups, found, strict=True):
        for i, hyp in zip(group, hyps, strict=True):
            out[i] = hyp
    return [target.decode(p) if p else "" for p in out], out


@torch.no_grad()
def hf_greedy(model_dir: Path, texts: list[str]) -> tuple[list[str], list[list[int]]]:
    """Greedy texts and ids of the Hugging Face export (MarianMTModel + MarianTokenizer), per text."""
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(model_dir)
    model = MarianMTModel.from_pretrained(model_dir)
    encoded = [tokenizer(t)["input_ids"][:-1] for t in texts]  # without </s>
    ids: list[list[int]] = [[] for _ in texts]
    for group in by_length(encoded):
        batch = tokenizer([texts[i] for i in group], return_tensors="pt", padding=True)
        n = limit(len(encoded[group[0]]))
        out = model.generate(**batch, num_beams=1, do_sample=False, max_length=n + 1)
        for i, row in zip(group, out.tolist(), strict=True):
            row = row[1:]  # the decoder's start token
            eos = model.config.eos_token_id
            ids[i] = (
                row[: row.index(eos)] if eos in row else [t for t in row if t != model.config.pad_token_id]
            )
    return [tokenizer.decode(r, skip_special_tokens=True) if r else "" for r in ids], ids


class CT2Beam:
    """A CTranslate2 export as a text-to-text system in a child process: beam 5 on given batches."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        self.source = spm.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
        self.target = spm.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
        self.worker = CT2Worker(str(model_dir), threads, 1, compute_type="default")

    def __call__(self, texts: list[str], batches: list[list[int]]) -> list[str]:
        pieces = self.source.encode(texts, out_type=str)
        options = dict(beam_size=BEAM, length_penalty=ALPHA, min_decoding_length=0)
        requests = [
            ([pieces[i] for i in b], dict(options, max_decoding_length=limit(max(len(pieces[i]) for i in b))))
            for b in batches
        ]
        out = [""] * len(texts)
        for batch, hyps in zip(batches, self.worker.translate_batches(requests), strict=True):
            for i, text in zip(batch, self.target.decode(hyps), strict=True):
                out[i] = text
        return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", default=None, help="default: the newest de-en averaged.ckpt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="beam-5 repetitions of each system (median)")
    parser.add_argument("--sentences", type=int, default=0, help="first N test sentences (0: all)")
    add_json_option(parser, "export")
    args = parser.parse_args()
    checkpoint = Path(args.checkpoint or find_checkpoint("multi30k_de_en", "averaged") or "")
    if not checkpoint.is_file():
        raise SystemExit(
            "no checkpoint: give --checkpoint or train `python3 train.py experiment=multi30k_de_en`"
        )
    set_threads(args.threads)
    config = {**environment(args.threads), "checkpoint": str(checkpoint), "repetitions": args.reps}
    print_config("exports against ours", config)
    texts = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.de.gz")[: args.sentences or None]
    refs = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.en.gz")[: args.sentences or None]
    tmp = Path(tempfile.mkdtemp(prefix="bench_export_"))
    source_file = tmp / "test.de"
    source_file.write_text("".join(t + "\n" for t in texts), encoding="utf-8")

    print("exports:", flush=True)
    dirs = {
        "CT2 fp32": run_export(checkpoint, tmp / "ct2_fp32", "ctranslate2"),
        "CT2 int8": run_export(checkpoint, tmp / "ct2_int8", "ctranslate2", "int8"),
        "HF": run_export(checkpoint, tmp / "hf", "huggingface"),
    }
    sizes = {name: sum(f.stat().st_size for f in d.iterdir()) / 2**20 for name, d in dirs.items()}
    print("translate.py:", flush=True)
    greedy_ref, greedy_speed = run_translate(checkpoint, source_file, args.threads, "--greedy")
    beam_ref, beam_speed = run_translate(checkpoint, source_file, args.threads, "--beam-size", str(BEAM))

    ours = Translator.from_checkpoint(checkpoint)
    sources = ours.encode_sources(texts)
    found = ours.translate_ids(sources, SearchOptions(greedy=True))
    our_texts = [h[0].text if h else "" for h in found]
    our_tokens = [h[0].tokens if h else [] for h in found]
    n = len(texts)

    def count(a: list, b: list) -> int:
        return sum(x == y for x, y in zip(a, b, strict=True))

    print("greedy agreement with translate.py --greedy:", flush=True)
    same = {"ours in-process": {"texts": count(our_texts, greedy_ref)}}
    for name in ("CT2 fp32", "CT2 int8"):
        ct2_texts, ct2_pieces = ct2_greedy(dirs[name], texts, args.threads)
        ids = [ours.tgt_tokenizer.id_to_piece(t) for t in our_tokens]
        same[name] = {"texts": count(ct2_texts, greedy_ref), "ids": count(ct2_pieces, ids)}
    hf_texts, hf_ids = hf_greedy(dirs["HF"], texts)
    same["HF generate"] = {"texts": count(hf_texts, greedy_ref), "ids": count(hf_ids, our_tokens)}
    for name, counts in same.items():
        print(f"  {name}: " + ", ".join(f"{k} {v} of {n} identical" for k, v in counts.items()), flush=True)

    print(f"beam {BEAM}, {args.reps} interleaved repetitions:", flush=True)
    widths = hypothesis_widths([len(s) for s in sources], BEAM)
    batches = longest_first_batches(widths, DEFAULT_MAX_TOKENS)  # translate.py's batches
    ct2 = {name: CT2Beam(dirs[name], args.threads) for name in ("CT2 fp32", "CT2 int8")}
    systems = {
        "ours": lambda: ours.translate(texts, beam_size=BEAM, alpha=ALPHA),
        "CT2 fp32": lambda: ct2["CT2 fp32"](texts, batches),
        "CT2 int8": lambda: ct2["CT2 int8"](texts, batches),
    }
    for system in systems.values():  # warm-up
        system()
    times: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list[str]] = {}
    names = list(systems)
    for rep in range(args.reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            seconds, outputs[name] = timed(systems[name])
            times[name].append(seconds)
        print(f"  rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    for system in ct2.values():
        system.worker.close()
    print(f"  ours in-process = translate.py --beam-size {BEAM}: {count(outputs['ours'], beam_ref)} of {n}")

    results = {"config": config, "greedy_identical_of": n, "greedy_identical": same}
    results["translate.py"] = {"greedy_sentences_per_s": greedy_speed, "beam_sentences_per_s": beam_speed}
    beam_bleu = corpus_scores(beam_ref, refs).bleu
    rows = [["translate.py --beam-size 5", f"{beam_bleu:.2f}", beam_speed, "reference", "-"]]
    for name, out in outputs.items():
        bleu, speed = corpus_scores(out, refs).bleu, n / median(times[name])
        greedy = (
            f"{same[name]['texts']} of {n}" if name in same else f"{same['ours in-process']['texts']} of {n}"
        )
        rows.append([name, f"{bleu:.2f}", speed, greedy, sizes.get(name, math.nan)])
        results[name] = {"bleu": bleu, "sentences_per_s": speed, "all_seconds": times[name]}
    rows.append(["HF generate", "-", "-", f"{same['HF generate']['texts']} of {n}", sizes["HF"]])
    results["sizes_mib"] = sizes
    headers = ["system", f"BLEU beam {BEAM}", f"sent/s beam {BEAM}", "greedy = translate.py --greedy", "MiB"]
    print_table(headers, rows)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
