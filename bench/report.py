"""Markdown tables for BENCHMARKS.md from the JSON files the benchmarks wrote under bench/results/.

python bench/report.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS_DIR, print_table  # noqa: E402


def load(name: str) -> dict | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def training(data: dict, title: str) -> None:
    print(f"### {title}\n")
    c = data["config"]
    print(
        f"{c['date']}, {c['cpu']} ({c['cpu_flags']}), {c['threads']} threads, torch {c['torch']}; "
        f"matmul peak fp32 {c['matmul peak fp32 (2048^3)']}, "
        f"bf16 {c.get('matmul peak bf16 (2048^3)', 'not measured (no native bf16)')}\n"
    )
    rows = []
    for label, r in data["results"].items():
        if label == "two_single_thread_workers":
            continue
        rows.append(
            [
                label,
                r["tokens_per_s"],
                r["ratio_vs_torch_same_precision"],
                r["ratio_vs_torch_fp32"],
                r["model_gflop_s"],
                r["fraction_of_matmul_peak"],
            ]
        )
    print_table(
        [
            "config",
            "target tok/s",
            "vs nn.Transformer same precision",
            "vs nn.Transformer fp32",
            "model GFLOP/s",
            "of matmul peak",
        ],
        rows,
    )
    workers = data["results"].get("two_single_thread_workers")
    if workers:
        print_table(
            ["config", "2 x 1-thread workers, summed tok/s", "1 x 2-thread tok/s", "ratio"],
            [
                [
                    k,
                    v,
                    data["results"][k]["tokens_per_s"],
                    v / data["results"][k]["tokens_per_s"],
                ]
                for k, v in workers.items()
            ],
        )


def decoding(data: dict, title: str) -> None:
    print(f"### {title}\n")
    c = data["config"]
    print(
        f"{c['date']}, {c['threads']} threads, torch {c['torch']}, transformers {c['transformers']}, "
        f"ctranslate2 {c['ctranslate2']}; {c.get('checkpoint', '')}\n"
    )
    rows = []
    for key, systems in data.items():
        if not key.startswith(("random", "flickr")):
            continue
        for name, r in systems.items():
            rows.append(
                [
                    key,
                    name,
                    r["sentences_per_s"],
                    r["target_tokens_per_s"],
                    r["mean_output_tokens"],
                    r["ours_speedup_vs_this"],
                    r.get("bleu", ""),
                    r.get("identical_to_ours", ""),
                ]
            )
    print_table(
        [
            "workload",
            "system",
            "sent/s",
            "target tok/s",
            "tokens/sent",
            "ours is x faster",
            "BLEU",
            "same output as ours",
        ],
        rows,
    )
    for key, ratios in data.get("cached_vs_uncached", {}).items():
        measured = ", ".join(f"{where} {x:.2f}x" for where, x in ratios.items() if where != "flops")
        print(f"cached vs uncached, {key}: {measured}; FLOP ceiling {ratios['flops']:.2f}x\n")
    if "translate_memory" in data:
        print(f"Translator.translate memory: {data['translate_memory']}\n")


def main() -> None:
    for name, title in (("train_speed", "Training speed"), ("train_workers", "Training, two workers")):
        if (d := load(name)) is not None:
            training(d, title)
    for name, title in (("decode_speed", "Decoding speed"), ("decode_compile", "Decoding: compile, bf16")):
        if (d := load(name)) is not None:
            decoding(d, title)
    if (d := load("quality")) is not None:
        print("### Quality\n")
        print_table(
            ["pair", "BLEU", "BLEU lc", "chrF", "epochs", "training min", "total min"],
            [
                [
                    r["pair"],
                    r.get("bleu", ""),
                    r.get("bleu_lc", ""),
                    r.get("chrf", ""),
                    r["epochs"],
                    r.get("training_min", ""),
                    r.get("total_min", ""),
                ]
                for r in d["results"]
            ],
        )


if __name__ == "__main__":
    main()
