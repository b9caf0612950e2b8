"""Corpus BLEU and chrF through sacrebleu, with their signatures."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF


@dataclass
class CorpusScores:
    """sacreBLEU cased and lowercased, chrF, and the signatures that make them reproducible."""

    bleu: float
    bleu_lowercase: float
    chrf: float
    bleu_signature: str
    bleu_lowercase_signature: str
    chrf_signature: str

    def report(self) -> str:
        """Three lines, one per metric: score and signature."""
        return (
            f"BLEU {self.bleu:.2f}  {self.bleu_signature}\n"
            f"BLEU (lowercased) {self.bleu_lowercase:.2f}  {self.bleu_lowercase_signature}\n"
            f"chrF {self.chrf:.2f}  {self.chrf_signature}"
        )


def corpus_scores(hypotheses: list[str], references: list[str]) -> CorpusScores:
    """Scores detokenized hypotheses against one reference each (same order, same count)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    cased, lowercased, chrf = BLEU(), BLEU(lowercase=True), CHRF()
    refs = [references]
    return CorpusScores(
        bleu=cased.corpus_score(hypotheses, refs).score,
        bleu_lowercase=lowercased.corpus_score(hypotheses, refs).score,
        chrf=chrf.corpus_score(hypotheses, refs).score,
        bleu_signature=str(cased.get_signature()),
        bleu_lowercase_signature=str(lowercased.get_signature()),
        chrf_signature=str(chrf.get_signature()),
    )
