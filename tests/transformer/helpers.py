"""Tiny model configurations shared by the model tests."""

from __future__ import annotations

import torch

from transformer import Transformer, TransformerConfig

PAD, BOS, EOS = 0, 2, 3


def tiny_config(norm_first: bool = False, **overrides) -> TransformerConfig:
    values = dict(
        src_vocab_size=37,
        tgt_vocab_size=41,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.1,
        norm_first=norm_first,
        max_positions=128,
    )
    values.update(overrides)
    return TransformerConfig(**values)


def tiny_model(norm_first: bool = False, **overrides) -> Transformer:
    return Transformer(tiny_config(norm_first, **overrides)).eval()


def random_tokens(
    batch: int, length: int, vocab: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """[batch, length] ids drawn from the non-special range 4..vocab-1."""
    return torch.randint(4, vocab, (batch, length), generator=generator)


def ragged_batch(lengths: list[int], vocab: int = 37, seed: int = 0) -> torch.Tensor:
    """[len(lengths), max(lengths)] sources of those lengths (EOS last), right-padded with PAD."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = random_tokens(1, n, vocab, g)
        src[i, n - 1] = EOS
    return src


def model_with_eos_bias(norm_first: bool = False) -> Transformer:
    """A random tiny model (eval mode) with a bias towards EOS, so that outputs end at varied lengths."""
    model = tiny_model(norm_first, tie_output=False)
    output = torch.nn.Linear(model.cfg.d_model, model.cfg.tgt_vocab_size)
    with torch.no_grad():
        output.weight.copy_(model.output.weight)
        output.bias.zero_()
        output.bias[EOS] = 2.5
    model.output = output
    return model
