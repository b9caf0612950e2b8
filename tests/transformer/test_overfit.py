"""A tiny model memorises a toy batch and greedy decoding gives every target back."""

import torch
import torch.nn.functional as F

from decoding.search import beam_search, greedy_search
from tests.transformer.helpers import BOS, EOS, PAD
from transformer import Transformer, TransformerConfig


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(seqs), max(map(len, seqs))), PAD)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s)
    return out


def test_tiny_model_overfits_a_toy_batch():
    g = torch.Generator().manual_seed(1)
    lengths = [3, 5, 4, 6, 2, 5]
    sources = [torch.randint(4, 20, (n,), generator=g).tolist() for n in lengths]
    # Targets: a deterministic but non-trivial function of the source (reversed, shifted ids).
    targets = [[(x + 3) % 16 + 4 for x in reversed(s)] + [7] for s in sources]
    src = _pad([s + [EOS] for s in sources])
    tgt_in = _pad([[BOS] + t for t in targets])
    tgt_out = _pad([t + [EOS] for t in targets])
    cfg = TransformerConfig(
        src_vocab_size=24, tgt_vocab_size=24, d_model=32, n_heads=4, n_encoder_layers=2,
        n_decoder_layers=2, d_ff=64, dropout=0.0, share_embeddings=True, max_positions=32,
    )  # fmt: skip
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.view(-1, 24), tgt_out.view(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    model.eval()
    assert greedy_search(model, src, BOS, EOS) == targets
    assert [h[0].tokens for h in beam_search(model, src, BOS, EOS, beam_size=4)] == targets
