"""bench/alignment_error.py: the alignment error rate it reports, on links whose AER is known."""

from __future__ import annotations

import pytest

from bench.alignment_error import alignment_error_rate, precision_recall, read_links


def test_aer_is_one_minus_the_f_score_against_sure_links() -> None:
    gold = [read_links("0-0 1-1 2-2"), read_links("0-1")]
    assert alignment_error_rate(gold, gold) == 0.0
    assert alignment_error_rate([set(), {(5, 5)}], gold) == 1.0
    predicted = [read_links("0-0 1-1 1-2"), read_links("0-1 1-1")]  # 3 of 5 links right, 4 gold
    assert alignment_error_rate(predicted, gold) == pytest.approx(1 - 2 * 3 / (5 + 4))
    assert precision_recall(predicted, gold) == pytest.approx((3 / 5, 3 / 4))


def test_possible_links_count_for_precision_only() -> None:
    """Och and Ney: 1 - (|A∩S| + |A∩P|) / (|A| + |S|), P ⊇ S."""
    sure, possible = [read_links("0-0")], [read_links("0-0 1-0")]
    assert alignment_error_rate([read_links("0-0 1-0")], sure, possible) == 0.0
    assert alignment_error_rate([read_links("1-0")], sure, possible) == pytest.approx(1 - 1 / 2)
