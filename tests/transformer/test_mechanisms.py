"""Every attention mechanism in the whole model: the config seam, causality, padding, decoding, training."""

import pytest
import torch
import torch.nn.functional as F

from bench.uncached import Recomputing
from decoding.kv_cache import KVCache
from decoding.search import beam_search, greedy_search
from decoding.state import CachedDecoder, new_state
from fastpaths.cpu import for_cpu_inference
from tests.transformer.helpers import (
    BOS,
    EOS,
    PAD,
    model_with_eos_bias,
    ragged_batch,
    random_tokens,
    tiny_model,
)
from tests.transformer.test_model import _check_incremental_decoding
from transformer import Transformer, TransformerConfig
from transformer.attention import SoftmaxAttention
from transformer.mechanisms import REFUSED, ROLES, AttentionConfig

# Small settings, so that the tiny model's short sequences cross windows, blocks and chunks.
MECHANISMS = {
    "linear": dict(encoder_self="linear", decoder_self="linear", cross="linear"),
    "performer": dict(encoder_self="performer", decoder_self="performer", cross="performer", features=16),
    "local": dict(encoder_self="local", decoder_self="local", window=3),
    "atrous": dict(encoder_self="atrous", decoder_self="atrous", window=2, dilation=2),
    "sparse": dict(encoder_self="sparse", decoder_self="sparse", window=2, stride=3),
    # Not causal: the decoder's self-attention is linear, so that no role is softmax.
    "linformer": dict(
        encoder_self="linformer", decoder_self="linear", cross="linformer", projected_length=4, max_length=16
    ),
    "nystrom": dict(encoder_self="nystrom", decoder_self="linear", cross="linear", landmarks=3),
    "lsh": dict(encoder_self="lsh", decoder_self="lsh", buckets=4, rounds=2, chunk_length=2),
    # Reformer's chunks are for the encoder only: the decoder's self-attention is linear.
    "lsh-chunks": dict(
        encoder_self="lsh", decoder_self="linear", lsh_window="chunks", buckets=4, rounds=2, chunk_length=2
    ),
}
EACH = pytest.mark.parametrize("attention", list(MECHANISMS.values()), ids=list(MECHANISMS))


# ------------------------------------------------------------------ the seam


def test_default_is_softmax_everywhere_and_old_checkpoints_load_as_softmax():
    cfg = tiny_model().cfg
    assert cfg.attention == AttentionConfig() and cfg.attention.is_softmax
    old = cfg.to_dict()
    del old["attention"]  # a checkpoint written before the setting existed
    assert TransformerConfig.from_dict(old).attention.is_softmax
    model = Transformer(cfg)
    for mha in [layer.self_attn for layer in model.encoder.layers] + [
        m for layer in model.decoder.layers for m in (layer.self_attn, layer.cross_attn)
    ]:
        assert type(mha.mechanism) is SoftmaxAttention
    assert all(type(new_state(layer.self_attn.mechanism, 8)) is KVCache for layer in model.decoder.layers)


@EACH
def test_config_round_trips_and_names_the_mechanism_of_each_role(attention):
    cfg = tiny_model(attention=attention).cfg
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert isinstance(cfg.to_dict()["attention"], dict)  # plain containers for weights_only loading
    model = Transformer(cfg)
    assert type(model.encoder.layers[0].self_attn.mechanism) is not SoftmaxAttention
    assert type(model.decoder.layers[0].self_attn.mechanism) is not SoftmaxAttention


@pytest.mark.parametrize(
    ("mechanism", "role"), [(m, r) for m, refused in REFUSED.items() for r in refused], ids=str
)
def test_a_role_a_mechanism_cannot_do_is_refused_naming_both(mechanism, role):
    with pytest.raises(ValueError, match=rf"attention\.{role}={mechanism} is not supported: \w+"):
        AttentionConfig(**{role: mechanism})


def test_unknown_mechanisms_settings_and_dropout_without_weights_are_refused():
    with pytest.raises(ValueError, match="unknown mechanism 'flash'"):
        AttentionConfig(cross="flash")
    with pytest.raises(ValueError, match="unknown setting"):
        AttentionConfig.from_dict({"windw": 3})
    with pytest.raises(ValueError, match="window must be at least 1"):
        AttentionConfig(window=0)
    with pytest.raises(ValueError, match="buckets must be 1 or even"):
        AttentionConfig(buckets=3)
    with pytest.raises(ValueError, match="lsh_window is one of sliding, chunks, not 'ring'"):
        AttentionConfig(lsh_window="ring")
    with pytest.raises(ValueError, match="lsh_window=chunks is for encoder_self"):
        AttentionConfig(encoder_self="lsh", decoder_self="lsh", lsh_window="chunks")
    with pytest.raises(ValueError, match="encoder_self=performer has no attention weights"):
        TransformerConfig(10, 10, attention_dropout=0.1, attention={"encoder_self": "performer"})
    assert set(ROLES) == {"encoder_self", "decoder_self", "cross"}


# ------------------------------------------------------------------ properties of the model


@EACH
def test_changing_a_later_target_token_leaves_earlier_outputs_unchanged(attention, prepare):
    model = prepare(tiny_model(attention=attention))
    src = random_tokens(2, 6, 37)
    tgt = random_tokens(2, 9, 41)
    base = model(src, tgt)
    for t in range(8):
        changed = tgt.clone()
        changed[:, t + 1 :] = random_tokens(2, 9 - t - 1, 41)
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


@EACH
def test_padding_and_batch_neighbours_do_not_change_a_sentence(attention, prepare):
    model = prepare(tiny_model(attention=attention))
    src = ragged_batch([7, 3, 5])
    tgt = random_tokens(3, 6, 41)
    together = model(src, tgt)
    for i, n in enumerate([7, 3, 5]):
        alone = model(src[i : i + 1, :n], tgt[i : i + 1])
        torch.testing.assert_close(alone[0], together[i], atol=1e-5, rtol=1e-5)
    padded_tgt = torch.cat([tgt, torch.full((3, 4), PAD)], dim=1)
    torch.testing.assert_close(model(src, padded_tgt)[:, :6], together, atol=1e-5, rtol=1e-5)


@EACH
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "no-grad-packed"])
def test_stateful_decoding_equals_full_prefix_with_beams_reordered(attention, group, inference):
    """The mechanism's decoding state, reordered and shrunk as beam search does, == recomputation."""
    model = tiny_model(attention=attention)
    if inference:
        for_cpu_inference(model)
    with torch.set_grad_enabled(not inference):
        _check_incremental_decoding(model, group, capacity=2)


@EACH
def test_greedy_and_beam_search_equal_recomputation(attention):
    torch.manual_seed(1)
    model = model_with_eos_bias_and(attention)
    src = ragged_batch([5, 8, 3, 6])
    assert greedy_search(model, src, BOS, EOS) == greedy_search(Recomputing(model), src, BOS, EOS)
    cached = beam_search(model, src, BOS, EOS, beam_size=3, nbest=3)
    recomputed = beam_search(Recomputing(model), src, BOS, EOS, beam_size=3, nbest=3)
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in recomputed]
    for a, b in zip(cached, recomputed, strict=True):
        torch.testing.assert_close(torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]))


SUMMARISING = ["linear", "performer", "linformer"]  # cross-attention by a summary of the source


@pytest.mark.parametrize("name", SUMMARISING)
def test_cross_attention_summarises_the_source_once_and_equals_attending_its_keys(name):
    """Linear, Performer and Linformer cross-attention reduce the source once, when decoding starts
    ([S, Z], or E K and F V): a state whose size does not depend on the source's length, no
    reduction at any step, and, for rows grouped by source as beams are, the same outputs as
    attending over the source's keys and values (padding included)."""
    torch.manual_seed(0)
    model = tiny_model(attention=MECHANISMS[name])
    mechanisms = [layer.cross_attn.mechanism for layer in model.decoder.layers]
    calls = []
    for mechanism in mechanisms:
        original = mechanism.summarise
        mechanism.summarise = lambda k, v, mask, original=original: (
            calls.append(k.size(2)) or original(k, v, mask)
        )
    shapes = []
    for lengths in ([5, 3], [12, 9]):
        src = ragged_batch(lengths)
        memory, src_mask = model.encode(src)
        decoder = CachedDecoder(model)
        state = decoder.start(src, max_steps=8)
        assert all(source.summarised for source in state.sources)
        shapes.append([tuple(x.shape) for source in state.sources for x in source.tensors])
        tgt = random_tokens(2 * 3, 5, 41)  # 3 rows (beams) per source
        before = len(calls)
        for t in range(5):
            decoder.step(tgt[:, t], state)
        assert len(calls) == before  # nothing summarised while decoding
        rows_src = torch.arange(2).repeat_interleave(3)
        summarised, _ = model.decode(tgt, memory[rows_src], src_mask[rows_src])
        keys = model.sources(memory[rows_src], src_mask[rows_src], summarise=False)
        assert not any(source.summarised for source in keys)
        attended, _ = model.decode(tgt, keys, src_mask[rows_src])
        torch.testing.assert_close(summarised, attended, atol=1e-5, rtol=1e-5)
        alone = model.decode(tgt[:3], memory[rows_src[:1]], src_mask[:1])[0]
        torch.testing.assert_close(alone, summarised[:3], atol=1e-5, rtol=1e-5)
    assert shapes[0] == shapes[1]  # the summary's size does not grow with the source


def model_with_eos_bias_and(attention: dict) -> Transformer:
    """``model_with_eos_bias``'s output layer on a model with ``attention``."""
    model = tiny_model(attention=attention, tie_output=False)
    model.output = model_with_eos_bias().output
    return model


@pytest.mark.slow  # every mechanism trained for a while (softmax: test_overfit.py, in the first tier)
@EACH
def test_each_mechanism_overfits_the_toy_batch_with_finite_bf16_gradients(attention):
    """The toy batch of ``test_overfit.py``, trained under bf16 autocast."""
    g = torch.Generator().manual_seed(1)
    lengths = [3, 5, 4, 6, 2, 5]
    sources = [torch.randint(4, 20, (n,), generator=g).tolist() for n in lengths]
    targets = [[(x + 3) % 16 + 4 for x in reversed(s)] + [7] for s in sources]

    def pad(seqs):
        return torch.tensor([s + [PAD] * (max(map(len, seqs)) - len(s)) for s in seqs])

    src = pad([s + [EOS] for s in sources])
    tgt_in, tgt_out = pad([[BOS] + t for t in targets]), pad([t + [EOS] for t in targets])
    cfg = dict(src_vocab_size=24, tgt_vocab_size=24, dropout=0.0, share_embeddings=True, max_positions=32)
    model = Transformer(TransformerConfig(d_model=32, n_heads=4, d_ff=64, attention=attention, **cfg))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(400):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.float().view(-1, 24), tgt_out.view(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.01
    # Greedy only: beam search stops a sentence once it has beam_size finished hypotheses, which a
    # model this sure of its next token can fill with poor ones before the target ends (softmax too).
    assert greedy_search(model.eval(), src, BOS, EOS) == targets
