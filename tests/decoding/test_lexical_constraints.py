"""The constraints' automata and the beam's allocation order, against their definitions (no model)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from decoding.constrained_search import allocation_order
from decoding.lexical_constraints import ConstraintTables, transitions

PROPS = settings(max_examples=100, deadline=None, database=None)
# A three-token alphabet, so that constraints overlap, repeat and half-match often.
TOKENS = st.integers(4, 6)
CONSTRAINTS = st.lists(st.lists(TOKENS, min_size=1, max_size=3), min_size=1, max_size=3)


def occurs(constraint: list[int], output: list[int]) -> bool:
    n = len(constraint)
    return any(output[i : i + n] == constraint for i in range(len(output) - n + 1))


def occur_in_order(constraints: list[list[int]], output: list[int]) -> int:
    """How many of the constraints occur one after the other, each after the previous one's end
    (the earliest occurrence of each: never worse)."""
    start = 0
    for met, constraint in enumerate(constraints):
        n = len(constraint)
        found = next((i for i in range(start, len(output) - n + 1) if output[i : i + n] == constraint), None)
        if found is None:
            return met
        start = found + n
    return len(constraints)


def longest_partial(constraint: list[int], output: list[int]) -> int:
    """The longest proper prefix of the constraint that ends the output."""
    return max(k for k in range(len(constraint)) if k == 0 or output[len(output) - k :] == constraint[:k])


def read(
    constraints: list[list[int]], output: list[int], ordered: bool
) -> tuple[ConstraintTables, list[Tensor]]:
    """The tables of one sentence and its progress after each prefix of ``output``: [1, 1, C] each."""
    tables = ConstraintTables.of([constraints], ordered, torch.device("cpu"))
    matched = tables.start(1)[None]  # (1, 1, C)
    seen = [matched]
    for token in output:
        matched = tables.advance(matched, torch.tensor([[token]]))
        seen.append(matched)
    return tables, seen


@PROPS
@given(CONSTRAINTS, st.lists(TOKENS, max_size=12))
def test_unordered_progress_is_what_each_constraint_has_matched_of_the_output(constraints, output):
    tables, seen = read(constraints, output, ordered=False)
    for t, matched in enumerate(seen):
        prefix = output[:t]
        for j, c in enumerate(constraints):
            expected = len(c) if occurs(c, prefix) else longest_partial(c, prefix)
            assert int(matched[0, 0, j]) == expected, (c, prefix)
        assert bool(tables.finished(matched)) == all(occurs(c, prefix) for c in constraints)


@PROPS
@given(CONSTRAINTS, st.lists(TOKENS, max_size=12))
def test_ordered_progress_meets_the_constraints_one_after_the_other(constraints, output):
    tables, seen = read(constraints, output, ordered=True)
    for t, matched in enumerate(seen):
        prefix = output[:t]
        met = int(tables.met(matched)[0, 0].sum())
        assert met == occur_in_order(constraints, prefix)
        assert bool(tables.met(matched)[0, 0, :met].all())  # the first ``met`` ones, in order
        assert bool(tables.finished(matched)) == (met == len(constraints))


@PROPS
@given(CONSTRAINTS, st.lists(TOKENS, max_size=8), st.booleans())
def test_a_wanted_token_raises_the_bank_by_one_at_least(constraints, output, ordered):
    """Why the search meets constraints of T tokens within T steps: each beam is offered every token
    its constraints want, one of which (the one that extends its longest partial match) raises its
    bank, and the best of the highest bank is always kept. (Another may lower it: a partial match
    broken for another constraint.)"""
    tables, seen = read(constraints, output, ordered)
    matched = seen[-1]
    wanted = tables.wanted(matched)[0, 0]  # (C,)
    assert bool(tables.finished(matched)) == bool((wanted < 0).all())
    if tables.finished(matched):
        return
    banks = [
        int(tables.banks(tables.advance(matched, torch.tensor([[token]])))) for token in wanted[wanted >= 0]
    ]
    assert max(banks) >= int(tables.banks(matched)) + 1


@PROPS
@given(st.lists(CONSTRAINTS, min_size=1, max_size=4), st.lists(TOKENS, max_size=8), st.booleans())
def test_a_sentence_progresses_alike_alone_and_in_a_padded_batch(batch, output, ordered):
    together = ConstraintTables.of(batch, ordered, torch.device("cpu"))
    n = len(batch)
    matched = together.start(1).view(n, 1, -1)
    alone = [ConstraintTables.of([c], ordered, torch.device("cpu")) for c in batch]
    single = [a.start(1)[None] for a in alone]
    for token in output:
        matched = together.advance(matched, torch.full((n, 1), token))
        single = [a.advance(m, torch.tensor([[token]])) for a, m in zip(alone, single, strict=True)]
        for i, (a, m) in enumerate(zip(alone, single, strict=True)):
            width = len(batch[i])
            assert matched[i, 0, :width].tolist() == m[0, 0].tolist()
            assert int(together.banks(matched)[i]) == int(a.banks(m))


def test_transitions_fall_back_to_the_longest_prefix_still_matched():
    # a a b: after "a a", another "a" keeps "a a" matched, "b" completes it; anything else: 0.
    assert transitions([4, 4, 5]) == [[1, 1, 0], [2, 2, 0], [2, 2, 3], [3, 3, 3]]


def test_allocation_takes_the_banks_round_robin_best_bank_first():
    # fairseq's example: banks 3 3 3 2 2 2 2 1 1 1 0 0, each bank's candidates best first.
    banks = torch.tensor([[3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 0, 0]])
    scores = -torch.arange(12.0)[None]
    order = allocation_order(scores, banks)
    assert banks.gather(1, order).tolist() == [[3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 2]]


@PROPS
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-20, 0) | st.just(None)), min_size=1, max_size=16))
def test_allocation_order_is_a_permutation_best_first_within_each_bank(candidates):
    banks = torch.tensor([[b for b, _ in candidates]])
    scores = torch.tensor([[float("-inf") if s is None else float(s) for _, s in candidates]])
    order = allocation_order(scores, banks)[0].tolist()
    assert sorted(order) == list(range(len(candidates)))
    taken = [candidates[i] for i in order]
    valid = [s is not None for _, s in taken]
    assert valid == sorted(valid, reverse=True)  # the non-candidates (-inf) last
    for bank in range(4):
        in_bank = [s for b, s in taken if b == bank and s is not None]
        assert in_bank == sorted(in_bank, reverse=True)
    # Round-robin: among the candidates, the r-th of a bank never comes before the (r-1)-th of another.
    rank, seen = [], {}
    for b, s in taken:
        if s is not None:
            rank.append(seen.get(b, 0))
            seen[b] = seen.get(b, 0) + 1
    assert rank == sorted(rank)
