"""How much longer subword regularisation makes the training sentences, per setting.

``data.spm_sampling_alpha`` and ``data.spm_sampling_nbest`` (conf/data/multi30k.yaml) segment each
training batch afresh by SentencePiece's sampling (:mod:`data.sampling`). A sampled segmentation is
mostly longer than the best one, and a batch is planned from the best's lengths, so the ratio
printed here is what each batch's tokens grow by beyond ``data.max_tokens``. The text is the
training split's first ``--lines`` pairs, both sides, encoded with the project's tokenizer as a run
encodes it (``SubwordTokenizer.sample_encode``, seeded).

Usage:
    python3 bench/sampling_lengths.py                       # the newest Multi30k run's model
    python3 bench/sampling_lengths.py --model runs/multi30k_de_en/<run>/tokenizer/joint.model

Not a test: nothing here runs in CI. Results: BENCHMARKS.md, "The recipe fitted to a budget".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as `python bench/x.py`
from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    add_json_option,
    environment,
    find_spm_model,
    print_config,
    print_table,
    read_gz_lines,
    write_json,
)
from data.tokenizer import SubwordTokenizer  # noqa: E402

# (alpha, nbest): SentencePiece's documented settings (all segmentations at 0.1, 0.2, 0.5) and
# Kudo's (2018) best for small corpora (the 64 best at 0.1), with 0.2 beside it.
SETTINGS = ((0.1, -1), (0.2, -1), (0.5, -1), (0.1, 64), (0.2, 64))


def pieces(tokenizer: SubwordTokenizer, texts: list[str], alpha: float | None, nbest: int) -> int:
    """The pieces ``texts`` make: best segmentation (``alpha`` None) or sampled (seed 0)."""
    ids = tokenizer.encode(texts) if alpha is None else tokenizer.sample_encode(texts, alpha, nbest, seed=0)
    return sum(map(len, ids))


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", type=Path, default=None, help="SentencePiece model (default: a run's)")
    parser.add_argument("--data-dir", type=Path, default=MULTI30K_DIR, help="Multi30k files")
    parser.add_argument("--langs", nargs=2, default=("de", "en"), help="the two sides")
    parser.add_argument("--lines", type=int, default=5000, help="training pairs read")
    add_json_option(parser, "sampling_lengths")
    args = parser.parse_args()
    model = args.model or find_spm_model()
    if model is None or not Path(model).is_file():
        sys.exit("no SentencePiece model: give --model (a run's tokenizer/joint.model)")
    tokenizer = SubwordTokenizer(Path(model).read_bytes())
    texts = {lang: read_gz_lines(args.data_dir / f"train.{lang}.gz")[: args.lines] for lang in args.langs}
    print_config("sampling_lengths", {**environment(1), "model": str(model), "lines": args.lines})
    best = {lang: pieces(tokenizer, t, None, -1) for lang, t in texts.items()}
    rows, records = [], []
    for alpha, nbest in SETTINGS:
        ratios = {lang: pieces(tokenizer, t, alpha, nbest) / best[lang] for lang, t in texts.items()}
        rows.append([alpha, nbest, *(f"{r:.2f}x" for r in ratios.values())])
        records.append({"alpha": alpha, "nbest": nbest, "ratio": ratios})
    print_table(["alpha", "nbest", *(f"{lang} pieces" for lang in args.langs)], rows)
    if args.json:
        write_json(args.json, {"model": str(model), "best_pieces": best, "settings": records})


if __name__ == "__main__":
    main()
