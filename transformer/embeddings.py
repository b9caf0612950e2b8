"""Token embeddings scaled by sqrt(d_model) plus positional encoding."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Embeddings(nn.Module):
    """Token ids to vectors, multiplied by sqrt(d_model) (paper, section 3.4)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.table = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        # N(0, d^-1/2): after the sqrt(d) scaling the embeddings have unit variance,
        # the same scale as the positional encoding; also right for a tied output layer.
        nn.init.normal_(self.table.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.table.weight[pad_id].zero_()

    @property
    def weight(self) -> Tensor:
        return self.table.weight

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens: [batch, len] ids -> [batch, len, d_model]."""
        return self.table(tokens) * math.sqrt(self.d_model)


def sinusoidal_table(max_positions: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...): [max_positions, d_model]."""
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


class PositionalEncoding(nn.Module):
    """Adds a position vector to each step, then dropout.

    Sinusoidal (fixed, the paper's) or learned (one trained vector per position).
    """

    def __init__(self, d_model: int, max_positions: int, dropout: float, learned: bool = False) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.learned = learned
        if learned:
            self.table = nn.Parameter(torch.randn(max_positions, d_model) * d_model**-0.5)
        else:
            self.register_buffer("table", sinusoidal_table(max_positions, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: [batch, len, d_model]; positions offset..offset+len-1 -> [batch, len, d_model]."""
        end = offset + x.size(1)
        if end > self.max_positions:
            raise ValueError(
                f"sequence reaches position {end} but max_positions={self.max_positions}; "
                "raise the model's max_positions or crop the input"
            )
        return self.dropout(x + self.table[offset:end].to(x.dtype))
