"""The writing systems of languages, for ``data.filters.script``: which share of a text's letters
is in its language's script.

A crawled "Chinese" side in Latin letters, or a Russian one left in English, is no translation.
OpusFilter's ``CharacterScoreFilter`` checks this as the share of a side's letters (Unicode
category L*) that belong to the expected script; so does :func:`script_share`. A letter's script
is the first word of its Unicode name (``LATIN SMALL LETTER A``, ``CYRILLIC ...``, ``CJK UNIFIED
IDEOGRAPH-4E00``: Han, ``HIRAGANA ...``, ``HANGUL SYLLABLE ...``), read with the standard
library's ``unicodedata``; no table of code point ranges to keep up to date. Digits, punctuation,
spaces and combining marks are no letters and do not count; a side without letters (``"2015"``)
has no share and is left to the other filters.
"""

from __future__ import annotations

import functools
import unicodedata

LATIN = frozenset({"Latin"})
CYRILLIC = frozenset({"Cyrillic"})
ARABIC = frozenset({"Arabic"})
DEVANAGARI = frozenset({"Devanagari"})

# A language (ISO 639-1, or 639-3 where it has none) to the scripts its letters are written in.
LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        "af az br bs ca cs cy da de en eo es et eu fi fil fo fr fy ga gd gl ha hr ht hu id ig is it jv "
        "ku la lb lt lv mg ms mt nb nl nn no oc pl pt qu ro rw sk sl so sq sv sw tk tl tr uz vi wa xh yo "
        "zu".split(),
        LATIN,
    ),
    **dict.fromkeys("ru uk be bg mk kk ky mn tg tt ba".split(), CYRILLIC),
    "sr": frozenset({"Cyrillic", "Latin"}),  # Serbian is written in both
    **dict.fromkeys("ar fa ur ps ug sd ckb".split(), ARABIC),
    **dict.fromkeys("hi mr ne sa".split(), DEVANAGARI),
    **dict.fromkeys("he yi".split(), frozenset({"Hebrew"})),
    **dict.fromkeys("am ti".split(), frozenset({"Ethiopic"})),
    **dict.fromkeys("bo dz".split(), frozenset({"Tibetan"})),
    "el": frozenset({"Greek"}),
    "bn": frozenset({"Bengali"}),
    "as": frozenset({"Bengali"}),
    "pa": frozenset({"Gurmukhi"}),
    "gu": frozenset({"Gujarati"}),
    "or": frozenset({"Oriya"}),
    "ta": frozenset({"Tamil"}),
    "te": frozenset({"Telugu"}),
    "kn": frozenset({"Kannada"}),
    "ml": frozenset({"Malayalam"}),
    "si": frozenset({"Sinhala"}),
    "th": frozenset({"Thai"}),
    "lo": frozenset({"Lao"}),
    "km": frozenset({"Khmer"}),
    "my": frozenset({"Myanmar"}),
    "ka": frozenset({"Georgian"}),
    "hy": frozenset({"Armenian"}),
    "dv": frozenset({"Thaana"}),
    "zh": frozenset({"Han"}),
    "ja": frozenset({"Han", "Hiragana", "Katakana"}),
    "ko": frozenset({"Hangul"}),
}
# Unicode name words that are not the script's own name.
_ALIASES = {"CJK": "Han", "IDEOGRAPHIC": "Han", "KATAKANA-HIRAGANA": "Katakana"}
# Name words that qualify a letter rather than name its script (NFKC folds most of them away).
_QUALIFIERS = frozenset({"FULLWIDTH", "HALFWIDTH", "SMALL", "CAPITAL"})


def language_code(lang: str) -> str:
    """The language part of a corpus's language name: ``"zh_CN"`` -> ``"zh"``, ``"en-GB"`` -> ``"en"``."""
    return lang.replace("_", "-").split("-")[0].lower()


def scripts_of(lang: str) -> frozenset[str] | None:
    """The scripts ``lang`` is written in (:data:`LANGUAGE_SCRIPTS`); None where it is not listed."""
    return LANGUAGE_SCRIPTS.get(language_code(lang))


@functools.lru_cache(maxsize=65536)
def script_of(char: str) -> str | None:
    """The script of a letter (``"Latin"``, ``"Han"``, ``"Hiragana"``, ...); None for what is no letter
    (digits, punctuation, marks, spaces) or a modifier letter of no script."""
    if not unicodedata.category(char).startswith("L"):
        return None
    words = [w for w in unicodedata.name(char, "").split() if w not in _QUALIFIERS]
    if not words or words[0] == "MODIFIER":
        return None
    return _ALIASES.get(words[0], words[0].title())


def script_share(text: str, scripts: frozenset[str]) -> float | None:
    """The share of ``text``'s letters written in one of ``scripts``; None where it has no letter.

    Args:
        text: one side of a pair, as read.
        scripts: the scripts of its language (:func:`scripts_of`).
    """
    letters = inside = 0
    for char in unicodedata.normalize("NFKC", text):
        script = script_of(char)
        if script is not None:
            letters += 1
            inside += script in scripts
    return inside / letters if letters else None
