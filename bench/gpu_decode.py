"""Beam-5 decoding of test_2016_flickr on one device: ours against Hugging Face ``generate()``.

    python bench/gpu_decode.py --checkpoint CKPT                      # CUDA when there is one
    python bench/gpu_decode.py --checkpoint CKPT --device cpu --sentences 16 --reps 1   # smoke check

What it runs, in one process, on one device, both systems in fp32 (PyTorch's default matmul
precision):

1. ``python3 -m translation.export --format huggingface`` of the checkpoint, as a user runs it.
2. Ours: ``Translator.translate(texts, beam_size=5, alpha=0.6)``, what ``translate.py --beam-size 5
   --device DEVICE`` runs: batches of ``--max-tokens`` hypothesis tokens, longest first.
3. Hugging Face: ``MarianMTModel.generate(num_beams=5, length_penalty=0.6)`` on the same batches of
   sentences (``MarianTokenizer`` with padding), each batch with the output-length limit of its
   longest source (ours: ``floor(max_len_a * (subwords + 1) + max_len_b)``; HF's ``max_length`` is
   one more: it counts the decoder's start token). Its length penalty is its own formula (ours is
   GNMT's), so outputs may differ slightly.

Text in, text out: each timing covers SentencePiece encoding and decoding. One warm-up of each, then
``--reps`` interleaved repetitions; sentences/s of the median, and sacreBLEU of each.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.export import ALPHA, BEAM, limit, run_export  # noqa: E402
from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    add_json_option,
    environment,
    median,
    print_config,
    print_table,
    read_gz_lines,
    write_json,
)
from common.metrics import corpus_scores  # noqa: E402
from data.batching import longest_first_batches  # noqa: E402
from decoding.budget import hypothesis_widths  # noqa: E402
from translation import Translator  # noqa: E402
from translation.translator import DEFAULT_MAX_TOKENS  # noqa: E402


class HFBeam:
    """The Hugging Face export as a text-to-text system: beam 5 over given batches of texts."""

    def __init__(self, model_dir: Path, device: torch.device) -> None:
        from transformers import MarianMTModel, MarianTokenizer

        self.tokenizer = MarianTokenizer.from_pretrained(model_dir)
        self.model = MarianMTModel.from_pretrained(model_dir).to(device).eval()
        self.device = device

    @torch.no_grad()
    def __call__(self, texts: list[str], batches: list[list[int]], lengths: list[int]) -> list[str]:
        """``texts`` translated batch by batch; ``lengths[i]``: subwords of text ``i`` (ours)."""
        out = [""] * len(texts)
        for batch in batches:
            inputs = self.tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True)
            n = limit(max(lengths[i] for i in batch))
            ids = self.model.generate(
                **inputs.to(self.device),
                num_beams=BEAM,
                length_penalty=ALPHA,
                max_length=n + 1,
                do_sample=False,
            )
            for i, text in zip(
                batch, self.tokenizer.batch_decode(ids, skip_special_tokens=True), strict=True
            ):
                out[i] = text
        return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, help="a training checkpoint (e.g. averaged.ckpt)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of each system (median)")
    parser.add_argument("--sentences", type=int, default=0, help="first N test sentences (0: all)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="hypothesis tokens per batch (translate.py's)",
    )
    add_json_option(parser, "gpu_decode")
    args = parser.parse_args()
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_file():
        raise SystemExit(f"--checkpoint {checkpoint}: no such file")
    device = torch.device(args.device)
    config = {**environment(torch.get_num_threads()), "checkpoint": str(checkpoint), "device": str(device)}
    if device.type == "cuda":
        config["gpu"] = torch.cuda.get_device_name(device)
    config.update(repetitions=args.reps, max_tokens=args.max_tokens, beam=BEAM, alpha=ALPHA)
    print_config("beam-5 decoding: ours against Hugging Face generate()", config)
    texts = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.de.gz")[: args.sentences or None]
    refs = read_gz_lines(MULTI30K_DIR / "test_2016_flickr.en.gz")[: args.sentences or None]

    hf_dir = run_export(checkpoint, Path(tempfile.mkdtemp(prefix="gpu_decode_")) / "hf", "huggingface")
    ours = Translator.from_checkpoint(checkpoint, device=device)
    lengths = [len(s) for s in ours.encode_sources(texts)]
    widths = hypothesis_widths(lengths, BEAM)
    batches = longest_first_batches(widths, args.max_tokens)
    hf = HFBeam(hf_dir, device)
    systems = {
        "ours": lambda: ours.translate(texts, beam_size=BEAM, alpha=ALPHA, max_tokens=args.max_tokens),
        "HF generate": lambda: hf(texts, batches, lengths),
    }

    def timed(name: str) -> tuple[list[str], float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = systems[name]()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out, time.perf_counter() - start

    for name in systems:  # warm-up (CUDA context, kernels, allocator)
        timed(name)
    times: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list[str]] = {}
    names = list(systems)
    for rep in range(args.reps):
        for name in names[rep % 2 :] + names[: rep % 2]:
            outputs[name], seconds = timed(name)
            times[name].append(seconds)
        print(f"  rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)

    n = len(texts)
    results: dict = {"config": config, "sentences": n, "batches": len(batches)}
    rows = []
    for name, out in outputs.items():
        bleu, speed = corpus_scores(out, refs).bleu, n / median(times[name])
        rows.append(
            [name, f"{bleu:.2f}", f"{speed:.1f}", f"{speed / (n / median(times['HF generate'])):.2f}"]
        )
        results[name] = {"bleu": bleu, "sentences_per_s": speed, "all_seconds": times[name]}
    same = sum(a == b for a, b in zip(outputs["ours"], outputs["HF generate"], strict=True))
    results["identical_outputs"] = same
    print_table(["system", f"BLEU beam {BEAM}", "sentences/s", "x HF generate"], rows)
    print(f"identical outputs: {same} of {n}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
