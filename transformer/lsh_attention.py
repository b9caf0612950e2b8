"""LSH attention (Kitaev et al. 2020, "Reformer"): softmax attention within hash buckets, on sorted chunks.

Shared-QK (section 2): the keys are the queries, normalised, k_j = q_j / ‖q_j‖, and a position
does not attend to itself unless nothing else is allowed (its score is replaced by -1e5, the
paper's choice). Attention of query i is restricted to a set P_i (equation (2)):

    o_i = Σ_{j∈P_i} exp(q_i·k_j/√d − log N_ij − z(i, P_i)) v_j

Angular LSH (section 2, "Hashing attention"): with a random rotation R ∈ R^{d × b/2},
h(x) = argmax([xR; −xR]) of b buckets, and P_i holds the positions of i's bucket. Positions are
sorted by (bucket, position) and cut into chunks of ``chunk`` (equation (3)); a chunk attends to
itself and to the chunk before it. By default (``window="sliding"``) that is a sliding window of
``chunk`` sorted positions back (and forward unless causal), computed on chunks with their
neighbours: P_i = {j : h(j) = h(i), |s(i) − s(j)| < c} for sorted indices s, causal
0 ≤ s(i) − s(j) < c. Within one bucket the sorted order is the positions' order, so causal P_i is
the last c positions ≤ i of i's bucket: it does not depend on where chunk boundaries fall, and so
not on later tokens (with fixed chunk boundaries, a later token's bucket would move i's chunk).
``window="chunks"`` is the paper's own pattern, as the Reformer's code computes it: P_i = {j :
h(j) = h(i), ⌊s(j)/c⌋ ∈ {⌊s(i)/c⌋ − 1, ⌊s(i)/c⌋}}, its chunk and the one before, 2c keys a query
where the sliding window scores 3c (non-causal); for the encoder only, because of the boundaries.
Several rounds (equation (4)) hash with independent rotations and combine as P_i = ∪_r P_i^(r),
each round's output weighted by exp(z_r(i) − z(i)); N_ij, the rounds in which i and j share a
bucket, stops a key seen in several rounds from counting several times (the paper's correction,
by bucket, not by chunk).

With one bucket, one round and chunks covering the sequence, this is shared-QK softmax attention
exactly (:func:`shared_qk_attention`). Cost: O(r·n·c·d) time and O(r·n·c) memory for r rounds,
plus the sort, O(r·n log n). Rotations are drawn once, at construction, and saved with the model
(a fixed hash, so a sentence hashes the same alone, in a batch and step by step). Padded
positions get a bucket of their own, sorted after every real one, so they share no chunk
window with real positions and contribute nothing.

Decoding (causal self-attention) keeps a K/V cache (:class:`LSHCache`: the normalised keys,
values and their hashes) and scores a new query against all cached keys, masked to its set P_i:
O(n·d) per step, as softmax's cache.

The mechanism says ``shared_qk``: ``MultiHeadAttention`` then projects no keys and passes the
queries in their place (the mechanism uses the queries either way). The key rows of that
layer's ``in_proj`` get a zero gradient (they are one parameter with the query and value rows,
so DDP finds no unused one).

Computed in fp32 whatever the autocast: a bucket must not change with the precision.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SELF = -1e5  # a position's score for itself: it attends to itself only when nothing else is allowed
NEG = -1e9  # the score of a position not in P_i: finite, so no row is ever NaN
WINDOWS = ("sliding", "chunks")  # which sorted positions a query may see (the module docstring)


def shared_qk_attention(q: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """Shared-QK softmax attention as the Reformer defines it, written out (n × n): the reference
    that LSH attention with one bucket and one round equals. q, v: [B, H, n, d]; mask [B, 1, 1, n]."""
    n = q.size(-2)
    scores = q @ F.normalize(q, dim=-1).transpose(-2, -1) / math.sqrt(q.size(-1))
    allowed = torch.ones(n, n, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(torch.eye(n, dtype=torch.bool, device=q.device), SELF)
    return scores.masked_fill(~allowed, NEG).softmax(-1) @ v


class LSHCache:
    """Decoding state of LSH attention: the normalised keys, the values and their buckets so far.

    ``k``, ``v``: [rows, heads, t, d]; ``hashes``: [rows, heads, rounds, t]; None before the first step.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.hashes: Tensor | None = None

    def extend(self, k: Tensor, v: Tensor, hashes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Appends new positions and returns all of them."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
            hashes = torch.cat([self.hashes, hashes], dim=-1)
        self.k, self.v, self.hashes = k, v, hashes
        return k, v, hashes

    def select(self, rows: Tensor, spare: Tensor | None = None) -> Tensor | None:
        """Keeps rows ``rows`` ([new_rows] indices) in that order (beam search); ``spare`` is passed on."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, rows), self.v.index_select(0, rows)
            self.hashes = self.hashes.index_select(0, rows)
        return spare


class LSHAttention(nn.Module):
    """Shared-QK LSH attention behind the mechanisms' signature (``attention.SoftmaxAttention``).

    Args:
        d_head: width of the heads (of the rotations).
        buckets: b, 1 or even (h takes the argmax over ±b/2 rotated coordinates).
        rounds: independent hashes whose attention is combined.
        chunk: c, sorted positions a query sees back (and forward unless causal), itself included;
            with ``window="chunks"``, the length of the chunks.
        dropout: on the attention weights.
        window: ``"sliding"`` (c sorted positions each way) or ``"chunks"`` (a query's chunk and the
            one before; non-causal only).
    """

    shared_qk = True  # keys are the normalised queries: MultiHeadAttention projects none

    def __init__(
        self,
        d_head: int,
        buckets: int,
        rounds: int,
        chunk: int,
        dropout: float = 0.0,
        window: str = "sliding",
    ) -> None:
        super().__init__()
        if buckets > 1 and buckets % 2:
            raise ValueError(f"LSH attention needs an even number of buckets (or 1), not {buckets}")
        if window not in WINDOWS:
            raise ValueError(f"LSH attention's window is one of {', '.join(WINDOWS)}, not {window!r}")
        self.buckets, self.rounds, self.chunk, self.dropout = buckets, rounds, chunk, dropout
        self.window = window
        # R of each round: random rotations, fixed (section 2; equation (4)'s h^(r)).
        self.register_buffer("rotations", torch.randn(d_head, rounds, max(buckets // 2, 1)))

    def hash(self, k: Tensor, valid: Tensor | None) -> Tensor:
        """Buckets [B, H, rounds, n] of keys [B, H, n, d]; padded positions (``valid`` [B, 1, n]
        False) get bucket ``buckets``, of their own."""
        b, h, n, _ = k.shape
        if self.buckets == 1:
            hashes = torch.zeros(b, h, self.rounds, n, dtype=torch.long, device=k.device)
        else:
            rotated = torch.einsum("bhnd,drk->bhrnk", k, self.rotations.float())
            hashes = torch.cat([rotated, -rotated], dim=-1).argmax(-1)  # h(x) = argmax([xR; −xR])
        if valid is not None:
            hashes = hashes.masked_fill(~valid[:, :, None, :], self.buckets)
        return hashes

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        state: LSHCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """The mechanisms' signature; ``k`` is ignored (shared-QK); mask: key padding [B, 1, 1, n].
        ``need_weights``: the weights over the positions of P_i [B, H, Tq, n] (n × n: pictures only)."""
        if q.size(2) != v.size(2):
            raise ValueError(f"LSH attention is self-attention: {q.size(2)} queries, {v.size(2)} values")
        if causal and self.window == "chunks":
            raise ValueError(
                "LSH attention's chunks window is for the encoder: causal, a query's chunk would "
                "depend on later tokens' buckets (use the sliding window)"
            )
        p = self.dropout if self.training else 0.0
        dtype = v.dtype
        with torch.autocast(q.device.type, enabled=False):
            q, v = q.float(), v.float()
            k = F.normalize(q, dim=-1)  # shared-QK: the keys are the normalised queries
            valid = None if mask is None else mask[:, :, 0, :]  # (B, 1, n)
            hashes = self.hash(k, valid)  # (B, H, R, n)
            if state is not None:
                if not causal:
                    raise ValueError("a decoding state is for causal self-attention")
                k, v, hashes = state.extend(k, v, hashes)
            if state is not None or need_weights:
                out, weights = self._dense(q, k, v, hashes, causal, p)
            else:
                out, weights = self._chunked(q, k, v, hashes, causal, p), None
        return out.to(dtype), weights

    def _dense(
        self, q: Tensor, k: Tensor, v: Tensor, hashes: Tensor, causal: bool, p: float
    ) -> tuple[Tensor, Tensor]:
        """P_i written out for the last Tq of n positions (decoding; pictures; the tests' reference).

        q: [B, H, Tq, d]; k, v: [B, H, n, d]; hashes: [B, H, R, n]. Returns out and weights [B, H, Tq, n].
        """
        n, t = k.size(2), q.size(2)
        pos = torch.arange(n, device=q.device)
        s = (hashes * n + pos).argsort(-1).argsort(-1)  # (B, H, R, n): sorted index of each position
        h_q, s_q = hashes[..., n - t :], s[..., n - t :]
        same = h_q[..., :, None] == hashes[..., None, :]  # (B, H, R, Tq, n)
        if self.window == "chunks":  # its own chunk (0) or the one before (1)
            back = s_q[..., :, None] // self.chunk - s[..., None, :] // self.chunk
            member = same & ((back == 0) | (back == 1))
        else:
            diff = s_q[..., :, None] - s[..., None, :]
            member = same & (diff < self.chunk) & ((diff >= 0) if causal else (diff > -self.chunk))
        duplicates = same.sum(2, keepdim=True).clamp(min=1)  # N_ij: rounds sharing a bucket
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)))[:, :, None] - duplicates.log()
        is_self = pos[n - t :, None] == pos[None, :]  # (Tq, n)
        scores = scores.masked_fill(is_self, SELF).masked_fill(~member, NEG)  # (B, H, R, Tq, n)
        z = scores.logsumexp(-1, keepdim=True)  # (B, H, R, Tq, 1): z_r(i)
        share = z.softmax(2)  # exp(z_r(i) − z(i)), exact where a row holds only its SELF score
        weights = ((scores - z).exp() * share).sum(2)  # (B, H, Tq, n)
        if p > 0.0:
            weights = F.dropout(weights, p=p)
        return weights @ v, weights

    def _chunked(self, q: Tensor, k: Tensor, v: Tensor, hashes: Tensor, causal: bool, p: float) -> Tensor:
        """Sort by (bucket, position), attend on chunks of c sorted queries, unsort, combine rounds."""
        b, h, n, d = q.shape
        r, c = self.rounds, self.chunk
        order = (hashes * n + torch.arange(n, device=q.device)).argsort(-1)  # (B, H, R, n): equation (3)

        def sort(x: Tensor) -> Tensor:  # (B, H, n, e) -> (B, H, R, n, e), in each round's order
            x = x[:, :, None].expand(b, h, r, n, x.size(-1))
            return x.gather(3, order[..., None].expand(b, h, r, n, x.size(-1)))

        nc = math.ceil(n / c)
        pad = nc * c - n
        before, after = c, 0 if causal or self.window == "chunks" else c
        span = before + c + after  # keys of a chunk of queries: its chunk and the neighbours

        def as_queries(x: Tensor, fill: float) -> Tensor:  # (..., n, e) -> (..., nc, c, e)
            return F.pad(x, (0, 0, 0, pad), value=fill).view(*x.shape[:-2], nc, c, x.size(-1))

        def as_keys(x: Tensor, fill: float) -> Tensor:  # (..., n, e) -> (..., nc, e, span)
            return F.pad(x, (0, 0, before, pad + after), value=fill).unfold(-2, span, c)

        # The 1/√d scale on the queries: n·d values, not the R·n·span scores.
        sq, sk, sv = sort(q / math.sqrt(d)), sort(k), sort(v)  # (B, H, R, n, d)
        scores = as_queries(sq, 0.0) @ as_keys(sk, 0.0)  # (B, H, R, nc, c, span)
        i = torch.arange(nc * c, device=q.device).view(nc, c, 1)  # sorted index of each query
        j = torch.arange(nc, device=q.device)[:, None] * c - before + torch.arange(span, device=q.device)
        j = j.view(nc, 1, span)  # sorted index of each key
        near = (j >= 0) & (j < n)  # (nc, c, span); "chunks": all of the chunk and the one before
        if self.window == "sliding":
            near = near & (i - j < c) & ((j <= i) if causal else (j - i < c))
        # A query's own key is the key at its own sorted index: a round's order is a permutation.
        # Its score is SELF, the others' outside P_i NEG: one pass over the scores with ``fill``.
        is_self = i == j  # (nc, c, span)
        fill = torch.where(is_self, SELF, NEG)  # (nc, c, span)
        own = hashes.gather(-1, order)[..., None]  # (B, H, R, n, 1): this round's bucket
        same = as_queries(own, -1)[..., :, None] == as_keys(own, -2)[..., None, :, :]
        keep = same.squeeze(-2) & (near & ~is_self)  # (B, H, R, nc, c, span): in P_i, not i itself
        if r > 1:  # N_ij: rounds in which i and j share a bucket (1 with one round: log 1 = 0)
            sorted_hashes = sort(hashes.transpose(-2, -1))  # (B, H, R, n, R): every round's bucket
            hq, hk = as_queries(sorted_hashes, -1), as_keys(sorted_hashes, -2)  # (.., c, R), (.., R, span)
            if r == 2:  # in P_i, N_ij is 2 where the other round shares the bucket too, else 1
                both = hq[..., 0, None] == hk[..., 0, None, :]
                both &= hq[..., 1, None] == hk[..., 1, None, :]
                scores = scores.add_(both, alpha=-math.log(2))  # in place: the product keeps no output
            else:  # counted in the scores' dtype, in place, one round at a time: exact small integers
                duplicates = (hq[..., 0, None] == hk[..., 0, None, :]).to(scores.dtype)
                for s in range(1, r):
                    duplicates += hq[..., s, None] == hk[..., s, None, :]
                scores = scores.sub_(duplicates.clamp_(min=1).log_())
        scores = torch.where(keep, scores, fill)
        z = scores.logsumexp(-1, keepdim=True)  # (B, H, R, nc, c, 1): z_r(i)
        weights = (scores - z).exp_()
        if p > 0.0:
            weights = F.dropout(weights, p=p)
        out = weights @ as_keys(sv, 0.0).transpose(-2, -1)  # (B, H, R, nc, c, d)
        out = out.view(b, h, r, nc * c, d)[..., :n, :]
        z = z.view(b, h, r, nc * c)[..., :n]
        undo = order.argsort(-1)  # back to the positions' order
        out = out.gather(3, undo[..., None].expand(b, h, r, n, d))
        z = z.gather(3, undo)  # (B, H, R, n)
        share = z.softmax(2)  # exp(z_r(i) − z(i)): equation (4)'s rounds (softmax: exact at SELF)
        return (share[..., None] * out).sum(2)

    def new_state(self, max_steps: int) -> LSHCache:
        """An empty K/V cache (with the keys' buckets); it grows by one position a step."""
        return LSHCache()
