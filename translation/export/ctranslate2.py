"""Our weights as a CTranslate2 model directory (``ctranslate2.specs.TransformerSpec``).

CTranslate2 runs post-LN and pre-LN encoder-decoder Transformers like ours, so each of our tensors
has a place in its Python spec API (``TransformerSpec.from_config``): fused QKV (``linear[0]``) and
output (``linear[1]``) in self-attention; Q (``linear[0]``), fused KV (``linear[1]``) and output
(``linear[2]``) in cross-attention, the row layout of our ``in_proj``; the LayerNorm of each
sub-layer; embeddings scaled by sqrt(d_model); and our exact position table (sinusoidal or
learned) as ``position_encodings.encodings``, position 0 first.

Tokens are strings in CTranslate2: the vocabulary is the SentencePiece pieces in id order (the
special ids 0-3 are ``<pad>``, ``<unk>``, ``<s>``, ``</s>``), and the model appends ``</s>`` to
each source itself (``add_source_eos``), so ``sp.encode(text, out_type=str)`` is its input as it
is. ``ctranslate2`` is imported inside the functions: it is an optional extra (``.[export]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch import Tensor, nn

from transformer import Transformer

# Weight types of ``--quantization`` (CTranslate2's names); float32 keeps the weights as they are.
QUANTIZATIONS = ("float32", "int8", "int8_float32", "float16")


def _np(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def _linear(spec, weight: Tensor, bias: Tensor | None) -> None:  # noqa: ANN001
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec, norm: nn.LayerNorm) -> None:  # noqa: ANN001
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def transformer_spec(model: Transformer, src_vocabulary: Sequence[str], tgt_vocabulary: Sequence[str]):  # noqa: ANN201
    """A validated ``ctranslate2.specs.TransformerSpec`` computing the same function as ``model``.

    Args:
        model: the Transformer (any dtype; the spec gets float32 copies of its weights).
        src_vocabulary: ``src_vocab_size`` source tokens, token ``i`` for id ``i``.
        tgt_vocabulary: ``tgt_vocab_size`` target tokens likewise; ids 1/2/3 must be
            ``<unk>``/``<s>``/``</s>``.

    Raises:
        ValueError: a vocabulary does not fit the model.
    """
    import ctranslate2
    from ctranslate2.specs import common_spec

    cfg = model.cfg
    for side, vocabulary, size in (
        ("source", src_vocabulary, cfg.src_vocab_size),
        ("target", tgt_vocabulary, cfg.tgt_vocab_size),
    ):
        if len(vocabulary) != size:
            raise ValueError(f"the {side} vocabulary has {len(vocabulary)} tokens, the model {size}")
        if list(vocabulary[1:4]) != ["<unk>", "<s>", "</s>"]:
            raise ValueError(
                f"the {side} vocabulary's ids 1-3 are {list(vocabulary[1:4])}, not <unk> <s> </s>"
            )
    activation = common_spec.Activation.RELU if cfg.activation == "relu" else common_spec.Activation.GELU
    spec = ctranslate2.specs.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm_first,
        activation=activation,
    )
    d = cfg.d_model
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _np(model.src_embed.weight)
    dec.embeddings.weight = _np(model.tgt_embed.weight)
    enc.scale_embeddings = dec.scale_embeddings = True  # x sqrt(d_model), as ours
    enc.position_encodings.encodings = _np(model.src_pos.table)
    dec.position_encodings.encodings = _np(model.tgt_pos.table)
    dec.projection.weight = _np(model.output.weight)
    if cfg.norm_first:
        _norm(enc.layer_norm, model.encoder.final_norm)
        _norm(dec.layer_norm, model.decoder.final_norm)
    for layer_spec, layer in zip(enc.layer, model.encoder.layers, strict=True):
        sa = layer.self_attn
        _linear(layer_spec.self_attention.linear[0], sa.in_proj.weight, sa.in_proj.bias)
        _linear(layer_spec.self_attention.linear[1], sa.out_proj.weight, sa.out_proj.bias)
        _norm(layer_spec.self_attention.layer_norm, layer.attn_sub.norm)
        _linear(layer_spec.ffn.linear_0, layer.ffn.linear1.weight, layer.ffn.linear1.bias)
        _linear(layer_spec.ffn.linear_1, layer.ffn.linear2.weight, layer.ffn.linear2.bias)
        _norm(layer_spec.ffn.layer_norm, layer.ffn_sub.norm)
    for layer_spec, layer in zip(dec.layer, model.decoder.layers, strict=True):
        sa, ca = layer.self_attn, layer.cross_attn
        _linear(layer_spec.self_attention.linear[0], sa.in_proj.weight, sa.in_proj.bias)
        _linear(layer_spec.self_attention.linear[1], sa.out_proj.weight, sa.out_proj.bias)
        _norm(layer_spec.self_attention.layer_norm, layer.self_sub.norm)
        _linear(layer_spec.attention.linear[0], ca.in_proj.weight[:d], ca.in_proj.bias[:d])
        _linear(layer_spec.attention.linear[1], ca.in_proj.weight[d:], ca.in_proj.bias[d:])
        _linear(layer_spec.attention.linear[2], ca.out_proj.weight, ca.out_proj.bias)
        _norm(layer_spec.attention.layer_norm, layer.cross_sub.norm)
        _linear(layer_spec.ffn.linear_0, layer.ffn.linear1.weight, layer.ffn.linear1.bias)
        _linear(layer_spec.ffn.linear_1, layer.ffn.linear2.weight, layer.ffn.linear2.bias)
        _norm(layer_spec.ffn.layer_norm, layer.ffn_sub.norm)
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<s>", "</s>"
    spec.config.decoder_start_token = "<s>"  # BOS starts the decoder, as ours
    spec.config.add_source_eos = True  # our sources end with EOS; SentencePiece pieces do not
    spec.register_source_vocabulary(list(src_vocabulary))
    spec.register_target_vocabulary(list(tgt_vocabulary))
    spec.validate()
    return spec


def to_ctranslate2(
    model: Transformer,
    out_dir: str | Path,
    src_vocabulary: Sequence[str],
    tgt_vocabulary: Sequence[str],
    quantization: str = "float32",
) -> Path:
    """Writes ``model`` as a CTranslate2 model directory and returns its path.

    Writes ``model.bin``, ``config.json`` and ``shared_vocabulary.json`` (or
    ``source_vocabulary.json`` and ``target_vocabulary.json`` when they differ) into ``out_dir``,
    created if needed.

    Args:
        model: the Transformer.
        out_dir: the model directory.
        src_vocabulary, tgt_vocabulary: see :func:`transformer_spec`.
        quantization: the saved weights' type, one of :data:`QUANTIZATIONS`; ``ctranslate2.Translator``
            computes in it by default (``compute_type="default"``).
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r}: one of {', '.join(QUANTIZATIONS)}")
    spec = transformer_spec(model, src_vocabulary, tgt_vocabulary)
    spec.optimize(quantization=quantization)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    return out_dir
