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
