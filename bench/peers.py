"""Our weights in the peers' models: a CTranslate2 ``TransformerSpec`` and a Hugging Face ``MarianMTModel``.

Both peers are post-LN encoder-decoder Transformers like ours, so each of our tensors has a place:

* CTranslate2 (its Python spec API, ``ctranslate2.specs.TransformerSpec.from_config``): fused
  QKV (``linear[0]``) and output (``linear[1]``) in self-attention; Q (``linear[0]``), fused KV
  (``linear[1]``) and output (``linear[2]``) in cross-attention -- the row layout of our
  ``in_proj``; the LayerNorm of each sub-layer; embeddings scaled by sqrt(d_model); and our exact
  sinusoidal table as ``position_encodings.encodings`` (position 0 first). Tokens are strings in
  CTranslate2: id ``i`` is ``"w{i}"`` except the special ids 0-3 (``<blank>``, ``<unk>``, ``<s>``,
  ``</s>``).
* Marian (``transformers``): separate q/k/v projections (our ``in_proj`` rows split in three), the
  shared embedding, ``lm_head`` tied to it, and our sinusoidal table copied over Marian's own
  (which puts the sines in the first half and the cosines in the second, not interleaved).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from transformer import Transformer

SPECIALS = ["<blank>", "<unk>", "<s>", "</s>"]  # ids 0-3: pad, unk, bos, eos


def ct2_vocabulary(size: int) -> list[str]:
    return SPECIALS + [f"w{i}" for i in range(len(SPECIALS), size)]


def ids_to_ct2(ids: list[int]) -> list[str]:
    return [SPECIALS[i] if i < len(SPECIALS) else f"w{i}" for i in ids]


def ct2_to_ids(tokens: list[str]) -> list[int]:
    return [SPECIALS.index(t) if t in SPECIALS else int(t[1:]) for t in tokens]


def _np(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def _linear(spec, weight: Tensor, bias: Tensor | None) -> None:  # noqa: ANN001
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec, norm: nn.LayerNorm) -> None:  # noqa: ANN001
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def to_ctranslate2(model: Transformer, out_dir: str | Path) -> Path:
    """Writes ``model`` as a CTranslate2 model directory (float32) and returns its path."""
    import ctranslate2
    from ctranslate2.specs import common_spec

    cfg = model.cfg
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
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = SPECIALS[1:4]
    spec.config.decoder_start_token = SPECIALS[2]  # BOS starts the decoder, as ours
    spec.register_source_vocabulary(ct2_vocabulary(cfg.src_vocab_size))
    spec.register_target_vocabulary(ct2_vocabulary(cfg.tgt_vocab_size))
    spec.validate()
    spec.optimize(quantization="float32")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    return out_dir


def to_marian(model: Transformer, bos_id: int, eos_id: int):  # noqa: ANN201
    """A ``transformers.MarianMTModel`` (eval mode) computing the same function as ``model``."""
    from transformers import MarianConfig, MarianMTModel

    cfg = model.cfg
    if not cfg.share_embeddings or not cfg.tie_output:
        raise ValueError("to_marian supports shared source/target embeddings tied to the output layer")
    config = MarianConfig(
        vocab_size=cfg.tgt_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation,
        max_position_embeddings=cfg.max_positions,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        pad_token_id=cfg.pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        decoder_start_token_id=bos_id,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    hf = MarianMTModel(config).eval()
    d = cfg.d_model
    with torch.no_grad():
        hf.model.shared.weight.copy_(model.src_embed.weight)
        hf.lm_head.weight = hf.model.shared.weight
        hf.model.encoder.embed_tokens.weight = hf.model.shared.weight
        hf.model.decoder.embed_tokens.weight = hf.model.shared.weight
        hf.final_logits_bias.zero_()
        hf.model.encoder.embed_positions.weight.copy_(model.src_pos.table)
        hf.model.decoder.embed_positions.weight.copy_(model.tgt_pos.table)

        def attention(dst, src, q_from_rows: bool = True) -> None:  # noqa: ANN001
            w, b = src.in_proj.weight, src.in_proj.bias
            for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
                getattr(dst, name).weight.copy_(w[i * d : (i + 1) * d])
                getattr(dst, name).bias.copy_(b[i * d : (i + 1) * d])
            dst.out_proj.weight.copy_(src.out_proj.weight)
            dst.out_proj.bias.copy_(src.out_proj.bias)

        def ffn(dst, src) -> None:  # noqa: ANN001
            dst.fc1.weight.copy_(src.ffn.linear1.weight)
            dst.fc1.bias.copy_(src.ffn.linear1.bias)
            dst.fc2.weight.copy_(src.ffn.linear2.weight)
            dst.fc2.bias.copy_(src.ffn.linear2.bias)

        def norm(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)

        for dst, src in zip(hf.model.encoder.layers, model.encoder.layers, strict=True):
            attention(dst.self_attn, src.self_attn)
            norm(dst.self_attn_layer_norm, src.attn_sub.norm)
            ffn(dst, src)
            norm(dst.final_layer_norm, src.ffn_sub.norm)
        for dst, src in zip(hf.model.decoder.layers, model.decoder.layers, strict=True):
            attention(dst.self_attn, src.self_attn)
            norm(dst.self_attn_layer_norm, src.self_sub.norm)
            attention(dst.encoder_attn, src.cross_attn)
            norm(dst.encoder_attn_layer_norm, src.cross_sub.norm)
            ffn(dst, src)
            norm(dst.final_layer_norm, src.ffn_sub.norm)
    return hf
