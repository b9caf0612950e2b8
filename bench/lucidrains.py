"""lucidrains' attention layers, configured as ours: what ``bench/attention_reference.py`` measures
ours against (issue 23, item 2).

Their packages, ``performer-pytorch``, ``linformer``, ``nystrom-attention``, ``local-attention``
and ``reformer-pytorch``, come from the ``bench`` extra and are never a runtime dependency.
Each pair is our mechanism (alone: :func:`our_mechanism`, or in its attention layer:
:func:`our_layer`) and theirs (its core, where their package exposes one apart from the layer:
:func:`reference_core`, or its whole layer: :func:`reference_layer`).

Theirs are configured with our defaults (``AttentionConfig``), mapped to their nearest setting;
``tests/bench/test_attention_reference.py`` says where the outputs are equal and why not elsewhere:

* performer: ours ``features`` 256 (FAVOR+, orthogonal rows with chi(d) lengths, redrawn every
  ``redraw_interval`` 1000 training calls) = theirs ``FastAttention(nb_features=256,
  ortho_scaling=0)``, in the layer ``SelfAttention(qkv_bias=True)`` (ours has biases). Not the
  same: theirs adds 1e-4 to every random feature (ours 1e-6 to the normaliser) and stabilises
  the keys by their largest exponent over all positions; its redraw is the ``Performer``
  model's, not the layer's (none happens in a benchmark). Causal: their CPU path
  (``causal_linear_attention_noncuda``) cuts the sequence into 128 pieces and keeps every
  position's [m, d] prefix sum, O(n·m·d) memory; ours keeps one per chunk of 64 positions.
* linformer: ours ``projected_length`` 64, E and F shared by the heads, ``max_length`` raised to
  max(n, 1024) = theirs ``LinformerSelfAttention(k=64, seq_len=max(n, 1024))``. The same
  (E = their ``proj_k``ᵀ); their Q, K, V projections have no bias.
* nystrom: ours ``landmarks`` 64, 6 pseudo-inverse steps, no convolution = theirs
  ``NystromAttention(num_landmarks=64, pinv_iterations=6, residual=False)``. The same at lengths
  that are multiples of 64, except the pseudo-inverse's starting scale (each head's own norms
  here, the largest over the batch and heads there); their Q, K, V projections have no bias.
* local: ours ``window`` 32, |i − j| < 32 (causal 0 ≤ i − j < 32) on blocks of 32 = theirs
  ``LocalAttention(window_size=31, exact_windowsize=True, autopad=True)`` looking one block back
  (and one forward unless causal), without the rotary embedding; in the layer ``LocalMHA`` (no
  biases). The same positions, on blocks of 31 (a length that is not a multiple is padded, ~9%
  more at 256; without a mask their last positions then attend to the padding).
* lsh: ours ``rounds`` 2, ``chunk_length`` 64, same-bucket keys only, duplicates counted, set to
  their scheme: ``buckets`` n / 64 (theirs has no other: 4 at 256, 256 at 16K) and, non-causal,
  ``lsh_window="chunks"`` (a chunk of 64 sorted positions sees itself and the chunk before, 64 ×
  128 scores a chunk per round; our default slides over 64 positions each way, 64 × 192) = theirs
  ``LSHSelfAttention(bucket_size=64, n_hashes=2, attend_across_buckets=False,
  allow_duplicate_attention=False)`` (its core: reformer's ``LSHAttention``). Causal, ours keeps
  the sliding window (64 × 128 too: a fixed chunk would depend on later tokens). Not the same:
  their rotations are drawn afresh at every call, their first chunk looks back at the last one,
  and their duplicates are counted by chunk, ours by bucket. Lengths must be multiples of 128
  there.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from bench.attention_runs import ROLES

if TYPE_CHECKING:  # torch and the model are imported where they are used (the parent stays small)
    from torch import Tensor, nn

    from transformer.mechanisms import AttentionConfig

# pair -> (the PyPI package of theirs, its import name)
PACKAGES = {
    "performer": ("performer-pytorch", "performer_pytorch"),
    "linformer": ("linformer", "linformer"),
    "nystrom": ("nystrom-attention", "nystrom_attention"),
    "local": ("local-attention", "local_attention"),
    "lsh": ("reformer-pytorch", "reformer_pytorch"),
}
PAIRS = tuple(PACKAGES)
CAUSAL = ("performer", "local", "lsh")  # both implementations have a causal form
CORES = ("performer", "local", "lsh")  # their package exposes the core apart from the layer


def missing_packages(pairs: list[str] | tuple[str, ...] = PAIRS) -> list[str]:
    """The PyPI names of the reference packages of ``pairs`` that are not installed."""
    return [PACKAGES[p][0] for p in pairs if importlib.util.find_spec(PACKAGES[p][1]) is None]


def _our_config(pair: str, cfg: AttentionConfig, causal: bool, length: int) -> tuple[str, AttentionConfig]:
    """The role and ``cfg`` with ``pair`` in it (linformer's ``max_length`` raised to ``length``)."""
    from dataclasses import replace

    role = ROLES["decoder" if causal else "encoder"]
    cfg = replace(cfg, **{role: pair}, max_length=max(length, cfg.max_length))
    if pair == "lsh":  # reformer's scheme: n / chunk buckets; a chunk and the one before (encoder)
        window = "sliding" if causal else "chunks"
        cfg = replace(cfg, buckets=max(1, length // cfg.chunk_length), lsh_window=window)
    return role, cfg


def our_mechanism(pair: str, cfg: AttentionConfig, d_head: int, causal: bool, length: int) -> nn.Module:
    """Our mechanism ``pair`` with ``cfg``'s settings (linformer's ``max_length`` raised to ``length``)."""
    from transformer.mechanisms import build_mechanism

    role, cfg = _our_config(pair, cfg, causal, length)
    return build_mechanism(role, cfg, d_head, 0.0)


def our_layer(
    pair: str, cfg: AttentionConfig, d_model: int, heads: int, causal: bool, length: int
) -> nn.Module:
    """Our self-attention layer of ``pair`` (``MultiHeadAttention``, or the mechanism's own layer),
    causal or not: ``layer(x)``."""
    from transformer.mechanisms import build_attention

    role, cfg = _our_config(pair, cfg, causal, length)
    return build_attention(role, cfg, d_model, heads, 0.0)


def check_length(pair: str, cfg: AttentionConfig, length: int) -> None:
    """Refuses (ValueError) a length that their implementation cannot run."""
    if pair == "lsh" and length % (2 * cfg.chunk_length):
        raise ValueError(f"reformer's LSHAttention cannot run {length}: a multiple of 2 x bucket_size needed")


def reference_core(pair: str, cfg: AttentionConfig, d_head: int, causal: bool) -> nn.Module:
    """Their core for ``pair`` with our settings, called as ``core(q, k, v)`` on [B, H, n, d_head]."""
    if pair == "performer":
        from performer_pytorch import FastAttention

        return FastAttention(d_head, nb_features=cfg.features, ortho_scaling=0, causal=causal)
    if pair == "local":
        from local_attention import LocalAttention

        return LocalAttention(
            window_size=cfg.window - 1,  # with exact_windowsize: |i - j| <= window_size
            causal=causal,
            look_backward=1,
            look_forward=0 if causal else 1,
            exact_windowsize=True,
            autopad=True,
        )
    if pair == "lsh":
        from reformer_pytorch.reformer_pytorch import LSHAttention
        from torch import nn

        class ReformerCore(nn.Module):
            """reformer's ``LSHAttention`` on [B, H, n, d] heads (it takes [B·H, n, d]: shared QK, V)."""

            def __init__(self) -> None:
                super().__init__()
                self.lsh = LSHAttention(
                    bucket_size=cfg.chunk_length,
                    n_hashes=cfg.rounds,
                    causal=causal,
                    attend_across_buckets=False,
                    allow_duplicate_attention=False,
                )

            def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                """k is ignored: shared QK, as ours."""
                return self.lsh(q.flatten(0, 1), v.flatten(0, 1))[0].view_as(q)

        return ReformerCore()
    raise ValueError(f"{PACKAGES[pair][0]} has no core apart from its layer")


def reference_layer(
    pair: str, cfg: AttentionConfig, d_model: int, heads: int, causal: bool, length: int
) -> nn.Module:
    """Their whole attention layer for ``pair`` with our settings: ``layer(x)``, x [B, n, d_model]."""
    d_head = d_model // heads
    if causal and pair not in CAUSAL:
        raise ValueError(f"{PACKAGES[pair][0]} cannot be causal")
    if pair == "performer":
        from performer_pytorch import SelfAttention

        return SelfAttention(
            dim=d_model,
            heads=heads,
            dim_head=d_head,
            causal=causal,
            nb_features=cfg.features,
            feature_redraw_interval=cfg.redraw_interval,
            qkv_bias=True,
            attn_out_bias=True,
        )
    if pair == "linformer":
        from linformer import LinformerSelfAttention

        seq_len = max(length, cfg.max_length)
        return LinformerSelfAttention(d_model, seq_len, k=cfg.projected_length, heads=heads, dim_head=d_head)
    if pair == "nystrom":
        from nystrom_attention import NystromAttention

        return NystromAttention(
            d_model,
            dim_head=d_head,
            heads=heads,
            num_landmarks=cfg.landmarks,
            pinv_iterations=6,
            residual=False,
        )
    if pair == "local":
        from local_attention import LocalMHA

        return LocalMHA(
            dim=d_model,
            window_size=cfg.window - 1,
            dim_head=d_head,
            heads=heads,
            causal=causal,
            exact_windowsize=True,
            use_rotary_pos_emb=False,
        )
    if pair == "lsh":
        from reformer_pytorch import LSHSelfAttention

        return LSHSelfAttention(
            dim=d_model,
            heads=heads,
            bucket_size=cfg.chunk_length,
            n_hashes=cfg.rounds,
            causal=causal,
            dim_head=d_head,
            attend_across_buckets=False,
            allow_duplicate_attention=False,
        )
    raise ValueError(f"unknown pair {pair!r}")
