"""Synthetic parallel text for the data tests (a module, so tests can import it)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

# A toy "German" -> "English" lexicon; sentences are word-for-word translations.
LEXICON = {
    "ein": "a",
    "der": "the",
    "hund": "dog",
    "katze": "cat",
    "mann": "man",
    "frau": "woman",
    "kind": "child",
    "läuft": "runs",
    "springt": "jumps",
    "sitzt": "sits",
    "schnell": "quickly",
    "langsam": "slowly",
    "über": "over",
    "unter": "under",
    "straße": "street",
    "wiese": "meadow",
    "rote": "red",
    "blaue": "blue",
    "große": "big",
    "kleine": "small",
}


def make_pairs(n: int, seed: int, min_len: int = 2, max_len: int = 14) -> list[tuple[str, str]]:
    """``n`` random sentence pairs of ``min_len`` to ``max_len`` words."""
    rng = random.Random(seed)
    words = list(LEXICON)
    pairs = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(min_len, max_len))]
        pairs.append((" ".join(src) + " .", " ".join(LEXICON[w] for w in src) + " ."))
    return pairs


def write_split(directory: Path, split: str, pairs: list[tuple[str, str]], gz: bool = True) -> None:
    """Write ``{split}.de[.gz]`` and ``{split}.en[.gz]``, one sentence per ``\\n``-ended line."""
    directory.mkdir(parents=True, exist_ok=True)
    for lang, side in (("de", 0), ("en", 1)):
        payload = "".join(p[side] + "\n" for p in pairs).encode("utf-8")
        if gz:
            with gzip.open(directory / f"{split}.{lang}.gz", "wb") as f:
                f.write(payload)
        else:
            (directory / f"{split}.{lang}").write_bytes(payload)
