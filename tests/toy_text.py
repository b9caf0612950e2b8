"""The toy translation task every test shares: a word-for-word lexicon, pairs, files, subwords."""

from __future__ import annotations

import gzip
import io
import random
from pathlib import Path

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


def make_pairs(
    n: int, seed: int, min_len: int = 2, max_len: int = 14, period: bool = True
) -> list[tuple[str, str]]:
    """``n`` random (source, target) pairs of ``min_len`` to ``max_len`` words (+ " ." if ``period``)."""
    rng = random.Random(seed)
    words = list(LEXICON)
    end = " ." if period else ""
    pairs = []
    for _ in range(n):
        src = " ".join(rng.choice(words) for _ in range(rng.randint(min_len, max_len)))
        pairs.append((src + end, translate_words(src) + end))
    return pairs


def toy_pairs(n: int, seed: int, max_words: int = 6) -> list[tuple[str, str]]:
    """``n`` pairs of 1 to ``max_words`` words, no final period."""
    return make_pairs(n, seed, 1, max_words, period=False)


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


def write_toy_corpus(directory: Path, sizes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """A corpus in the Multi30k layout (``{train,val,test}.{de,en}``) under ``directory``."""
    sizes = sizes or {"train": 1000, "val": 24, "test": 24}
    for i, (split, n) in enumerate(sizes.items()):
        write_split(directory, split, make_pairs(n, seed + i, 2, 6, period=False), gz=False)
    return directory


def tiny_run_overrides(corpus: Path, cache: Path) -> list[str]:
    """train.py overrides for the least run that trains, validates and tests on ``corpus`` (40
    training pairs are enough): two updates of a model of width 16, one layer each, in
    ``trainer.precision=auto``, one batch to validate and one to test. Small enough for an
    emulated CPU (.ci/run), where it takes a minute or two."""
    return f"""
        model=tiny model.d_model=16 model.n_heads=2 model.d_ff=32 model.max_positions=32
        model.n_encoder_layers=1 model.n_decoder_layers=1
        data.data_dir={corpus} data.test_split=test data.vocab_size=48 data.max_tokens=64
        data.cache_dir={cache}
        trainer.precision=auto trainer.max_epochs=1 trainer.limit_train_batches=2
        trainer.limit_val_batches=1 trainer.limit_test_batches=1 trainer.num_sanity_val_steps=0
        trainer.enable_progress_bar=false trainer.enable_model_summary=false
        logger=csv plot=false decoding.beam_size=2 decoding.max_len_b=3
    """.split()


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
