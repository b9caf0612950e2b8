"""Properties of the whole model: causality, padding, cached decoding, batch invariance."""

import pytest
import torch
import torch.nn.functional as F

from decoding.state import CachedDecoder
from fastpaths.cpu import for_cpu_inference
from tests.transformer.helpers import PAD, random_tokens, tiny_config, tiny_model
from transformer import Transformer

LN_MODES = pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])


@LN_MODES
def test_changing_a_later_target_token_leaves_earlier_outputs_unchanged(norm_first, prepare):
    model = prepare(tiny_model(norm_first))
    src = random_tokens(2, 6, 37)
    tgt = random_tokens(2, 8, 41)
    base = model(src, tgt)
    for t in range(7):
        changed = tgt.clone()
        changed[:, t + 1 :] = random_tokens(2, 8 - t - 1, 41)
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=1e-5)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


@LN_MODES
def test_source_and_target_padding_do_not_change_real_positions(norm_first, prepare):
    model = prepare(tiny_model(norm_first))
    src = random_tokens(2, 5, 37)
    tgt = random_tokens(2, 4, 41)
    padded_src = torch.cat([src, torch.full((2, 3), PAD)], dim=1)
    padded_tgt = torch.cat([tgt, torch.full((2, 2), PAD)], dim=1)
    ref = model(src, tgt)
    torch.testing.assert_close(model(padded_src, tgt), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(padded_src, padded_tgt)[:, :4], ref, atol=1e-5, rtol=1e-5)
    memory, _ = model.encode(src)
    padded_memory, _ = model.encode(padded_src)
    torch.testing.assert_close(padded_memory[:, :5], memory, atol=1e-5, rtol=1e-5)


@LN_MODES
def test_result_does_not_depend_on_batch_neighbours(norm_first, prepare):
    model = prepare(tiny_model(norm_first))
    lengths = [3, 7, 5]
    srcs = [random_tokens(1, n, 37) for n in lengths]
    tgt = random_tokens(3, 6, 41)
    batch = torch.full((3, 7), PAD)
    for i, s in enumerate(srcs):
        batch[i, : s.size(1)] = s
    together = model(batch, tgt)
    for i, s in enumerate(srcs):
        torch.testing.assert_close(model(s, tgt[i : i + 1])[0], together[i], atol=1e-5, rtol=1e-5)


@LN_MODES
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("capacity", [2, 64], ids=["cache-grows", "cache-fits"])
@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "no-grad-packed"])
def test_incremental_decoding_equals_full_prefix(norm_first, group, capacity, inference):
    """Self-attention K/V cache + cross-attention K/V computed once == decoder on the whole prefix.

    ``group`` rows share each source (as beams do); rows are also reordered and a source is
    dropped half-way, the way beam search uses the caches; a cache sized for 2 steps must grow.
    ``no-grad-packed`` is the searches' path (packed weights, caches copied into spare storage).
    """
    model = tiny_model(norm_first)
    if inference:
        for_cpu_inference(model)
    with torch.set_grad_enabled(not inference):
        _check_incremental_decoding(model, group, capacity)


def _check_incremental_decoding(model, group, capacity):
    src = random_tokens(3, 6, 37)
    src[1, 4:] = PAD
    tgt = random_tokens(3 * group, 9, 41)
    memory, src_mask = model.encode(src)
    decoder = CachedDecoder(model)
    state = decoder.start(src, max_steps=capacity)
    rows_src = torch.arange(3).repeat_interleave(group)  # source of each row
    for t in range(9):
        step_logits = model.logits(decoder.step(tgt[:, t], state))
        full, _ = model.decode(tgt[:, : t + 1], memory[rows_src], src_mask[rows_src])
        torch.testing.assert_close(step_logits, full[:, -1], atol=1e-5, rtol=1e-5)
        if t == 3:  # reverse the rows inside each group
            order = torch.arange(3 * group).view(3, group).flip(1).reshape(-1)
            state.select(order)
            tgt, rows_src = tgt[order], rows_src[order]
        elif t == 5:  # drop source 1 and its rows
            keep_src = torch.tensor([0, 2])
            keep_rows = (keep_src[:, None] * group + torch.arange(group)).reshape(-1)
            state.select(keep_rows, keep_src)
            tgt, rows_src = tgt[keep_rows], rows_src[keep_rows]
        else:  # as beams do: each row continues some row of its group, some twice
            n_src = tgt.size(0) // group
            pick = torch.randint(0, group, (n_src, group), generator=torch.Generator().manual_seed(t))
            order = (torch.arange(n_src)[:, None] * group + pick).reshape(-1)
            state.select(order)
            tgt, rows_src = tgt[order], rows_src[order]


def test_tied_embeddings_share_one_matrix_and_count_once():
    shared = Transformer(tiny_config(src_vocab_size=41, share_embeddings=True, tie_output=True))
    untied = Transformer(tiny_config(src_vocab_size=41, share_embeddings=False, tie_output=False))
    assert shared.src_embed.weight is shared.tgt_embed.weight is shared.output.weight
    assert untied.num_parameters() - shared.num_parameters() == 2 * 41 * 32


def test_learned_positions_and_gelu_train():
    model = Transformer(tiny_config(positional="learned", activation="gelu", dropout=0.0)).train()
    layers = [*model.encoder.layers, *model.decoder.layers]
    assert all(isinstance(layer.ffn.activation, torch.nn.GELU) for layer in layers)
    src, tgt = random_tokens(2, 5, 37), random_tokens(2, 5, 41)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt_out)

    first = loss()
    first.backward()
    # One trained vector per position: the positions used (5 source, 4 target) get gradients,
    # the others none.
    for pos, used in ((model.src_pos, 5), (model.tgt_pos, 4)):
        assert pos.table.grad is not None
        assert (pos.table.grad[:used].abs().sum(dim=1) > 0).all()
        assert not pos.table.grad[used:].any()
    tables = model.src_pos.table.detach().clone(), model.tgt_pos.table.detach().clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(20):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert loss().item() < 0.5 * first.item()  # it learns the batch
    assert not torch.equal(model.src_pos.table, tables[0]) and not torch.equal(model.tgt_pos.table, tables[1])


def test_too_long_input_is_a_clear_error():
    model = tiny_model(max_positions=8)
    with pytest.raises(ValueError, match="max_positions=8"):
        model.encode(random_tokens(1, 9, 37))


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="not divisible"):
        tiny_config(d_model=30)
    with pytest.raises(ValueError, match="one vocabulary"):
        tiny_config(share_embeddings=True)


def test_config_round_trips_through_plain_dict():
    cfg = tiny_config(norm_first=True)
    assert type(cfg).from_dict(cfg.to_dict()) == cfg


def test_parameter_names_are_the_checkpoints():
    """The names every checkpoint so far holds its weights under (with ``model.`` before them):
    renaming one would make the checkpoints written before unloadable without a key mapping."""
    names = set(tiny_model(n_encoder_layers=1, n_decoder_layers=1, tie_output=False).state_dict())
    attention = {"in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias"}
    ffn = {"ffn.linear1.weight", "ffn.linear1.bias", "ffn.linear2.weight", "ffn.linear2.bias"}
    norms = lambda *subs: {f"{s}.norm.{p}" for s in subs for p in ("weight", "bias")}  # noqa: E731
    encoder = {f"self_attn.{n}" for n in attention} | ffn | norms("attn_sub", "ffn_sub")
    decoder = {f"{a}.{n}" for a in ("self_attn", "cross_attn") for n in attention} | ffn
    decoder |= norms("self_sub", "cross_sub", "ffn_sub")
    assert names == (
        {"src_embed.table.weight", "tgt_embed.table.weight", "output.weight"}
        | {f"encoder.layers.0.{n}" for n in encoder}
        | {f"decoder.layers.0.{n}" for n in decoder}
    )
