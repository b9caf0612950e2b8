"""Alignment error rate of each decoder layer's cross-attention, on a hand-aligned sample.

    python bench/alignment_error.py --checkpoint runs/multi30k_de_en/<run>/checkpoints/averaged.ckpt

The sample (``tests/translation/data/alignment/``, its README says how it was made): 50 Multi30k
de→en pairs of test_2016_flickr with sure links between their whitespace-split words. The
checkpoint is *forced* to translate each German line into its English reference (one teacher-
forced pass, ``decoding.alignment.forced_attention``, as ``--score-references`` scores them), so
the links are over the reference's words, and every layer's alignment is read from that pass as
``translate.py --alignment-output`` reads it (``translation/alignment.py``). The alignment error
rate (Och and Ney 2003), with sure links S and possible links P (here P = S):

    AER = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|)

Two other readings of the same attention are printed beside ours, for the choices the module
docstring of ``translation/alignment.py`` makes: a source word's subwords averaged instead of
summed, and each output word read from the row where it is the decoder's *input* (Shift-Att,
Chen et al. 2020) instead of the row that predicts it. Nothing is timed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch import Tensor  # noqa: E402

from bench.harness import (  # noqa: E402
    ROOT,
    add_json_option,
    environment,
    print_config,
    print_table,
    set_threads,
    write_json,
)
from decoding.alignment import DEFAULT_LAYER, forced_attention, layer_index  # noqa: E402
from translation.alignment import Words, encoded_words, hard_alignment  # noqa: E402
from translation.translator import Translator  # noqa: E402

SAMPLE = ROOT / "tests" / "translation" / "data" / "alignment" / "de_en"

Links = set[tuple[int, int]]


def read_links(line: str) -> Links:
    """``"0-0 2-1"`` -> {(0, 0), (2, 1)}."""
    return {(int(i), int(j)) for i, j in (link.split("-") for link in line.split())}


def alignment_error_rate(
    predicted: Sequence[Links], sure: Sequence[Links], possible: Sequence[Links] | None = None
) -> float:
    """AER of a corpus (Och and Ney 2003): ``1 - (|A∩S| + |A∩P|) / (|A| + |S|)``, P ⊇ S (default S).

    Args:
        predicted: per sentence, the links A.
        sure, possible: per sentence, the gold sure links S and possible links P.
    """
    possible = sure if possible is None else possible
    a = sum(len(x) for x in predicted)
    s = sum(len(x) for x in sure)
    hits = sum(len(x & y) for x, y in zip(predicted, sure, strict=True))
    hits += sum(len(x & y) for x, y in zip(predicted, possible, strict=True))
    return 1.0 - hits / (a + s) if a + s else 0.0


def precision_recall(predicted: Sequence[Links], sure: Sequence[Links]) -> tuple[float, float]:
    """|A∩S| / |A| and |A∩S| / |S| over the corpus."""
    hits = sum(len(x & y) for x, y in zip(predicted, sure, strict=True))
    return hits / max(1, sum(map(len, predicted))), hits / max(1, sum(map(len, sure)))


def averaged_over_pieces(rows: Tensor, source: Words) -> Tensor:
    """``rows`` [T, S] with each source word's columns divided by its subword count: summed, they
    are the mean of its subwords' attention."""
    rows = rows.clone()
    for pieces in source.pieces:
        if pieces:
            rows[:, pieces] /= len(pieces)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, help="a de→en checkpoint of this project")
    parser.add_argument("--sample", default=str(SAMPLE), help="PREFIX of PREFIX.de, PREFIX.en, PREFIX.align")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target-lang", help="for a model of several target languages")
    add_json_option(parser, "alignment_error")
    args = parser.parse_args(argv)

    set_threads(args.threads)
    translator = Translator.from_checkpoint(args.checkpoint, target_lang=args.target_lang)
    sample = Path(args.sample)
    sources = sample.with_suffix(".de").read_text(encoding="utf-8").splitlines()
    references = sample.with_suffix(".en").read_text(encoding="utf-8").splitlines()
    gold = [
        read_links(line) for line in sample.with_suffix(".align").read_text(encoding="utf-8").splitlines()
    ]
    if not len(sources) == len(references) == len(gold):
        raise SystemExit(
            f"{sample}: {len(sources)} sources, {len(references)} references, {len(gold)} alignments"
        )

    limit = translator.max_source_tokens
    prefix = translator.src_prefix
    encoded = [encoded_words(translator.src_tokenizer, prefix + s, len(prefix), limit) for s in sources]
    forced = [encoded_words(translator.tgt_tokenizer, r, 0, limit) for r in references]
    n_layers = translator.first_model.cfg.n_decoder_layers
    layers = list(range(1, n_layers + 1))
    attention = forced_attention(
        translator.model,
        [(ids, target) for (ids, _), (target, _) in zip(encoded, forced, strict=True)],
        translator.bos_id,
        translator.eos_id,
        layers,
        max_tokens=3072,
    )

    default = layer_index(n_layers, DEFAULT_LAYER) + 1
    config = {
        "checkpoint": args.checkpoint,
        "sample": str(sample),
        "pairs": len(gold),
        "sure links": sum(map(len, gold)),
        "decoder layers": n_layers,
        **environment(args.threads),
    }
    print_config("alignment error rate per decoder layer (forced to the references)", config)
    rows, figures = [], []
    for k, layer in enumerate(layers):
        ours, averaged, shifted = [], [], []
        for a, (_, source), (_, output) in zip(attention, encoded, forced, strict=True):
            predicting = a[k, :-1]  # (T, S+1): the rows that predict each reference subword
            ours.append(set(hard_alignment(predicting, source, output)))
            averaged.append(set(hard_alignment(averaged_over_pieces(predicting, source), source, output)))
            shifted.append(set(hard_alignment(a[k, 1:], source, output)))
        aer = alignment_error_rate(ours, gold)
        precision, recall = precision_recall(ours, gold)
        figure = {
            "layer": layer,
            "aer": aer,
            "precision": precision,
            "recall": recall,
            "aer_source_pieces_averaged": alignment_error_rate(averaged, gold),
            "aer_shift_att": alignment_error_rate(shifted, gold),
        }
        figures.append(figure)
        rows.append(
            [
                f"{layer}{' (default)' if layer == default else ''}",
                f"{aer:.3f}",
                f"{precision:.3f}",
                f"{recall:.3f}",
                f"{figure['aer_source_pieces_averaged']:.3f}",
                f"{figure['aer_shift_att']:.3f}",
            ]
        )
    print_table(
        ["layer", "AER", "precision", "recall", "AER, subwords averaged", "AER, Shift-Att rows"], rows
    )
    best = min(figures, key=lambda f: f["aer"])
    print(
        f"best layer: {best['layer']} of {n_layers} (AER {best['aer']:.3f}); the default is layer {default}"
    )
    write_json(args.json, {"config": config, "layers": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
