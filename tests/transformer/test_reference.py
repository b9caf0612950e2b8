"""Our Transformer against torch.nn.Transformer with the same weights (a reference we did not write)."""

import pytest
import torch
from torch import nn

from tests.transformer.helpers import PAD, random_tokens, tiny_model
from transformer import Transformer


def _copy_mha(dst: nn.MultiheadAttention, src) -> None:
    dst.in_proj_weight.copy_(src.in_proj.weight)
    dst.in_proj_bias.copy_(src.in_proj.bias)
    dst.out_proj.weight.copy_(src.out_proj.weight)
    dst.out_proj.bias.copy_(src.out_proj.bias)


def _copy_ffn(dst, ffn) -> None:
    dst.linear1.load_state_dict(ffn.linear1.state_dict())
    dst.linear2.load_state_dict(ffn.linear2.state_dict())


def reference_from(model: Transformer) -> nn.Transformer:
    cfg = model.cfg
    ref = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.n_heads,
        num_encoder_layers=cfg.n_encoder_layers,
        num_decoder_layers=cfg.n_decoder_layers,
        dim_feedforward=cfg.d_ff,
        dropout=cfg.dropout,
        activation=cfg.activation,
        layer_norm_eps=cfg.layer_norm_eps,
        batch_first=True,
        norm_first=cfg.norm_first,
    )
    with torch.no_grad():
        for ours, theirs in zip(model.encoder.layers, ref.encoder.layers, strict=True):
            _copy_mha(theirs.self_attn, ours.self_attn)
            _copy_ffn(theirs, ours.ffn)
            theirs.norm1.load_state_dict(ours.attn_sub.norm.state_dict())
            theirs.norm2.load_state_dict(ours.ffn_sub.norm.state_dict())
        for ours, theirs in zip(model.decoder.layers, ref.decoder.layers, strict=True):
            _copy_mha(theirs.self_attn, ours.self_attn)
            _copy_mha(theirs.multihead_attn, ours.cross_attn)
            _copy_ffn(theirs, ours.ffn)
            theirs.norm1.load_state_dict(ours.self_sub.norm.state_dict())
            theirs.norm2.load_state_dict(ours.cross_sub.norm.state_dict())
            theirs.norm3.load_state_dict(ours.ffn_sub.norm.state_dict())
    if cfg.norm_first:
        ref.encoder.norm.load_state_dict(model.encoder.final_norm.state_dict())
        ref.decoder.norm.load_state_dict(model.decoder.final_norm.state_dict())
    else:  # nn.Transformer always adds a final LayerNorm; the post-LN paper model has none.
        ref.encoder.norm = None
        ref.decoder.norm = None
    return ref.eval()


@pytest.mark.filterwarnings("ignore:.*nested tensor:UserWarning")
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_matches_torch_nn_transformer(norm_first, activation):
    model = tiny_model(norm_first, activation=activation)
    ref = reference_from(model)
    src = random_tokens(3, 7, 37)
    src[0, 5:] = PAD
    src[2, 2:] = PAD
    tgt = random_tokens(3, 6, 41)
    src_pad = src == PAD
    with torch.no_grad():
        ours = model(src, tgt)
        out = ref(
            model.src_pos(model.src_embed(src)),
            model.tgt_pos(model.tgt_embed(tgt)),
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(6),
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
        )
        theirs = model.output(out)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
