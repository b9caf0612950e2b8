"""Cross-attention as pictures: which source subword each output subword looked at.

Any mechanism's weights (``transformer/mechanisms.py``): softmax's, linear attention's and the
Performer's normalised φ(q)·φ(k) rows, Linformer's implied weights P·F. A model whose encoder
self-attention is not softmax also gets that, as the pattern its mechanism attends over (local,
atrous, sparse, LSH) or implies (linear, Performer, Linformer, Nyström), source across and down.

The drawing is ``common.attention_plot``'s (training draws the same heatmaps); this module picks
the sentences and asks the translator for their weights.
"""

from __future__ import annotations

from common.attention_plot import plot_cross_attention
from translation.translator import Translation, Translator


def write_attention(
    translator: Translator,
    sources: list[list[int]],
    results: list[list[Translation]],
    out_dir: str,
    per_head: bool,
    max_sentences: int,
) -> int:
    """Heatmaps of the best translation's cross-attention for the first ``max_sentences`` non-empty lines,
    and, where the encoder's self-attention is not softmax, of that (``line{N}.encoder.layer{L}.png``).

    Args:
        translator: the translator that produced ``results``.
        sources: source ids per line, from ``translator.encode_sources``.
        results: per line, its translations (best first; empty for an empty line).
        out_dir: where ``line{N}.layer{L}.png`` (and ``.heads.png``) go; created if missing.
        per_head: also one panel per head.
        max_sentences: how many lines to plot.

    Returns:
        The number of files written.
    """
    width = len(str(len(results)))
    written = 0
    chosen = [i for i, hyps in enumerate(results) if hyps][:max_sentences]
    for i in chosen:
        best = results[i][0]
        weights = translator.cross_attention(sources[i], best.tokens)
        src_labels = translator.src_tokenizer.id_to_piece(sources[i] + [translator.eos_id])
        out_labels = translator.tgt_tokenizer.id_to_piece(best.tokens + [translator.eos_id])
        stem = f"line{i + 1:0{width}d}"
        written += len(plot_cross_attention(weights, src_labels, out_labels, out_dir, stem, per_head))
        if translator.first_model.cfg.attention.encoder_self != "softmax":
            encoder = translator.encoder_attention(sources[i])
            written += len(
                plot_cross_attention(encoder, src_labels, src_labels, out_dir, f"{stem}.encoder", per_head)
            )
    return written
