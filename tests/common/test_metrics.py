"""Corpus BLEU and chrF: perfect output scores 100, the signatures say how, counts must match."""

from __future__ import annotations

import pytest

from common.metrics import corpus_scores


def test_perfect_hypotheses_score_100_and_lowercasing_is_its_own_metric():
    refs = ["A dog runs over the meadow .", "Two people sit on a bench ."]
    scores = corpus_scores(refs, refs)
    assert scores.bleu == pytest.approx(100) and scores.chrf == pytest.approx(100)
    assert corpus_scores([r.lower() for r in refs], refs).bleu < 100
    assert corpus_scores([r.lower() for r in refs], refs).bleu_lowercase == pytest.approx(100)
    assert "case:lc" in scores.bleu_lowercase_signature and "case:mixed" in scores.bleu_signature
    assert len(scores.report().splitlines()) == 3


def test_hypotheses_and_references_must_pair_up():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"])
