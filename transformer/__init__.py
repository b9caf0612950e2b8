"""A from-scratch encoder-decoder Transformer in pure PyTorch (no Lightning, no Hydra)."""

from transformer.config import TransformerConfig
from transformer.model import DecoderState, Transformer

__all__ = ["DecoderState", "Transformer", "TransformerConfig"]
