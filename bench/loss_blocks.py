"""The block loss's rows per block: training step time and peak tensor storage, side by side.

    python bench/loss_blocks.py                          # 2,048 / 512 / 256 / 128 rows, 6 rounds
    python bench/loss_blocks.py --rows 2048 512 --rounds 2 --tiny   # a seconds-long check

``training/loss.py`` makes the logits of ``block_rows`` rows at a time. The recipe's model
(``conf/model/small.yaml``: d_model 256, 4 heads, 3 + 3 layers, d_ff 1024, dropout 0.1, 8,000
words) takes training steps (bf16 autocast where the CPU computes bf16 natively, fp32 elsewhere,
as ``trainer.precision: auto``; forward, block loss, backward, Adam) on random tokens in five
batch shapes of about 4,096 tokens a side, as the recipe's ``data.max_tokens`` cuts Multi30k.
Each round runs the five shapes once per block size, the sizes in turn; the figure is the median
round. Peak tensor storage is counted exactly (``bench/storage_meter.py``) over one step of the
first shape. Not a test: the times depend on the machine (its CPU is printed with them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from training.memory import configure_allocators  # noqa: E402

configure_allocators()  # before torch is imported, as train.py does

from bench.harness import (  # noqa: E402
    environment,
    median,
    print_config,
    print_table,
    set_threads,
    timed,
    write_json,
)

# (sentences, source length, target length): ~4,096 tokens a side, Multi30k's range of lengths.
SHAPES = [(256, 16, 16), (200, 20, 19), (300, 13, 13), (160, 25, 24), (340, 12, 11)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2048, 512, 256, 128], help="block sizes")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (after one warm-up)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batches: checks the script")
    parser.add_argument("--json", default="loss_blocks", help="results file: bench/results/<name>.json")
    args = parser.parse_args()

    import torch

    from bench.storage_meter import StorageMeter
    from fastpaths.hardware import native_bf16
    from fastpaths.loss import projected_cross_entropy
    from transformer import Transformer, TransformerConfig

    set_threads(args.threads)
    bf16 = native_bf16()
    config = {
        **environment(args.threads),
        "command": " ".join(["python", "bench/loss_blocks.py", *sys.argv[1:]]),
        "rows": args.rows,
        "rounds": args.rounds,
        "precision": "bf16 autocast" if bf16 else "fp32",
    }
    print_config("the block loss's rows per block", config)
    torch.manual_seed(0)
    d, vocab, shapes = (32, 64, [(8, 5, 6), (4, 9, 8)]) if args.tiny else (256, 8000, SHAPES)
    model = Transformer(
        TransformerConfig(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab,
            d_model=d,
            n_heads=4,
            n_encoder_layers=3,
            n_decoder_layers=3,
            d_ff=4 * d,
            dropout=0.1,
        )  # fmt: skip
    ).train()
    adam = torch.optim.Adam(model.parameters(), lr=1e-4)
    batches = [(torch.randint(4, vocab, (b, s)), torch.randint(4, vocab, (b, t + 1))) for b, s, t in shapes]

    def step(src: torch.Tensor, tgt: torch.Tensor, rows: int) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            hidden = model(src, tgt[:, :-1], project=False)
            losses = projected_cross_entropy(
                hidden, model.output.weight, model.output.bias, tgt[:, 1:], 0, 0.1, rows
            )
        (losses.sum() / losses.numel()).backward()
        adam.step()
        adam.zero_grad(set_to_none=True)

    times: dict[int, list[float]] = {rows: [] for rows in args.rows}
    for rows in args.rows:
        step(*batches[0], rows)  # warm-up: Adam's state, first-call costs
    for _ in range(args.rounds):
        for rows in args.rows:
            times[rows].append(timed(lambda rows=rows: [step(src, tgt, rows) for src, tgt in batches])[0])
    results, table = {}, []
    first = args.rows[0]
    for rows in args.rows:
        with StorageMeter() as meter:
            step(*batches[0], rows)
        seconds = median(times[rows])
        results[rows] = {"round_s": seconds, "peak_bytes": meter.peak_bytes}
        table.append([rows, seconds, median(times[first]) / seconds, meter.peak_bytes / 2**20])
    print_table(["rows per block", "s per round", f"speed vs {first}", "peak tensor MiB"], table)
    write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
