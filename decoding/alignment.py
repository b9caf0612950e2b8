"""The cross-attention of given outputs, by forced decoding: what word alignments are read from.

A decoder layer's cross-attention, heads averaged, says which source subwords the decoder read
while it predicted each output subword:

    A[t, s] = (1/H) sum_h softmax_s(q_t^h · k_s^h / sqrt(d_head)),   rows t over BOS y_1 .. y_T

Row ``t`` is the query at decoder input ``t`` (BOS first), so it is the attention *while
predicting* output token ``t`` (0-based; the last row, predicting EOS). The outputs are given:
a search's finished hypotheses (``translation.Translator.align``) or a reference translation
(``bench/alignment_error.py``), teacher-forced in one parallel pass, as fairseq's
``SequenceGeneratorWithAlignment`` does with ``forward_align``. The search is never touched, so
a translation is the same bytes with or without its alignment, and the cost is one pass over the
outputs kept, without the output projection. An ensemble's attention is the weighted mean of
its members' (fairseq averages its members' too).

Layers are counted from 1 as the attention plots count them; a negative layer counts from the
end (-1 is the last). :data:`DEFAULT_LAYER` is the layer that aligned best on a hand-aligned
sample (BENCHMARKS.md, "Word alignment").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from data.batching import longest_first_batches
from decoding.ensemble import Ensemble, members_of
from transformer import Transformer

# The last decoder layer: the lowest alignment error rate of the measured model's layers, the
# recipe's 3-layer decoder (BENCHMARKS.md, "Word alignment"; fairseq's default is the penultimate).
DEFAULT_LAYER = -1


def layer_index(n_layers: int, layer: int) -> int:
    """The 0-based index of decoder layer ``layer`` of ``n_layers`` (from 1; negative from the end).

    Raises:
        ValueError: 0, or a layer the decoder does not have, naming how many it has.
    """
    if layer == 0 or not -n_layers <= layer <= n_layers:
        raise ValueError(
            f"alignment layer {layer}: the decoder has {n_layers} layer{'s' if n_layers > 1 else ''}, "
            "counted from 1 (or from the end: -1 is the last)"
        )
    return layer - 1 if layer > 0 else n_layers + layer


def check_layers(model: Transformer | Ensemble, layers: Sequence[int]) -> None:
    """Refuses, naming it, a layer that a model (or an ensemble's member) does not have."""
    for member in members_of(model)[0]:
        for layer in layers:
            layer_index(member.cfg.n_decoder_layers, layer)


@torch.no_grad()
def cross_attention(
    model: Transformer | Ensemble, src: Tensor, tgt_in: Tensor, layers: Sequence[int]
) -> Tensor:
    """The cross-attention of decoder layers ``layers``, heads averaged, teacher-forced on ``tgt_in``.

    Args:
        model: in eval mode; an ``Ensemble`` gives its members' weighted mean.
        src: [batch, src_len] source ids with EOS, right-padded.
        tgt_in: [batch, tgt_len] BOS then the outputs, right-padded.
        layers: decoder layers from 1 (negative: from the end).

    Returns:
        [len(layers), batch, tgt_len, src_len] fp32; each row sums to 1 over the real source tokens.
    """
    models, weights = members_of(model)
    total: Tensor | None = None
    for member, weight in zip(models, weights, strict=True):
        per_layer = member.cross_attention_weights(src, tgt_in)  # per layer (B, H, T, S)
        n = len(per_layer)
        picked = torch.stack([per_layer[layer_index(n, layer)].float().mean(dim=1) for layer in layers])
        total = picked * weight if total is None else total.add_(picked, alpha=weight)
    assert total is not None
    return total  # (L, B, T, S)


def forced_attention(
    model: Transformer | Ensemble,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    bos_id: int,
    eos_id: int,
    layers: Sequence[int],
    max_tokens: int,
) -> list[Tensor]:
    """:func:`cross_attention` of each (source, output) pair, batched longest first.

    Args:
        model: in eval mode, on its device.
        pairs: source ids without EOS, output ids without BOS and EOS.
        bos_id, eos_id: the target's BOS and the EOS id.
        layers: decoder layers from 1 (negative: from the end).
        max_tokens: budget per batch of pairs * (longest source + longest output + 2).

    Returns:
        Per pair, on the CPU, [len(layers), len(output) + 1, len(source) + 1] fp32: row ``t``
        predicts output token ``t`` (the last row EOS), column ``s`` is source token ``s`` (the
        last column EOS).
    """
    device = next(model.parameters()).device
    pad_id = model.cfg.pad_id
    results: list[Tensor | None] = [None] * len(pairs)
    widths = [len(s) + len(o) + 2 for s, o in pairs]
    for batch in longest_first_batches(widths, max_tokens):
        src_len = max(len(pairs[i][0]) for i in batch) + 1
        tgt_len = max(len(pairs[i][1]) for i in batch) + 1
        src = torch.full((len(batch), src_len), pad_id, dtype=torch.long)
        tgt_in = torch.full((len(batch), tgt_len), pad_id, dtype=torch.long)
        for row, i in enumerate(batch):
            source, output = pairs[i]
            src[row, : len(source) + 1] = torch.tensor([*source, eos_id])
            tgt_in[row, : len(output) + 1] = torch.tensor([bos_id, *output])
        with torch.inference_mode():
            attention = cross_attention(
                model, src.to(device), tgt_in.to(device), layers
            ).cpu()  # (L, B, T, S)
        for row, i in enumerate(batch):
            source, output = pairs[i]
            results[i] = attention[:, row, : len(output) + 1, : len(source) + 1].clone()
    return [r for r in results if r is not None]
