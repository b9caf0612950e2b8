"""A toy word-for-word translation task and word-level SentencePiece models, for the tests."""

from __future__ import annotations

import io
import random

import sentencepiece as spm

# A toy "German" -> "English" lexicon; a sentence translates word by word, in order.
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


def translate_words(sentence: str) -> str:
    """The reference translation; ``?`` for a word outside the lexicon."""
    return " ".join(LEXICON.get(w, "?") for w in sentence.split())


def toy_pairs(n: int, seed: int, max_words: int = 6) -> list[tuple[str, str]]:
    """``n`` random (source, target) sentence pairs of 1 to ``max_words`` words."""
    rng = random.Random(seed)
    words = list(LEXICON)
    pairs = []
    for _ in range(n):
        src = " ".join(rng.choice(words) for _ in range(rng.randint(1, max_words)))
        pairs.append((src, translate_words(src)))
    return pairs


def train_word_spm(texts: list[str], project_ids: bool = True) -> bytes:
    """A word-level SentencePiece model (one piece per word, 4 special ids first); its bytes.

    Args:
        texts: training sentences.
        project_ids: the project's pad/unk/bos/eos = 0/1/2/3; False keeps SentencePiece's
            defaults (unk/bos/eos = 0/1/2, no pad), which the project must refuse.
    """
    ids = dict(pad_id=0, unk_id=1, bos_id=2, eos_id=3) if project_ids else {}
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type="word",
        vocab_size=100,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        **ids,
    )
    return model.getvalue()
