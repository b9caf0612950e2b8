"""Corpus BLEU and chrF for ``translate.py --reference``: ``common.metrics``, training's too."""

from common.metrics import CorpusScores, corpus_scores

__all__ = ["CorpusScores", "corpus_scores"]
