"""One SentencePiece model, trained with the project's special ids and cached by what it was trained on.

A model is cached under ``<cache_dir>/spm/<key>.model`` where ``key`` hashes the training text
(content, not path) and the training settings, so the same corpus and settings reuse it; one
process at a time trains a given model (:mod:`data.cache`). Of a large corpus only a sample of
``input_sentence_size`` sentences is read (:func:`sample_sentences`). The run's pair of models,
given or trained, is :mod:`data.subword_models`.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import sentencepiece as spm

from data.cache import exclusive, remove_temporaries
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordTokenizer

if TYPE_CHECKING:  # imported lazily: pyarrow is needed only for Arrow columns
    import pyarrow as pa

    from data.arrow_pairs import StreamedColumn

logger = logging.getLogger(__name__)

# Bump when the training call or the tokenized layout (data.tokenized) changes, so old cache entries
# are not reused.
CACHE_VERSION = "1"


def hash_texts(h: hashlib._Hash, texts: Iterable[str]) -> int:
    """Feeds ``texts`` to ``h``, each length-prefixed so that the digest identifies the sequence
    of texts exactly; returns how many there were."""
    n = 0
    for text in texts:
        b = text.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
        n += 1
    return n


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    num_threads: int = 1,
    reserved: Sequence[str] = (),
) -> SubwordTokenizer:
    """Train a SentencePiece model in memory with the project's special ids.

    Args:
        texts: training sentences, one per item.
        vocab_size: size of the vocabulary, special ids included (a hard limit).
        model_type: ``"unigram"`` or ``"bpe"`` (``"char"`` and ``"word"`` work too).
        character_coverage: share of characters covered by the alphabet; 1.0 for Latin scripts,
            0.9995 for scripts with large alphabets.
        input_sentence_size: at most this many sentences are sampled for training.
        num_threads: trainer threads.
        reserved: words that are always one piece, e.g. the tags ``<BT>`` and ``<2fr>``
            (SentencePiece's user-defined symbols).
    """
    model = io.BytesIO()
    extra = {"user_defined_symbols": list(reserved)} if reserved else {}
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=num_threads,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            minloglevel=1,
            **extra,
        )
    except RuntimeError as err:
        raise RuntimeError(
            f"SentencePiece training ({model_type}, vocab_size={vocab_size}) failed; if the message "
            f"is about vocab_size or pieces_size, the text is too small for this vocabulary: "
            f"lower vocab_size. SentencePiece said: {err}"
        ) from err
    return SubwordTokenizer(model.getvalue(), num_threads=num_threads)


def train_or_load_sentencepiece(
    texts: Sequence[Iterable[str]],
    cache_dir: str | Path,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    num_threads: int = 1,
    content_key: str | None = None,
    reserved: Sequence[str] = (),
) -> SubwordTokenizer:
    """Reuse the cached model for this training text and these settings, or train and cache one.

    One process at a time trains a given model (:func:`data.cache.exclusive`); others wait and
    load it. The model file appears complete or not at all.

    Args:
        texts: one or more collections of sentences, each iterated twice (hash, then training);
            lists or ``datasets`` columns. Their concatenation is the training text. With
            ``content_key``, lists, or Arrow string arrays of which at most
            ``input_sentence_size`` sentences are sampled (:func:`sample_sentences`) and read.
        cache_dir: cache root; models live in ``<cache_dir>/spm/<key>.model``.
        vocab_size: see :func:`train_sentencepiece`.
        model_type: see :func:`train_sentencepiece`.
        character_coverage: see :func:`train_sentencepiece`.
        input_sentence_size: see :func:`train_sentencepiece`.
        num_threads: trainer and encoder threads (not part of the key).
        content_key: identifies the training text (e.g. the corpus digest and side), so the
            texts need not be hashed; ``None``: the texts are hashed.
        reserved: see :func:`train_sentencepiece`.
    """
    settings = {
        "version": CACHE_VERSION,
        "vocab_size": vocab_size,
        "model_type": model_type,
        "character_coverage": character_coverage,
        "input_sentence_size": input_sentence_size,
        "special_ids": [PAD_ID, UNK_ID, BOS_ID, EOS_ID],
    }
    if reserved:  # absent otherwise, so that models cached before it keep their keys
        settings["reserved"] = list(reserved)
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    if content_key is None:
        n = sum(hash_texts(h, part) for part in texts)
    else:
        h.update(content_key.encode())
        n = sum(len(part) for part in texts)
    path = Path(cache_dir) / "spm" / f"{h.hexdigest()[:32]}.model"
    if not path.is_file():
        with exclusive(path):
            if not path.is_file():
                remove_temporaries(path)
                remove_temporaries(path.with_suffix(".vocab"))
                sample = sample_sentences(texts, input_sentence_size) if content_key else texts
                logger.info(
                    "training SentencePiece (%s, %d) on %d of %d sentences",
                    model_type,
                    vocab_size,
                    sum(len(part) for part in sample) if content_key else n,
                    n,
                )
                tokenizer = train_sentencepiece(
                    (t for part in sample for t in part),
                    vocab_size,
                    model_type,
                    character_coverage,
                    input_sentence_size,
                    num_threads,
                    reserved,
                )
                tokenizer.save(path)
                logger.info("saved SentencePiece model %s", path)
                return tokenizer
    logger.info("reusing SentencePiece model %s", path)
    return SubwordTokenizer.load(path, num_threads=num_threads)


def _take_texts(column: pa.ChunkedArray | StreamedColumn, picks: np.ndarray | None) -> list[str]:
    """Rows ``picks`` (sorted; ``None``: all) of a string column, taken chunk by chunk.

    One ``take`` over the whole column would concatenate its chunks first, which overflows the
    32-bit string offsets past 2 GiB of text (36M pairs of WMT-length sentences).
    """
    import pyarrow as pa

    texts: list[str] = []
    start = 0
    for chunk in column.chunks:
        if picks is None:
            texts += chunk.to_pylist()
        else:
            lo, hi = np.searchsorted(picks, [start, start + len(chunk)])
            if hi > lo:
                texts += chunk.take(pa.array(picks[lo:hi] - start)).to_pylist()
        start += len(chunk)
    return texts


def sample_sentences(parts: Sequence[Sequence[str]], size: int, seed: int = 0) -> list[list[str]]:
    """At most ``size`` sentences of ``parts`` as Python lists: all of them in order where there
    are no more, else a uniform sample without replacement, kept in corpus order.

    Only the sampled sentences are turned into Python strings, so a corpus of tens of millions of
    sentences in Arrow costs one sample's memory.

    Args:
        parts: lists, or Arrow string columns (anything with ``len()`` and ``chunks``: a
            ``pyarrow.ChunkedArray``, a :class:`data.arrow_pairs.StreamedColumn`); their
            concatenation is the text sampled from.
        size: the most sentences returned (SentencePiece's ``input_sentence_size``).
        seed: seed of the sample, so that the same text gives the same sample.

    Returns:
        One list per part.
    """
    total = sum(len(part) for part in parts)
    chosen = None
    if total > size:
        chosen = np.sort(np.random.default_rng(seed).choice(total, size=size, replace=False))
    out, offset = [], 0
    for part in parts:
        if chosen is None:
            picks = None
        else:
            lo, hi = np.searchsorted(chosen, [offset, offset + len(part)])
            picks = chosen[lo:hi] - offset
        if hasattr(part, "chunks"):  # Arrow
            out.append(_take_texts(part, picks))
        else:
            out.append(list(part) if picks is None else [part[i] for i in picks.tolist()])
        offset += len(part)
    return out
