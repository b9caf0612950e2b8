"""Lexical constraints: target subword sequences an output must contain, and each hypothesis's
progress through them, advanced for a whole batch of candidates at once.

A sentence has C constraints, each a sequence c_j of L_j >= 1 target ids. A hypothesis's
progress is one number per constraint, ``matched[j]`` in 0..L_j:

* L_j: c_j has occurred in the output (met; it stays met);
* below L_j: the length of the longest prefix of c_j that ends the output so far. This is the
  state of c_j's Knuth-Morris-Pratt automaton: a token that breaks a partial match falls back to
  the longest prefix still matched, so that no occurrence is missed (``a a b`` in ``a a a b``).

**Unordered** (the default): every constraint advances on every token, each on its own; each
must occur somewhere, and occurrences may overlap ("big dog" and "dog" are both met by "big
dog"; a constraint given twice is met by one occurrence). **Ordered**: only the first unmet
constraint advances, so c_1 occurs, then c_2 after c_1's end, and so on (a constraint given
twice occurs twice). Reading the earliest occurrence of each is never worse: the earlier c_j
ends, the more room c_{j+1} has.

fairseq (``token_generation_constraints.py``) keeps unordered constraints in a trie, one partial
match at a time, in one Python object per hypothesis. One automaton per constraint, tabulated
(:func:`transitions`), makes the progress of every candidate of every sentence one tensor,
advanced by one gather per step (:meth:`ConstraintTables.advance`). The tables cost
O(C * L^2) integers per sentence.

The **bank** of a hypothesis (Post & Vilar 2018) is the number of constraint tokens it has met:
the lengths of its met constraints plus its longest partial match (:meth:`ConstraintTables.banks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# One sentence's constraints: target id sequences, each of one id or more.
SentenceConstraints = Sequence[Sequence[int]]


def transitions(constraint: Sequence[int]) -> list[list[int]]:
    """The progress after each token of the constraint, from each progress: [L + 1][L].

    Row ``s`` (a prefix of ``s`` tokens matched), column ``q``: the longest prefix of the
    constraint that ends ``constraint[:s] + [constraint[q]]``; any token that is not in the
    constraint leads to 0. Row L (met) stays L. Written as the definition, O(L^3): constraints
    are a few tokens long.
    """
    length = len(constraint)
    table = []
    for s in range(length):
        row = []
        for q in range(length):
            seen = [*constraint[:s], constraint[q]]
            row.append(max(k for k in range(s + 2) if seen[len(seen) - k :] == list(constraint[:k])))
        table.append(row)
    return [*table, [length] * length]


@dataclass
class ConstraintTables:
    """The constraints of a batch of sentences, as tensors, padded to C constraints of L ids.

    A sentence with fewer than C constraints has empty slots of length 0, met from the start.

    Attributes:
        tokens: [n, C, L] long, each constraint's ids, -1 after its end.
        lengths: [n, C] long, L_j (0 for an empty slot).
        steps: [n, C, L + 1, L] long, :func:`transitions` of each constraint (0 in padding).
        ordered: whether the constraints must occur in their order.
    """

    tokens: Tensor
    lengths: Tensor
    steps: Tensor
    ordered: bool

    @classmethod
    def of(
        cls, constraints: Sequence[SentenceConstraints], ordered: bool, device: torch.device
    ) -> ConstraintTables:
        """Tables of ``n`` sentences' constraints (each an id sequence, none empty)."""
        if any(not c for sentence in constraints for c in sentence):
            raise ValueError("a lexical constraint must have at least one token")
        n = len(constraints)
        width = max((len(sentence) for sentence in constraints), default=0)
        longest = max((len(c) for sentence in constraints for c in sentence), default=1)
        tokens = torch.full((n, width, longest), -1, dtype=torch.long)
        lengths = torch.zeros(n, width, dtype=torch.long)
        steps = torch.zeros(n, width, longest + 1, longest, dtype=torch.long)
        for i, sentence in enumerate(constraints):
            for j, c in enumerate(sentence):
                tokens[i, j, : len(c)] = torch.tensor(list(c))
                lengths[i, j] = len(c)
                steps[i, j, : len(c) + 1, : len(c)] = torch.tensor(transitions(c))  # (L_j + 1, L_j)
        return cls(tokens.to(device), lengths.to(device), steps.to(device), ordered)

    def select(self, sentences: Tensor) -> ConstraintTables:
        """The tables of sentences ``sentences`` ([m] indices), in that order."""
        return ConstraintTables(
            self.tokens[sentences], self.lengths[sentences], self.steps[sentences], self.ordered
        )

    def start(self, rows_per_sentence: int) -> Tensor:
        """The progress of ``rows_per_sentence`` fresh hypotheses per sentence: [n * rows, C] zeros."""
        n, width = self.lengths.shape
        return self.lengths.new_zeros(n * rows_per_sentence, width)

    def met(self, matched: Tensor) -> Tensor:
        """matched [n, X, C] -> bool [n, X, C]: which constraints each hypothesis has met."""
        return matched == self.lengths[:, None]

    def finished(self, matched: Tensor) -> Tensor:
        """matched [n, X, C] -> bool [n, X]: whether a hypothesis has met all its constraints."""
        return self.met(matched).all(dim=-1)

    def banks(self, matched: Tensor) -> Tensor:
        """matched [n, X, C] -> [n, X]: the constraint tokens met (met lengths + longest partial match)."""
        met = self.met(matched)
        partial = matched.masked_fill(met, 0).amax(dim=-1) if matched.size(-1) else 0
        return (self.lengths[:, None] * met).sum(dim=-1) + partial

    def moving(self, matched: Tensor) -> Tensor:
        """matched [n, X, C] -> bool [n, X, C]: the constraints the next token advances: every unmet
        one, or, ordered, the first unmet one only."""
        unmet = ~self.met(matched)
        return unmet & (unmet.cumsum(dim=-1) == 1) if self.ordered else unmet

    def wanted(self, matched: Tensor) -> Tensor:
        """matched [n, X, C] -> [n, X, C]: the token that extends each moving constraint's match,
        -1 for the others."""
        n, x, _ = matched.shape
        tokens = self.tokens[:, None].expand(n, x, *self.tokens.shape[1:])  # (n, X, C, L)
        nxt = tokens.gather(3, matched.clamp(max=tokens.size(3) - 1)[..., None]).squeeze(3)  # (n, X, C)
        return nxt.masked_fill(~self.moving(matched), -1)

    def advance(self, matched: Tensor, tokens: Tensor) -> Tensor:
        """The progress after one more token.

        Args:
            matched: [n, X, C] progress of X hypotheses of each sentence.
            tokens: [n, X] the token each of them is extended by.

        Returns:
            [n, X, C].
        """
        n, x, width = matched.shape
        longest = self.tokens.size(2)
        hit = self.tokens[:, None] == tokens[:, :, None, None]  # (n, X, C, L): where the token is in c_j
        table = self.steps[:, None].expand(n, x, width, longest + 1, longest)
        at = matched[..., None, None].expand(n, x, width, 1, longest)
        row = table.gather(3, at).squeeze(3)  # (n, X, C, L): the row of each progress
        # Every column of the same token holds the same next state; 0 where the token is not in c_j.
        after = (row * hit).amax(dim=-1)  # (n, X, C)
        return torch.where(self.moving(matched), after, matched)
