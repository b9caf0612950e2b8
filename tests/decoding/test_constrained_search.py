"""Lexically constrained beam search on the toy model of ``test_translate.py`` (a tiny Transformer
that learned a word-for-word task in seconds): every constraint in every output, batch
invariance, unmeetable lines, and the unconstrained search untouched."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from decoding import DecodingConfig
from decoding.constrained_search import constrained_beam_search
from decoding.ensemble import Ensemble
from decoding.search import beam_search
from tests.test_translate import toy_checkpoint
from tests.toy_text import LEXICON, toy_pairs
from translation.translator import Translator

__all__ = ["toy_checkpoint"]  # a fixture, used by name

PROPS = settings(max_examples=25, deadline=None, database=None)
PAIRS = toy_pairs(40, seed=11)  # sentences of 1 to 6 words and their references


@pytest.fixture(scope="module")
def toy(toy_checkpoint: Path) -> Translator:
    return Translator.from_checkpoint(toy_checkpoint)


def occurs_in_order(constraints: list[list[int]], output: list[int], ordered: bool) -> bool:
    """Whether each constraint occurs in ``output`` (ordered: each after the previous one's end)."""
    start = 0
    for c in constraints:
        found = next((i for i in range(start, len(output) - len(c) + 1) if output[i : i + len(c)] == c), None)
        if found is None:
            return False
        start = found + len(c) if ordered else 0
    return True


def draw_constraints(rng: random.Random, reference: str, most: int) -> list[str]:
    """Up to ``most`` constraints of one or two words: words of the reference line, and now and then
    any word of the toy's target vocabulary, which the source does not ask for."""
    words = reference.split()
    found = []
    for _ in range(rng.randint(0, most)):
        if rng.random() < 0.7:
            start = rng.randrange(len(words))
            found.append(" ".join(words[start : start + rng.randint(1, 2)]))
        else:
            found.append(rng.choice(list(LEXICON.values())))
    return found


def search(toy: Translator, lines: list[int], constraints: list[list[str]], **settings) -> list:
    """The hypotheses of PAIRS[lines] with their constraints, through the Searcher."""
    sources = toy.encode_sources([PAIRS[i][0] for i in lines])
    return toy.searcher.search_ids(sources, DecodingConfig(**settings), constraints=encoded(toy, constraints))


def encoded(toy: Translator, constraints: list[list[str]]) -> list[list[list[int]]]:
    """Each line's constraints as target ids, each encoded as a line of its own."""
    return [toy.tgt_tokenizer.encode(line) if line else [] for line in constraints]


def tokens(found: dict[int, list]) -> dict[int, list[list[int]]]:
    return {i: [h.tokens for h in hyps] for i, hyps in found.items()}


def scores(found: dict[int, list]) -> dict[int, list[float]]:
    return {i: [h.score for h in hyps] for i, hyps in found.items()}


@PROPS
@given(st.integers(0, 10**6), st.booleans(), st.integers(1, 4))
def test_every_constraint_is_in_every_nbest_entry(
    toy: Translator, seed: int, ordered: bool, beam: int
) -> None:
    rng = random.Random(seed)
    lines = rng.sample(range(len(PAIRS)), rng.randint(1, 5))
    given_ = [draw_constraints(rng, PAIRS[i][1], 3) for i in lines]
    order = "ordered" if ordered else "unordered"
    found = search(toy, lines, given_, beam_size=beam, nbest=rng.randint(1, beam), constraints_order=order)
    for constraints, hyps in zip(encoded(toy, given_), found, strict=True):
        assert hyps, "constraints of at most 6 words fit a limit of at least 13 subwords"
        for hyp in hyps:
            assert occurs_in_order(constraints, hyp.tokens, ordered), (constraints, hyp.tokens)
            assert hyp.score > float("-inf")


LINES = [0, 1, 2, 3, 4, 5, 6, 7]
CONSTRAINTS = [["dog"], ["the big", "cat"], [], ["quickly"], ["man", "woman"], ["street"], [], ["over red"]]


@pytest.mark.parametrize("order", ["unordered", "ordered"])
def test_a_line_gives_the_same_tokens_and_scores_alone_and_in_any_batch(toy: Translator, order: str) -> None:
    """The same hypotheses, in the same order; their scores the same up to float32 rounding, which
    depends on the shapes the model computes in (the unconstrained search's do alike)."""
    config = DecodingConfig(beam_size=4, nbest=3, constraints_order=order)
    sources = toy.encode_sources([PAIRS[i][0] for i in LINES])
    wanted = encoded(toy, CONSTRAINTS)

    def run(lines: list[int], max_tokens: int | None = None) -> dict[int, list]:
        found = toy.searcher.search_ids(
            [sources[i] for i in lines], config, max_tokens, constraints=[wanted[i] for i in lines]
        )
        return dict(zip(lines, found, strict=True))

    together = run(LINES)
    for found in (
        run(LINES, max_tokens=1),  # each line alone
        run([7, 2, 5, 0, 3, 6, 1, 4], max_tokens=60),  # shuffled, in batches of a few
        run([3, 1]),
    ):
        assert tokens(found) == {i: tokens(together)[i] for i in found}
        for i, values in scores(found).items():
            assert values == pytest.approx(scores(together)[i], rel=1e-5, abs=1e-5)


def test_an_unmeetable_line_gets_no_translation_and_the_others_theirs(toy: Translator) -> None:
    config = DecodingConfig(beam_size=3, nbest=2)
    sources = toy.encode_sources(["hund läuft", "kind", "frau springt"])  # limits: 14, 13, 14 subwords
    too_many = " ".join(["dog"] * 15)
    wanted = encoded(toy, [["cat"], [too_many], ["slowly"]])
    found = toy.searcher.search_ids(sources, config, constraints=wanted)
    assert found[1] == []
    alone = {i: toy.searcher.search_ids([sources[i]], config, constraints=[wanted[i]])[0] for i in (0, 2)}
    assert tokens({i: found[i] for i in (0, 2)}) == tokens(alone) and all(alone.values())
    # Exactly at the limit it is met: "kind" allows 1.5 * 2 + 10 = 13 subwords.
    fits = encoded(toy, [[" ".join(["dog"] * 13)]])
    assert toy.searcher.search_ids([sources[1]], config, constraints=fits)[0][0].tokens == fits[0][0]


def test_lines_without_constraints_are_searched_as_without_the_option(toy: Translator) -> None:
    config = DecodingConfig(beam_size=4, nbest=4)
    sources = toy.encode_sources([s for s, _ in PAIRS])
    plain = toy.searcher.search_ids(sources, config)
    none = toy.searcher.search_ids(sources, config, constraints=[[] for _ in sources])
    mixed = toy.searcher.search_ids(
        sources,
        config,
        constraints=encoded(toy, [["dog"] if i % 3 == 0 else [] for i in range(len(sources))]),
    )
    assert none == plain
    assert [m for i, m in enumerate(mixed) if i % 3] == [p for i, p in enumerate(plain) if i % 3]


def test_with_no_constraints_the_constrained_search_chooses_as_the_plain_one(toy: Translator) -> None:
    """One bank: the allocation order is the score order, and the candidates the plain search's."""
    src = toy.searcher.batch(toy.encode_sources([s for s, _ in PAIRS[:12]]))
    plain = beam_search(toy.model, src, toy.bos_id, toy.eos_id, beam_size=4, nbest=4)
    constrained = constrained_beam_search(
        toy.model, src, toy.bos_id, toy.eos_id, [[]] * 12, beam_size=4, nbest=4
    )
    assert [[h.tokens for h in hyps] for hyps in constrained] == [[h.tokens for h in hyps] for hyps in plain]
    for a, b in zip(constrained, plain, strict=True):
        torch.testing.assert_close(torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]))


def test_constraints_compose_with_a_prefix_the_no_repeat_rule_and_an_ensemble(toy: Translator) -> None:
    src = toy.searcher.batch(toy.encode_sources(["ein hund läuft", "kind", "frau springt schnell"]))
    wanted = encoded(toy, [["cat", "red"], ["street"], ["big dog"]])
    prefixes = toy.tgt_tokenizer.encode(["the", "a small", ""])
    found = constrained_beam_search(
        toy.model,
        src,
        toy.bos_id,
        toy.eos_id,
        wanted,
        beam_size=4,
        nbest=2,
        no_repeat_ngram=1,
        prefixes=prefixes,
    )
    for hyps, constraints, prefix in zip(found, wanted, prefixes, strict=True):
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix and occurs_in_order(constraints, h.tokens, False)
            assert len(set(h.tokens)) == len(h.tokens)  # no token twice
    alone = constrained_beam_search(toy.model, src, toy.bos_id, toy.eos_id, wanted, beam_size=4)
    pair = constrained_beam_search(
        Ensemble([toy.model, toy.model]), src, toy.bos_id, toy.eos_id, wanted, beam_size=4
    )
    assert [[h.tokens for h in hyps] for hyps in pair] == [[h.tokens for h in hyps] for hyps in alone]


def test_greedy_search_and_sampling_refuse_constraints(toy: Translator) -> None:
    sources = toy.encode_sources(["hund"])
    for config in (DecodingConfig(greedy=True), DecodingConfig(sampling=True)):
        with pytest.raises(ValueError, match=f"lexical constraints need beam search: drop {config.search}"):
            toy.searcher.search_ids(sources, config, constraints=[[[5]]])
    with pytest.raises(ValueError, match="constraints_order='sideways' must be one of unordered, ordered"):
        DecodingConfig(constraints_order="sideways")
