"""Our weights as a Hugging Face ``transformers.MarianMTModel``, and its tokenizer files.

Marian is a post-LN encoder-decoder Transformer like ours, with sinusoidal positions, embeddings
scaled by sqrt(d_model) and an output layer that may be tied to the target embedding, so each of
our tensors has a place: separate q/k/v projections (our ``in_proj`` rows split in three), the
embeddings (``shared`` for a joint vocabulary), and each sub-layer's LayerNorm.

One difference is in the positions. ``transformers`` does not save Marian's position table; it
rebuilds it on loading, with the sines of each frequency in the first half of the features and
the cosines in the second, where ours interleaves them (sine at feature ``2i``, cosine at
``2i + 1``). Features of the residual stream may be permuted freely (LayerNorm and every linear map
on the stream commute with a permutation applied to all of them alike), so the export permutes
ours into Marian's order: feature ``k`` of Marian is feature ``PERM[k]`` of ours, ``PERM = [0, 2,
4, ..., 1, 3, 5, ...]``, in the embeddings, every projection that reads or writes the stream, and
every LayerNorm. The exported model then computes the same function with Marian's own table.

``MarianTokenizer`` reads ``source.spm`` and ``target.spm`` (SentencePiece models),
``vocab.json`` (piece -> id; ``target_vocab.json`` too for separate vocabularies) and
``tokenizer_config.json``; it appends ``</s>`` to each source, as ours does.
``transformers`` is imported inside the functions: it is an optional extra (``.[export]``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from transformer import Transformer
from translation.checkpoint import InferenceCheckpoint


def unsupported(model: Transformer) -> str:
    """Why ``model`` has no Marian equivalent; '' when it has one."""
    cfg = model.cfg
    if cfg.norm_first:
        return "Marian is post-LN only and this model is pre-LN (norm_first)"
    if cfg.positional != "sinusoidal":
        return "Marian's positions are sinusoidal and this model's are learned"
    if cfg.d_model % 2:
        return f"Marian's sinusoidal table needs an even d_model, not {cfg.d_model}"
    if cfg.layer_norm_eps != 1e-5:
        return f"Marian's LayerNorms use eps 1e-5, this model {cfg.layer_norm_eps}"
    return ""


def marian_permutation(d_model: int) -> Tensor:
    """PERM: feature ``k`` of Marian's residual stream is feature ``PERM[k]`` of ours. [d_model] long."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def to_marian(model: Transformer, bos_id: int, eos_id: int):  # noqa: ANN201
    """A ``transformers.MarianMTModel`` (eval mode, float32) computing the same function as ``model``.

    Args:
        model: the Transformer (post-LN, sinusoidal positions).
        bos_id: the decoder's start token (Marian's ``decoder_start_token_id``).
        eos_id: the end-of-sentence token.

    Raises:
        ValueError: the model has no Marian equivalent (see :func:`unsupported`).
    """
    from transformers import MarianMTModel

    reason = unsupported(model)
    if reason:
        raise ValueError(reason)
    hf = MarianMTModel(marian_config(model, bos_id, eos_id)).eval()
    with torch.no_grad():
        _copy_weights(hf, model, marian_permutation(model.cfg.d_model))
    return hf


def marian_config(model: Transformer, bos_id: int, eos_id: int):  # noqa: ANN201
    """The ``transformers.MarianConfig`` of ``model``'s sizes, dropouts and special ids."""
    from transformers import MarianConfig

    cfg = model.cfg
    return MarianConfig(
        vocab_size=cfg.src_vocab_size,
        decoder_vocab_size=cfg.tgt_vocab_size,
        share_encoder_decoder_embeddings=cfg.share_embeddings,
        tie_word_embeddings=cfg.tie_output,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation,
        max_position_embeddings=cfg.max_positions,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        scale_embedding=True,
        pad_token_id=cfg.pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        decoder_start_token_id=bos_id,
        forced_eos_token_id=None,
    )


def _copy_weights(hf, model: Transformer, perm: Tensor) -> None:  # noqa: ANN001
    """Every tensor of ``model`` into its place in the Marian model ``hf``, the residual stream's
    features permuted by ``perm`` (see the module docstring)."""
    encoder, decoder = hf.model.encoder, hf.model.decoder
    encoder.embed_tokens.weight.copy_(model.src_embed.weight[:, perm])
    decoder.embed_tokens.weight.copy_(model.tgt_embed.weight[:, perm])  # the same tensor when shared
    hf.lm_head.weight.copy_(model.output.weight[:, perm])  # the same tensor when tied
    hf.final_logits_bias.zero_()
    for dst, src in zip(encoder.layers, model.encoder.layers, strict=True):
        _attention(dst.self_attn, src.self_attn, perm)
        _norm(dst.self_attn_layer_norm, src.attn_sub.norm, perm)
        _ffn(dst, src, perm)
        _norm(dst.final_layer_norm, src.ffn_sub.norm, perm)
    for dst, src in zip(decoder.layers, model.decoder.layers, strict=True):
        _attention(dst.self_attn, src.self_attn, perm)
        _norm(dst.self_attn_layer_norm, src.self_sub.norm, perm)
        _attention(dst.encoder_attn, src.cross_attn, perm)
        _norm(dst.encoder_attn_layer_norm, src.cross_sub.norm, perm)
        _ffn(dst, src, perm)
        _norm(dst.final_layer_norm, src.ffn_sub.norm, perm)


def _stream_in(dst: nn.Linear, src_weight: Tensor, src_bias: Tensor | None, perm: Tensor) -> None:
    """A map that reads the stream: its input features permuted."""
    dst.weight.copy_(src_weight[:, perm])
    if src_bias is not None:
        dst.bias.copy_(src_bias)


def _stream_out(dst: nn.Linear, src: nn.Linear, perm: Tensor) -> None:
    """A map that writes the stream: its output features permuted."""
    dst.weight.copy_(src.weight[perm])
    dst.bias.copy_(src.bias[perm])


def _attention(dst, src, perm: Tensor) -> None:  # noqa: ANN001
    """Our packed ``in_proj`` rows split into Marian's q, k and v projections; ``out_proj``."""
    d = perm.numel()
    w, b = src.in_proj.weight, src.in_proj.bias
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        _stream_in(getattr(dst, name), w[i * d : (i + 1) * d], b[i * d : (i + 1) * d], perm)
    _stream_out(dst.out_proj, src.out_proj, perm)


def _ffn(dst, src, perm: Tensor) -> None:  # noqa: ANN001
    _stream_in(dst.fc1, src.ffn.linear1.weight, src.ffn.linear1.bias, perm)
    _stream_out(dst.fc2, src.ffn.linear2, perm)


def _norm(dst: nn.LayerNorm, src: nn.LayerNorm, perm: Tensor) -> None:
    dst.weight.copy_(src.weight[perm])
    dst.bias.copy_(src.bias[perm])


def write_huggingface(checkpoint: InferenceCheckpoint, out_dir: str | Path) -> Path:
    """Writes a folder that ``MarianMTModel`` and ``MarianTokenizer.from_pretrained`` load.

    ``config.json``, ``generation_config.json`` and ``model.safetensors`` (float32), then the
    tokenizer files: ``source.spm``, ``target.spm``, ``vocab.json`` (and ``target_vocab.json`` for
    separate vocabularies), ``tokenizer_config.json``. The model card is the caller's.

    Args:
        checkpoint: from :func:`translation.checkpoint.load_checkpoint`.
        out_dir: the folder, created if needed.

    Raises:
        ValueError: the model has no Marian equivalent (see :func:`unsupported`).
    """
    model = checkpoint.model.float()
    hf = to_marian(model, checkpoint.bos_id, checkpoint.eos_id)
    generation = hf.generation_config
    # translate.py's search where generate() has the same knob: the checkpoint's beam size (its
    # length penalty has another formula there: the card says so), outputs up to the model's
    # positions (generate's own default, 20 tokens in all, would cut sentences).
    generation.num_beams = checkpoint.search.beam_size
    generation.max_length = model.cfg.max_positions
    generation.decoder_start_token_id = checkpoint.bos_id
    generation.bos_token_id, generation.eos_token_id = checkpoint.bos_id, checkpoint.eos_id
    generation.pad_token_id = model.cfg.pad_id
    generation.forced_eos_token_id = None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)

    src, tgt = checkpoint.src_tokenizer, checkpoint.tgt_tokenizer
    separate = src is not tgt
    (out_dir / "source.spm").write_bytes(src.model_proto)
    (out_dir / "target.spm").write_bytes(tgt.model_proto)

    def write_vocabulary(name: str, tokenizer) -> None:  # noqa: ANN001
        pieces = tokenizer.id_to_piece(range(tokenizer.vocab_size))
        text = json.dumps({piece: i for i, piece in enumerate(pieces)}, ensure_ascii=False, indent=1)
        (out_dir / name).write_text(text + "\n", encoding="utf-8")

    write_vocabulary("vocab.json", src)
    if separate:
        write_vocabulary("target_vocab.json", tgt)
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": checkpoint.src_lang or None,
        "target_lang": checkpoint.tgt_lang or None,
        "unk_token": "<unk>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "model_max_length": model.cfg.max_positions,  # subwords + </s>, as translate.py crops
        "separate_vocabs": separate,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return out_dir
