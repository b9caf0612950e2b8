"""The encoder-decoder Transformer: training forward, ``encode`` and a cached one-step ``decode``."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from transformer.attention import DecodingState
from transformer.config import TransformerConfig
from transformer.embeddings import Embeddings, PositionalEncoding
from transformer.kv_cache import KVCache
from transformer.layers import DecoderLayer, EncoderLayer


@dataclass
class DecoderState:
    """What incremental decoding keeps between steps.

    Rows of the decoder ("hypotheses") are grouped by source sentence: rows
    ``i*g .. i*g+g-1`` belong to source ``i``, where ``g = rows // n_src`` (1 for greedy,
    the beam size for beam search). Cross-attention K/V are stored once per *source*.

    Attributes:
        self_caches: per decoder layer, its self-attention mechanism's state of the steps so far:
            for softmax a ``KVCache`` of keys/values, each [rows, heads, steps, d_head], that grows
            by one step each step; for the others what their ``new_state`` makes.
        cross_kv: per decoder layer, (k, v): [n_src, heads, src_len, d_head], or the mechanism's
            ``SourceSummary`` of them (linear, Performer, Linformer); computed once per source.
        src_mask: bool [n_src, 1, 1, src_len], True at real source tokens.
        step: number of target tokens fed so far (the next token's position).
    """

    self_caches: list[DecodingState]
    cross_kv: list[tuple[Tensor, Tensor]]
    src_mask: Tensor
    step: int = 0

    @property
    def n_src(self) -> int:
        return self.src_mask.size(0)

    def select(self, rows: Tensor, sources: Tensor | None = None) -> None:
        """Reorders/shrinks the caches in place.

        Args:
            rows: [new_rows] indices of the hypotheses to keep, in their new order; each must
                stay with its source (beam search reorders within a sentence's beams).
            sources: [new_n_src] indices of the source sentences still active (finished
                sentences dropped), or None to keep all.
        """
        for cache in self.self_caches:
            cache.select(rows)
        if sources is not None:
            self.cross_kv = [type(kv)(x.index_select(0, sources) for x in kv) for kv in self.cross_kv]
            self.src_mask = self.src_mask.index_select(0, sources)


def layer_arguments(cfg: TransformerConfig) -> dict:
    """The keyword arguments that ``EncoderLayer`` and ``DecoderLayer`` share, from the config."""
    return {
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_ff": cfg.d_ff,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "activation": cfg.activation,
        "norm_first": cfg.norm_first,
        "eps": cfg.layer_norm_eps,
        "attention": cfg.attention,
    }


class Encoder(nn.Module):
    """A stack of ``EncoderLayer`` (plus a final LayerNorm in pre-LN)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(**layer_arguments(cfg)) for _ in range(cfg.n_encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(self, x: Tensor, src_mask: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """x: [batch, src_len, d_model] embedded source; src_mask: [batch, 1, 1, src_len] ->
        ([batch, src_len, d_model], per-layer self-attention weights if ``need_weights``)."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, src_mask, need_weights)
            if w is not None:
                weights.append(w)
        return (self.final_norm(x) if self.final_norm is not None else x), weights


class Decoder(nn.Module):
    """A stack of ``DecoderLayer`` (plus a final LayerNorm in pre-LN)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(**layer_arguments(cfg)) for _ in range(cfg.n_decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_first else None

    def forward(
        self,
        y: Tensor,
        cross_kv: list[tuple[Tensor, Tensor]],
        src_mask: Tensor,
        caches: list[DecodingState] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """y: [rows, tgt_len, d_model] -> ([rows, tgt_len, d_model], per-layer cross weights)."""
        weights = []
        for i, layer in enumerate(self.layers):
            y, w = layer(y, cross_kv[i], src_mask, None if caches is None else caches[i], need_weights)
            if w is not None:
                weights.append(w)
        y = self.final_norm(y) if self.final_norm is not None else y
        return y, weights


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017).

    Token ids in, next-token logits out. ``forward`` is the teacher-forced training pass;
    ``encode`` + ``start_decoding`` + ``decode_step`` is incremental inference with a
    self-attention K/V cache and cross-attention K/V computed once per source.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = Embeddings(cfg.src_vocab_size, cfg.d_model, cfg.pad_id)
        self.tgt_embed = (
            self.src_embed
            if cfg.share_embeddings
            else Embeddings(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id)
        )
        learned = cfg.positional == "learned"
        self.src_pos = PositionalEncoding(cfg.d_model, cfg.max_positions, cfg.dropout, learned)
        self.tgt_pos = PositionalEncoding(cfg.d_model, cfg.max_positions, cfg.dropout, learned)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight
        else:
            nn.init.normal_(self.output.weight, mean=0.0, std=cfg.d_model**-0.5)

    def logits(self, y: Tensor) -> Tensor:
        """y: [..., d_model] decoder output -> [..., tgt_vocab] through the output projection."""
        return self.output(y)

    def num_parameters(self, trainable_only: bool = True) -> int:
        """Parameter count, each shared (tied) tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def source_mask(self, src: Tensor) -> Tensor:
        """src: [batch, src_len] ids -> bool [batch, 1, 1, src_len], True at real tokens."""
        return (src != self.cfg.pad_id)[:, None, None, :]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src: [batch, src_len] ids -> memory [batch, src_len, d_model], mask [batch, 1, 1, src_len]."""
        src_mask = self.source_mask(src)
        memory, _ = self.encoder(self.src_pos(self.src_embed(src)), src_mask)
        return memory, src_mask

    def project_memory(
        self, memory: Tensor, src_mask: Tensor, summarise: bool = True
    ) -> list[tuple[Tensor, ...]]:
        """What cross-attention reads, for every decoder layer: (k, v) [batch, heads, src_len, d_head],
        or its mechanism's ``SourceSummary`` (``MultiHeadAttention.project_kv``; src_mask: bool
        [batch, 1, 1, src_len]; ``summarise=False``: (k, v) whatever the mechanism)."""
        return [layer.cross_attn.project_kv(memory, src_mask, summarise) for layer in self.decoder.layers]

    def decode(
        self,
        tgt_in: Tensor,
        cross_kv: list[tuple[Tensor, Tensor]],
        src_mask: Tensor,
        need_weights: bool = False,
        last_only: bool = False,
        project: bool = True,
    ) -> tuple[Tensor, list[Tensor]]:
        """Decoder on a whole target prefix (no cache).

        Args:
            tgt_in: [rows, tgt_len] decoder input ids (BOS first); rows = n_src * g.
            cross_kv: from ``project_memory``; src_mask: [n_src, 1, 1, src_len].
            need_weights: also return per-layer cross-attention [rows, heads, tgt_len, src_len].
            last_only: logits of the last position only (all a search step needs).
            project: False returns the decoder output [..., d_model] in place of the logits.

        Returns:
            logits [rows, tgt_len, tgt_vocab] ([rows, 1, tgt_vocab] if ``last_only``) and the
            list of weights (empty unless asked).
        """
        y = self.tgt_pos(self.tgt_embed(tgt_in))
        y, weights = self.decoder(y, cross_kv, src_mask, need_weights=need_weights)
        y = y[:, -1:] if last_only else y
        return (self.logits(y) if project else y), weights

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Teacher-forced pass: src [batch, src_len], tgt_in [batch, tgt_len] -> logits [batch, tgt_len, V].

        Target padding needs no mask: padding is on the right and the causal mask already keeps
        every real position from seeing it. ``project=False`` returns the decoder output
        [batch, tgt_len, d_model] instead, for a loss that applies ``self.output`` itself
        (training's, ``training/loss.py``).
        """
        memory, src_mask = self.encode(src)
        out, _ = self.decode(tgt_in, self.project_memory(memory, src_mask), src_mask, project=project)
        return out

    def cross_attention_weights(self, src: Tensor, tgt_in: Tensor) -> list[Tensor]:
        """Per decoder layer, cross-attention weights [batch, heads, tgt_len, src_len] (eval mode)."""
        memory, src_mask = self.encode(src)
        cross_kv = self.project_memory(memory, src_mask, summarise=False)
        _, weights = self.decode(tgt_in, cross_kv, src_mask, need_weights=True)
        return weights

    def encoder_attention_weights(self, src: Tensor) -> list[Tensor]:
        """Per encoder layer, the self-attention weights [batch, heads, src_len, src_len] its
        mechanism implies (eval mode; n × n, for pictures): softmax's weights, linear attention's
        normalised φ(q)·φ(k) rows, the pattern local, sparse and LSH attention attend over,
        through the encoder's own code path."""
        src_mask = self.source_mask(src)
        _, weights = self.encoder(self.src_pos(self.src_embed(src)), src_mask, need_weights=True)
        return weights

    def start_decoding(self, memory: Tensor, src_mask: Tensor, max_steps: int = 64) -> DecoderState:
        """Empty self-attention states and the cross-attention K/V (or summaries) of ``memory``
        [n_src, src_len, d].

        ``max_steps``: the most steps decoding may take. Softmax's caches start with room for at
        most ``KVCache.GROWTH`` and grow when full: most outputs end long before the length limit.
        """
        states = [layer.self_attn.mechanism.new_state(max_steps) for layer in self.decoder.layers]
        KVCache.share_spare(states)  # one spare storage for all layers' reorders, not one each
        return DecoderState(
            self_caches=states,
            cross_kv=self.project_memory(memory, src_mask),
            src_mask=src_mask,
        )

    def decode_step(self, tokens: Tensor, state: DecoderState, project: bool = True) -> Tensor:
        """Feeds one token per hypothesis and returns the next-token logits.

        Args:
            tokens: [rows] the latest token of each hypothesis (BOS at step 0); rows = n_src * g.
            state: from ``start_decoding``; its caches grow by one step, in place.
            project: False returns the decoder's output instead, for ``logits`` to project a
                few rows at a time (the search does: [rows, tgt_vocab] is a large tensor).

        Returns:
            logits [rows, tgt_vocab], or the decoder output [rows, d_model] if not ``project``.
        """
        y = self.tgt_pos(self.tgt_embed(tokens[:, None]), offset=state.step)  # (R, 1, D)
        y, _ = self.decoder(y, state.cross_kv, state.src_mask, caches=state.self_caches)
        state.step += 1
        return self.logits(y[:, -1]) if project else y[:, -1]
