"""Corpus BLEU, chrF and TER through sacrebleu, with their signatures, for any target language.

BLEU counts words, so its tokenizer must suit the target language: sacreBLEU's ``13a`` splits on
spaces and punctuation, which is meaningless for Chinese, Japanese and Korean. The tokenizer is
sacreBLEU's own choice for the target language (``BLEU(trg_lang=...)``: ``zh``, ``ja-mecab``,
``ko-mecab``, else ``13a``), or the one given (``tokenize``, any of sacreBLEU's); its name is in
the signature. The Japanese and Korean ones need MeCab, from sacrebleu's extras (``pip install
"sacrebleu[ja]"`` or ``"sacrebleu[ko]"``): without them the error says so. chrF needs no
tokenizer; TER (Snover et al. 2006, sacreBLEU's) takes ``asian_support`` for those languages.
"""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER

# Target languages whose text has no spaces between words: TER splits their characters.
ASIAN = ("zh", "ja", "ko")
# What to install for sacreBLEU's MeCab tokenizers.
EXTRAS = {
    "ja-mecab": 'python3 -m pip install "sacrebleu[ja]"',
    "ko-mecab": 'python3 -m pip install "sacrebleu[ko]"',
}


@dataclass
class CorpusScores:
    """sacreBLEU cased and lowercased, chrF, TER, and the signatures that make them reproducible."""

    bleu: float
    bleu_lowercase: float
    chrf: float
    bleu_signature: str
    bleu_lowercase_signature: str
    chrf_signature: str
    ter: float = float("nan")
    ter_signature: str = ""

    def report(self) -> str:
        """One line per metric: score and signature."""
        return (
            f"BLEU {self.bleu:.2f}  {self.bleu_signature}\n"
            f"BLEU (lowercased) {self.bleu_lowercase:.2f}  {self.bleu_lowercase_signature}\n"
            f"chrF {self.chrf:.2f}  {self.chrf_signature}\n"
            f"TER {self.ter:.2f}  {self.ter_signature}"
        )


def bleu_metrics(target_lang: str | None = None, tokenize: str | None = None) -> tuple[BLEU, BLEU]:
    """sacreBLEU's cased and lowercased BLEU for ``target_lang`` (its tokenizer), or with ``tokenize``.

    Raises:
        ValueError: an unknown tokenizer, or one whose package is not installed, saying what to do.
    """
    lang = (target_lang or "").split("-")[0].lower()
    try:
        return (
            BLEU(tokenize=tokenize, trg_lang=lang),
            BLEU(tokenize=tokenize, trg_lang=lang, lowercase=True),
        )
    except (ImportError, RuntimeError, KeyError, ValueError) as err:
        chosen = tokenize or {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}.get(lang, "13a")
        how = EXTRAS.get(chosen, "one of sacreBLEU's tokenizers (sacrebleu --help: --tokenize)")
        raise ValueError(
            f"BLEU's tokenizer {chosen!r} (target language {lang or 'not given'}) cannot be used: "
            f"{type(err).__name__}: {' '.join(str(err).split())} It needs {how}; or choose another tokenizer"
        ) from None


def check_bleu_tokenizers(languages: list[str], tokenize: str | None, key: str) -> None:
    """Makes BLEU's tokenizer for each target language to be scored (``tokenize``, or the
    language's own), so that a missing extra or an unknown name stops a program before its work
    rather than at its first score.

    Raises:
        ValueError: one cannot be made, naming ``key`` (the setting), the language and what to install.
    """
    for language in languages:
        try:
            bleu_metrics(language, tokenize)
        except ValueError as err:
            extra = (
                ' (the project\'s cjk extra has both MeCab tokenizers: python3 -m pip install -e ".[cjk]")'
            )
            raise ValueError(f"{key}={tokenize}: {err}{extra if 'mecab' in str(err) else ''}") from None


def corpus_scores(
    hypotheses: list[str],
    references: list[str],
    target_lang: str | None = None,
    tokenize: str | None = None,
) -> CorpusScores:
    """Scores detokenized hypotheses against one reference each (same order, same count).

    Args:
        hypotheses, references: the outputs and their references.
        target_lang: their language (``en``, ``zh``, ...), which chooses BLEU's tokenizer.
        tokenize: BLEU's tokenizer instead (``13a``, ``intl``, ``char``, ``zh``, ``ja-mecab``, ...).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    cased, lowercased = bleu_metrics(target_lang, tokenize)
    chrf = CHRF()
    ter = TER(asian_support=(target_lang or "").split("-")[0].lower() in ASIAN)
    refs = [references]
    return CorpusScores(
        bleu=cased.corpus_score(hypotheses, refs).score,
        bleu_lowercase=lowercased.corpus_score(hypotheses, refs).score,
        chrf=chrf.corpus_score(hypotheses, refs).score,
        bleu_signature=str(cased.get_signature()),
        bleu_lowercase_signature=str(lowercased.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        ter=ter.corpus_score(hypotheses, refs).score,
        ter_signature=str(ter.get_signature()),
    )
