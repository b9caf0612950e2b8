"""What ``data.length_buckets`` costs on Multi30k's training split: padding, filler rows, shapes.

    python bench/length_buckets.py                              # the presets, 4096 and 8192 tokens
    python bench/length_buckets.py --max-tokens 4096 --buckets 16,24,32,48,64,96,128,256

For each ``--max-tokens`` and each bucket list, the first epoch's training batches as the sampler
cuts them and the collate function pads them (:mod:`data.length_buckets`): the share of padding in
the padded source and target tensors (filler rows included), the share of rows that are fillers,
the number of distinct (rows, S, T) shapes a compiled step meets, and the number of batches;
first the same without buckets. No model runs: these are properties of the corpus and the
settings, the same on every machine. The speed they buy (CUDA graphs under ``compile: {mode:
reduce-overhead}``) is ``bench/gpu_train.py --length-buckets ... --compile-mode reduce-overhead``'s
to say, on a GPU.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import MULTI30K_DIR, print_table, write_json  # noqa: E402
from data.datamodule import TranslationDataModule  # noqa: E402
from data.length_buckets import LengthBuckets, bucketed_padding, distinct_shapes  # noqa: E402

PRESETS = {
    "coarse": [16, 24, 32, 48, 64, 96, 128, 256],
    "by 4": [12, 16, 20, 24, 28, 32, 40, 48, 64, 96, 128, 256],
    "by 2": [*range(8, 65, 2), 96, 128, 256],
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", default=str(MULTI30K_DIR), help="Multi30k's files (default: the shared copy)"
    )
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096, 8192], help="data.max_tokens")
    parser.add_argument(
        "--buckets", nargs="+", default=None, help="bucket lists, comma-separated (default: the presets)"
    )
    parser.add_argument(
        "--json", default="length_buckets", help="results: bench/results/<name>.json, or a path"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    lists = PRESETS if args.buckets is None else {b: [int(x) for x in b.split(",")] for b in args.buckets}
    local = Path(args.data_dir).is_dir()  # else the hub's copy of the same corpus
    dm = TranslationDataModule(data_dir=args.data_dir if local else None)
    dm.prepare_data()
    dm.setup("validate")  # the tokenized splits; the padding is computed here
    src, tgt = dm.lengths["train"]
    rows, results = [], []
    given = dm.settings  # the samplers read dm.settings.batches: its max_tokens and length_buckets
    for max_tokens in args.max_tokens:
        dm.settings = replace(given, batches=replace(given.batches, max_tokens=max_tokens))
        plain = dm.batch_sampler("train", buckets=False).global_batches()
        plain_padding = dm.train_padding_fraction()
        rows.append([max_tokens, "none", plain_padding, 0.0, distinct_shapes(plain, src, tgt), len(plain)])
        for name, lengths in lists.items():
            buckets = LengthBuckets.parse(lengths)
            dm.settings = replace(
                given, batches=replace(given.batches, max_tokens=max_tokens, length_buckets=buckets)
            )
            batches = dm.batch_sampler("train").global_batches()
            padding, fillers, shapes = bucketed_padding(batches, src, tgt, buckets, max_tokens)
            rows.append([max_tokens, name, padding, fillers, shapes, len(batches)])
            results.append(
                {"max_tokens": max_tokens, "buckets": lengths, "padding": padding, "filler_rows": fillers,
                 "shapes": shapes, "batches": len(batches), "padding_without": plain_padding}
            )  # fmt: skip
    for name, lengths in lists.items():
        print(f"{name}: {lengths}")
    print_table(["max_tokens", "buckets", "padding", "filler rows", "shapes", "batches"], rows)
    write_json(args.json, {"training_pairs": len(src), "results": results})


if __name__ == "__main__":
    main()
