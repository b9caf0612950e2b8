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
each round's output weighted by exp(z_r(i) − z(i)); N_ij, the number of rounds r with j ∈ P_i^(r),
stops a key attended in several rounds from counting several times (the paper's correction,
counted over the windows attended, not over shared buckets). With it the rounds combine to
softmax over the union of the sets exactly, which the tests enumerate directly.

With one bucket, one round and chunks covering the sequence, this is shared-QK softmax attention
exactly (:func:`shared_qk_attention`). Cost: O(r·n·c·d) time and O(r·n·c) memory for r rounds and
chunks of c = min(chunk, n) (a sentence shorter than a chunk is one chunk of its own length),
plus the sort, O(r·n log n). Rotations are drawn once, at construction, and saved with the model
(a fixed hash, so a sentence hashes the same alone, in a batch and step by step). Padded
positions get a bucket of their own, sorted after every real one, so they share no chunk
window with real positions and contribute nothing.

Decoding (causal self-attention) keeps a preallocated K/V cache written in place and, per round
and bucket, the positions of its last c keys, updated as each key arrives (:class:`LSHCache`): a
new query reads its R sets of c keys, O(R·c·d) a step whatever the length, with no sort and no
copy of the cache.

Its attention layer (:class:`SharedQKAttention`, built by the registry) makes no keys and passes
the queries in their place; the key rows of its ``in_proj`` get a zero gradient (one parameter
with the query and value rows, so DDP finds no unused one).

Computed in fp32 whatever the autocast: a bucket must not change with the precision.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.attention import AttentionMechanism, MultiHeadAttention, split_heads
from transformer.registry import Mechanism, Setting, register

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
    """Decoding state of causal LSH attention: the keys and values so far, and each bucket's last c.

    Causal, a query's set P_i in round r is the last c positions up to i of its bucket (the
    module docstring), so each (row, head, round, bucket) keeps the positions of its last c keys
    in a ring (``ring``), filled as keys arrive: a step reads R·c keys (sorting their R·c
    positions, not the cache) and scans nothing, O(R·c·d) a step, against softmax's O(t·d).

    ``kv`` [rows, heads, capacity, 2d]: each position's normalised key and value side by side (one
    write a step, one read of both), preallocated for ``capacity`` steps (``new_state``'s
    ``max_steps``) and written in place (twice the room, copied, if a step goes past it);
    ``ring`` [rows, heads, rounds, (buckets + 1) · c] positions (-1: none yet; bucket ``buckets``
    is padding's); ``count`` [rows, heads, rounds, buckets + 1] keys each bucket has had;
    ``slots`` [c] a bucket's slots from its first; ``rotations`` the layer's
    :meth:`LSHAttention.signed_rotations`. None before the first step. (No position's buckets
    are kept: a step needs only its own, and its sets.)
    """

    def __init__(self, capacity: int, chunk: int, buckets: int, rounds: int) -> None:
        self.capacity, self.chunk, self.buckets, self.rounds = max(capacity, 1), chunk, buckets + 1, rounds
        self.length = 0  # steps stored
        self.kv = self.ring = self.count = self.slots = self.starts = None  # made at the first step
        self.rotations: Tensor | None = None  # the layer's signed rotations, made at its first step

    def append(self, k: Tensor, v: Tensor, hashes: Tensor) -> Tensor:
        """Stores one position's key and value [rows, heads, 1, d] and its buckets [rows, heads,
        rounds, 1]; returns the positions of its set in each round, [rows, heads, rounds, c]
        (-1 where the bucket has had fewer than c keys), itself included."""
        rows, heads, _, d = k.shape
        c = self.chunk
        if self.kv is None:
            self.kv = k.new_empty(rows, heads, self.capacity, 2 * d)
            self.ring = torch.full((rows, heads, self.rounds, self.buckets * c), -1, device=k.device)
            self.count = torch.zeros(
                rows, heads, self.rounds, self.buckets, dtype=torch.long, device=k.device
            )
            self.slots = torch.arange(c, device=k.device)  # a bucket's slots, from its first
            self._find_starts()
        elif self.length == self.kv.size(2):
            grown = self.kv.new_empty(rows, heads, 2 * self.length, 2 * d)
            grown[:, :, : self.length] = self.kv
            self.kv = grown
            self._find_starts()
        p = self.length
        self.kv.select(2, p).copy_(torch.cat([k, v], -1).squeeze(2))
        bucket = hashes  # (rows, heads, R, 1)
        seen = self.count.gather(-1, bucket)  # (rows, heads, R, 1): the bucket's keys before this one
        first = bucket * c  # the bucket's first slot in the ring
        self.ring.scatter_(-1, first + seen % c, p)
        self.count.scatter_(-1, bucket, seen + 1)
        self.length = p + 1
        return self.ring.gather(-1, first + self.slots)  # (rows, heads, R, c)

    def select(self, rows: Tensor) -> None:
        """Keeps rows ``rows`` ([new_rows] indices) in that order: the steps so far into a new buffer."""
        if self.kv is None:
            return
        if self.kv.requires_grad:  # out= below does not differentiate
            self.kv = self.kv.index_select(0, rows)
        else:
            old = self.kv
            self.kv = old.new_empty(rows.numel(), *old.shape[1:])
            torch.index_select(old[:, :, : self.length], 0, rows, out=self.kv[:, :, : self.length])
        self.ring, self.count = self.ring.index_select(0, rows), self.count.index_select(0, rows)
        self._find_starts()

    def _find_starts(self) -> None:
        """``starts`` [rows, heads, 1]: where each (row, head)'s positions begin in ``kv`` seen as
        [rows·heads·room, 2d] (a step reads its keys and values there by one index_select)."""
        rows, heads, room = self.kv.shape[:3]
        self.starts = torch.arange(0, rows * heads * room, room, device=self.kv.device).view(rows, heads, 1)


class LSHAttention(AttentionMechanism):
    """Shared-QK LSH attention behind the mechanisms' signature (``attention.AttentionMechanism``).

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

    def signed_rotations(self) -> Tensor:
        """[d, rounds·buckets], fp32: each round's [R, −R] side by side, so that one product gives
        every round's [xR; −xR] (a decoding state keeps it for its steps)."""
        rotations = self.rotations.float()
        return torch.cat([rotations, -rotations], dim=-1).flatten(1)

    def hash(self, k: Tensor, valid: Tensor | None, signed: Tensor | None = None) -> Tensor:
        """Buckets [B, H, rounds, n] of keys [B, H, n, d]; padded positions (``valid`` [B, 1, n]
        False) get bucket ``buckets``, of their own. ``signed``: :meth:`signed_rotations`, if made."""
        b, h, n, _ = k.shape
        if self.buckets == 1:
            hashes = torch.zeros(b, h, self.rounds, n, dtype=torch.long, device=k.device)
        else:
            signed = self.signed_rotations() if signed is None else signed
            rotated = (k @ signed).view(b, h, n, self.rounds, self.buckets)
            hashes = rotated.transpose(2, 3).argmax(-1)  # h(x) = argmax([xR; −xR])
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
        # (autocast is switched off only where it is on: entering it took ~8% of a decoding step)
        device = q.device.type
        off = torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else nullcontext()
        with off:
            q, v = q.float(), v.float()
            # shared-QK: the keys are the normalised queries (F.normalize's arithmetic, fewer calls)
            k = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(1e-12)
            valid = None if mask is None else mask[:, :, 0, :]  # (B, 1, n)
            if state is not None and state.rotations is None and self.buckets > 1:
                state.rotations = self.signed_rotations()
            hashes = self.hash(k, valid, None if state is None else state.rotations)  # (B, H, R, n)
            if state is not None:
                if not causal or need_weights:
                    raise ValueError("a decoding state is for causal self-attention, without weights")
                if q.size(2) == 1:  # a decoding step
                    out = self._step(q, state, state.append(k, v, hashes), p)
                else:  # one position at a time
                    steps = []
                    for t in range(q.size(2)):
                        one = slice(t, t + 1)
                        members = state.append(k[:, :, one], v[:, :, one], hashes[..., one])
                        steps.append(self._step(q[:, :, one], state, members, p))
                    out = torch.cat(steps, dim=2)
                weights = None
            elif need_weights:
                out, weights = self._dense(q, k, v, hashes, causal, p)
            else:
                out, weights = self._chunked(q, k, v, hashes, causal, p), None
        return out.to(dtype), weights

    @staticmethod
    def _step(q: Tensor, state: LSHCache, members: Tensor, p: float) -> Tensor:
        """One decoding step: q [rows, H, 1, d] over its sets ``members`` [rows, H, R, c]
        (positions, -1 for none; :meth:`LSHCache.append`) -> [rows, H, 1, d]. O(R·c·(d + R))."""
        rows, h, r, c = members.shape
        d = q.size(-1)
        # equation (4) with N_ij, the rounds whose set holds j: Σ_r exp(z_r − z) exp(s − log N −
        # z_r) = exp(s − log N − z), z the logsumexp over every round's entries, so the rounds
        # combine to one softmax over the union of the sets, each key once. The order of the
        # R·c members does not matter to it: sorted, a key in several sets is a run of equal
        # positions, of which one is kept (as exp(s − log N) counted N times).
        members = members.view(rows, h, r * c).sort(-1).values
        drop = members < 0  # -1: an empty slot (a bucket with fewer than c keys so far)
        drop[..., :-1].logical_or_(members[..., :-1] == members[..., 1:])  # each run's last is kept
        # the keys and values of each (row, head): rows of the cache seen as [rows·H·room, 2d]
        # (index_select there, alone, took 9 µs against gather's 27, which expands the index over d)
        at = members.clamp(min=0) + state.starts
        kv = state.kv.view(-1, 2 * d).index_select(0, at.view(-1)).view(rows, h, r * c, 2 * d)
        keys, values = kv.split(d, -1)
        # NEG and SELF as a bias added to the scores (one fused call for scores, softmax and sum):
        # beside them a score of a few units is below fp32's resolution, so the weights are those
        # of the scores replaced. The query's own position is the newest, so the last sorted.
        bias = torch.where(drop, NEG, 0.0)
        bias[..., -1] = SELF
        return F.scaled_dot_product_attention(q, keys, values, bias.view(rows, h, 1, r * c), dropout_p=p)

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
        duplicates = member.sum(2, keepdim=True).clamp(min=1)  # N_ij: rounds in whose P_i j is
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
        # A chunk longer than the sequence would be mostly padding: with n <= c every sorted index
        # is within c of every other, so P_i is all of i's bucket with chunks of c or of n alike.
        r, c = self.rounds, min(self.chunk, n)
        order = (hashes * n + torch.arange(n, device=q.device)).argsort(-1)  # (B, H, R, n): equation (3)

        def sort(x: Tensor) -> Tensor:  # (B, H, n, e) -> (B, H, R, n, e), in each round's order
            x = x[:, :, None].expand(b, h, r, n, x.size(-1))
            return x.gather(3, order[..., None].expand(b, h, r, n, x.size(-1)))

        nc = math.ceil(n / c)
        pad = nc * c - n
        reach = c if nc > 1 else 0  # one chunk has no neighbour to see
        before, after = reach, 0 if causal or self.window == "chunks" else reach
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
        undo = order.argsort(-1)  # (B, H, R, n): each position's sorted index in each round
        if r > 1:  # N_ij: the rounds in whose P_i j is (1 with one round: log 1 = 0)
            scores = scores.sub_(self._duplicates(hashes, undo, sort, as_queries, as_keys, causal, c).log_())
        scores = torch.where(keep, scores, fill)
        z = scores.logsumexp(-1, keepdim=True)  # (B, H, R, nc, c, 1): z_r(i)
        weights = (scores - z).exp_()
        if p > 0.0:
            weights = F.dropout(weights, p=p)
        out = weights @ as_keys(sv, 0.0).transpose(-2, -1)  # (B, H, R, nc, c, d)
        out = out.view(b, h, r, nc * c, d)[..., :n, :]
        z = z.view(b, h, r, nc * c)[..., :n]  # back to the positions' order, by ``undo``
        out = out.gather(3, undo[..., None].expand(b, h, r, n, d))
        z = z.gather(3, undo)  # (B, H, R, n)
        share = z.softmax(2)  # exp(z_r(i) − z(i)): equation (4)'s rounds (softmax: exact at SELF)
        return (share[..., None] * out).sum(2)

    def _duplicates(self, hashes, undo, sort, as_queries, as_keys, causal: bool, c: int) -> Tensor:
        """N_ij of :meth:`_chunked`'s scores, [B, H, R, nc, c, span], at least 1: for the key j
        that round r puts in query i's span, the rounds r' in which j ∈ P_i^(r'), the same bucket
        and within the window of i in r''s sorted order (the paper's N_ij, counted over the sets
        attended, not over shared buckets: a key that shares i's bucket in another round but lies
        outside its window there is attended once). ``c``: the chunk :meth:`_chunked` uses. Bool
        comparisons of [c] against [span] per round, summed in float: exact small integers."""
        sorted_hashes = sort(hashes.transpose(-2, -1))  # (B, H, R, n, R): every round's bucket
        sorted_index = sort(undo.to(torch.int32).transpose(-2, -1))  # every round's sorted index
        hq, hk = as_queries(sorted_hashes, -1), as_keys(sorted_hashes, -2)  # (.., c, R), (.., R, span)
        iq, jk = as_queries(sorted_index, 0), as_keys(sorted_index, 0)
        duplicates = None
        for s in range(self.rounds):
            member = hq[..., s, None] == hk[..., s, None, :]  # (B, H, R, nc, c, span)
            i_s, j_s = iq[..., s, None], jk[..., s, None, :]  # (.., c, 1), (.., 1, span)
            if self.window == "chunks":  # j in i's chunk or the one before, in round s
                ci, cj = i_s // c, j_s // c
                member &= (cj == ci) | (cj == ci - 1)
            else:
                member &= j_s > i_s - c
                member &= (j_s <= i_s) if causal else (j_s < i_s + c)
            duplicates = member.float() if duplicates is None else duplicates.add_(member)
        return duplicates.clamp_(min=1)

    def new_state(self, max_steps: int) -> LSHCache:
        """An empty cache with room for ``max_steps`` positions and each bucket's last c (causal)."""
        return LSHCache(max_steps, self.chunk, self.buckets, self.rounds)


class SharedQKAttention(MultiHeadAttention):
    """Multi-head attention whose keys are its queries (shared-QK, section 2), for LSH attention."""

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries as keys and values, [batch, heads, len, d_head] each, from x [batch, len,
        d_model], without W_K (a third of the work), except at one position (a decoding step),
        where one product of all three rows costs less than two calls."""
        if x.size(1) == 1:
            q, _, v = super().project(x)
            return q, q, v
        d = self.d_model
        q = split_heads(self.in_proj.rows(x, 0, d), self.n_heads)
        return q, q, split_heads(self.in_proj.rows(x, 2 * d, 3 * d), self.n_heads)


def _check(cfg) -> None:
    """The LSH settings a bound cannot state (``registry.Mechanism.check``)."""
    if cfg.buckets > 1 and cfg.buckets % 2:
        raise ValueError(f"attention.buckets must be 1 or even, not {cfg.buckets}")
    if cfg.lsh_window not in WINDOWS:
        raise ValueError(f"attention.lsh_window is one of {', '.join(WINDOWS)}, not {cfg.lsh_window!r}")
    if cfg.lsh_window == "chunks" and cfg.decoder_self == "lsh":
        raise ValueError(
            "attention.lsh_window=chunks is for encoder_self: causal, a query's chunk would depend "
            "on later tokens' buckets; decoder_self=lsh needs lsh_window=sliding"
        )


register(
    Mechanism(
        "lsh",
        build=lambda cfg, d_head, dropout: LSHAttention(
            d_head, cfg.buckets, cfg.rounds, cfg.chunk_length, dropout=dropout, window=cfg.lsh_window
        ),
        settings=(
            Setting("buckets", 8, "lsh: hash buckets b, 1 or even", minimum=1),
            Setting("rounds", 2, "lsh: hash rounds, each with its own random rotations", minimum=1),
            Setting(
                "chunk_length",
                64,
                "lsh: sorted positions a query sees back (and forward unless causal)",
                minimum=1,
            ),
            Setting(
                "lsh_window",
                "sliding",
                "lsh: sliding (chunk_length each way) or chunks (Reformer's; encoder)",
            ),
        ),
        refuses={"cross": "its buckets hash one sequence's shared queries and keys; a source has no queries"},
        check=_check,
        layer=SharedQKAttention,
    )
)
