"""A from-scratch encoder-decoder Transformer in pure PyTorch (no Lightning, no Hydra)."""

from transformer.config import TransformerConfig
from transformer.model import Transformer

__all__ = ["Transformer", "TransformerConfig"]
