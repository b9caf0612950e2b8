"""Corpus BLEU, chrF and TER: perfect output scores 100 (TER 0), the signatures say how, BLEU's
tokenizer follows the target language, counts must match."""

from __future__ import annotations

import importlib.util

import pytest

from common.metrics import corpus_scores


def test_perfect_hypotheses_score_100_and_lowercasing_is_its_own_metric():
    refs = ["A dog runs over the meadow .", "Two people sit on a bench ."]
    scores = corpus_scores(refs, refs)
    assert scores.bleu == pytest.approx(100) and scores.chrf == pytest.approx(100)
    assert corpus_scores([r.lower() for r in refs], refs).bleu < 100
    assert corpus_scores([r.lower() for r in refs], refs).bleu_lowercase == pytest.approx(100)
    assert "case:lc" in scores.bleu_lowercase_signature and "case:mixed" in scores.bleu_signature
    assert scores.ter == pytest.approx(0) and scores.ter_signature.startswith("nrefs:1|case:lc|tok:tercom")
    assert len(scores.report().splitlines()) == 4


def test_bleus_tokenizer_follows_the_target_language_or_is_given():
    refs, hyps = ["我们 去 公园 散步 。", "今天 天气 很好"], ["我们去公园散步。", "今天天气很好"]
    spaced = corpus_scores(hyps, refs)  # 13a splits on spaces: Chinese without them scores ~0
    chinese = corpus_scores(hyps, refs, target_lang="zh")
    assert "tok:13a" in spaced.bleu_signature and spaced.bleu < 10
    assert "tok:zh" in chinese.bleu_signature and chinese.bleu > spaced.bleu
    assert "tok:13a" in corpus_scores(refs, refs, target_lang="en").bleu_signature
    assert "tok:char" in corpus_scores(refs, refs, target_lang="en", tokenize="char").bleu_signature
    with pytest.raises(ValueError, match="BLEU's tokenizer 'nonsense'"):
        corpus_scores(refs, refs, tokenize="nonsense")


def test_a_tokenizer_whose_package_is_missing_says_what_to_install():
    if importlib.util.find_spec("MeCab") is None:  # the cjk extra's module, absent by default
        with pytest.raises(ValueError, match=r"ja-mecab.*sacrebleu\[ja\]"):
            corpus_scores(["猫"], ["猫"], target_lang="ja")
    else:
        assert "tok:ja-mecab" in corpus_scores(["猫"], ["猫"], target_lang="ja").bleu_signature


def test_hypotheses_and_references_must_pair_up():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"])
