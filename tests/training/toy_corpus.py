"""A toy parallel corpus on disk, in the Multi30k file layout, for training tests."""

from __future__ import annotations

import random
from pathlib import Path

SOURCE_WORDS = "ein zwei drei vier fuenf sechs sieben acht neun zehn hund katze haus baum rot blau".split()
TARGET_WORDS = "one two three four five six seven eight nine ten dog cat house tree red blue".split()
LEXICON = dict(zip(SOURCE_WORDS, TARGET_WORDS, strict=True))


def toy_pair(rng: random.Random) -> tuple[str, str]:
    """A source sentence of 2-6 words and its word-by-word translation."""
    words = [rng.choice(SOURCE_WORDS) for _ in range(rng.randint(2, 6))]
    return " ".join(words), " ".join(LEXICON[w] for w in words)


def write_toy_corpus(directory: Path, sizes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """Writes ``{train,val,test}.{de,en}`` under ``directory`` and returns it."""
    sizes = sizes or {"train": 1000, "val": 24, "test": 24}
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        pairs = [toy_pair(rng) for _ in range(n)]
        (directory / f"{split}.de").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (directory / f"{split}.en").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return directory
