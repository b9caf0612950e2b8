"""SentencePiece subwords: training keyed by content, existing models given by path, a small wrapper.

The special ids are fixed here, once, and every model is trained with them:
``PAD_ID=0``, ``UNK_ID=1``, ``BOS_ID=2``, ``EOS_ID=3``. The Transformer uses pad id 0 without
importing this module; :class:`SubwordTokenizer` refuses a model whose ids differ.

A model is cached under ``<cache_dir>/spm/<key>.model`` where ``key`` hashes the training text
(content, not path) and the training settings, so the same corpus and settings reuse it, and it is
copied into the run directory (``<run_dir>/tokenizer/{joint,src,tgt}.model``) so a run carries
the exact vocabulary it was trained with. An existing model (``data.spm_model``, e.g. an earlier
run's, or a fine-tuned checkpoint's) is used as it is instead (:func:`given_tokenizers`).

Whole splits are tokenized into Arrow by :mod:`data.tokenized`.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import sentencepiece as spm

from data.atomic import atomic_write

if TYPE_CHECKING:  # imported lazily: translate.py uses this module and should start fast
    import pyarrow as pa

    from data.arrow_pairs import StreamedColumn

logger = logging.getLogger(__name__)

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
# By name, as SentencePiece's trainer options and checkpoints spell them; the model agrees.
SPECIAL_IDS: dict[str, int] = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
_NOT_DECODED = frozenset({PAD_ID, BOS_ID, EOS_ID})

# Bump when the training call or the tokenized layout (data.tokenized) changes, so old cache entries
# are not reused.
_CACHE_VERSION = "1"


def default_cache_dir() -> str:
    """``$NMT_CACHE_DIR`` if set, else ``~/.cache/nmt-transformer``."""
    return os.environ.get("NMT_CACHE_DIR") or str(Path.home() / ".cache" / "nmt-transformer")


class SubwordTokenizer:
    """A SentencePiece model with the project's special ids.

    Args:
        model_proto: the serialized SentencePiece model (the bytes of a ``.model`` file).
        num_threads: threads used by :meth:`encode` on lists of texts.

    Raises:
        ValueError: the bytes are not a SentencePiece model, or its pad / unk / bos / eos ids
            are not 0 / 1 / 2 / 3.
    """

    def __init__(self, model_proto: bytes, num_threads: int = 1) -> None:
        self.model_proto = model_proto
        self.num_threads = num_threads
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(model_proto)
        except (RuntimeError, OSError, TypeError) as err:
            first_line = (str(err).splitlines() or [type(err).__name__])[0]
            raise ValueError(f"not a SentencePiece model ({first_line})") from None
        found = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(
                f"SentencePiece model has pad/unk/bos/eos ids {found}, expected "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
            )

    @property
    def vocab_size(self) -> int:
        """Number of ids, special ids included."""
        return self.sp.get_piece_size()

    @property
    def fingerprint(self) -> str:
        """sha256 of the model bytes: equal fingerprints mean equal tokenization."""
        return hashlib.sha256(self.model_proto).hexdigest()

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Texts to subword ids, without BOS or EOS.

        Args:
            texts: ``batch`` strings.

        Returns:
            ``batch`` lists of ids.
        """
        return self.sp.encode(list(texts), out_type=int, num_threads=self.num_threads)

    def sample_encode(self, texts: list[str], alpha: float, nbest_size: int, seed: int) -> list[list[int]]:
        """Texts to sampled subword ids (subword regularisation), the draw fixed by ``seed``.

        SentencePiece's own sampling (``enable_sampling``; :mod:`data.sampling` says what
        ``alpha`` and ``nbest_size`` mean for unigram and BPE models). Its random generator is
        seeded with ``seed`` first (process-wide; the training loader fetches one batch at a
        time in a process), and the texts are encoded on one thread: SentencePiece's threads
        would draw in whatever order they run.

        Args:
            texts: ``batch`` strings.
            alpha: unigram: exponent of the sampling distribution; BPE: merge dropout probability.
            nbest_size: unigram: sample among all segmentations (-1) or the ``nbest_size`` best.
            seed: seed of the draw, below 2**32.

        Returns:
            ``batch`` lists of ids, without BOS or EOS.
        """
        spm.set_random_generator_seed(seed)
        return self.sp.encode(
            list(texts), out_type=int, enable_sampling=True, alpha=alpha, nbest_size=nbest_size, num_threads=1
        )

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Subword ids to detokenized text; PAD, BOS and EOS ids are skipped wherever they are.

        Args:
            ids: ``batch`` sequences of ids (lists, or rows of a LongTensor ``[batch, len]``).

        Returns:
            ``batch`` strings.
        """
        clean = [[int(i) for i in seq if int(i) not in _NOT_DECODED] for seq in ids]
        return self.sp.decode(clean)

    def pieces(self, text: str) -> list[str]:
        """The subword strings of one text (``"▁"`` marks a preceding space), e.g. for plots."""
        return self.sp.encode(text, out_type=str)

    def id_to_piece(self, ids: Sequence[int]) -> list[str]:
        """The subword strings of ``ids`` (``"▁"`` marks a preceding space), e.g. for plots."""
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def save(self, path: str | Path) -> Path:
        """Write the model to ``path`` (a ``.model`` file) and a readable ``.vocab`` beside it.

        Returns:
            ``path``.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            f.write(self.model_proto)
        vocab = "".join(f"{self.sp.id_to_piece(i)}\t{self.sp.get_score(i)}\n" for i in range(self.vocab_size))
        with atomic_write(path.with_suffix(".vocab")) as f:
            f.write(vocab.encode("utf-8"))
        return path

    @classmethod
    def load(cls, path: str | Path, num_threads: int = 1) -> SubwordTokenizer:
        """Read a ``.model`` file written by :meth:`save` or by SentencePiece."""
        return cls(Path(path).read_bytes(), num_threads=num_threads)

    def __getstate__(self) -> dict:
        # The processor itself is rebuilt from the bytes (DataLoader workers pickle datasets).
        return {"model_proto": self.model_proto, "num_threads": self.num_threads}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"], state["num_threads"])


def _hash_texts(h: hashlib._Hash, texts: Iterable[str]) -> int:
    # Each text is length-prefixed, so the digest identifies the sequence of texts exactly.
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
    from data.cache import exclusive, remove_temporaries  # lazy: translate.py imports this module

    settings = {
        "version": _CACHE_VERSION,
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
        n = sum(_hash_texts(h, part) for part in texts)
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


def train_or_load_tokenizers(
    train_src: Iterable[str],
    train_tgt: Iterable[str],
    cache_dir: str | Path,
    run_dir: str | Path | None = None,
    joint: bool = True,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    num_threads: int = 1,
    content_key: str | None = None,
    reserved: Sequence[str] = (),
) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """The source and target tokenizers for a training split, copied into the run directory.

    Args:
        train_src: training source sentences (iterated twice per model).
        train_tgt: training target sentences, aligned with ``train_src``.
        cache_dir: cache root, see :func:`train_or_load_sentencepiece`.
        run_dir: when given, models are copied to ``<run_dir>/tokenizer/joint.model`` (joint) or
            ``src.model`` and ``tgt.model`` (separate).
        joint: one model trained on source and target text, used for both sides.
        vocab_size: vocabulary size of each model.
        model_type: see :func:`train_sentencepiece`.
        character_coverage: see :func:`train_sentencepiece`.
        input_sentence_size: see :func:`train_sentencepiece`.
        num_threads: trainer and encoder threads.
        content_key: identifies the training split (its corpus digest), so that the texts need
            not be hashed and, where larger than ``input_sentence_size``, only a sample is read
            (see :func:`train_or_load_sentencepiece`); ``None``: the texts are hashed.
        reserved: source tags kept as one piece, in the joint or the source model.

    Returns:
        ``(src_tokenizer, tgt_tokenizer)``; the same object twice when ``joint``.
    """
    kwargs = {
        "cache_dir": cache_dir,
        "vocab_size": vocab_size,
        "model_type": model_type,
        "character_coverage": character_coverage,
        "input_sentence_size": input_sentence_size,
        "num_threads": num_threads,
    }

    def key(side: str) -> str | None:
        return None if content_key is None else f"{content_key}|{side}"

    if joint:
        src_tok = tgt_tok = train_or_load_sentencepiece(
            [train_src, train_tgt], content_key=key("joint"), reserved=reserved, **kwargs
        )
    else:
        src_tok = train_or_load_sentencepiece(
            [train_src], content_key=key("src"), reserved=reserved, **kwargs
        )
        tgt_tok = train_or_load_sentencepiece([train_tgt], content_key=key("tgt"), **kwargs)
    if run_dir is not None:
        save_run_tokenizers(src_tok, tgt_tok, run_dir)
    return src_tok, tgt_tok


class SpmModelError(ValueError):
    """A given SentencePiece model (``data.spm_model``, ...) that cannot be used; one line naming the
    key and the path."""


def _given_tokenizer(key: str, path: str | Path, num_threads: int) -> SubwordTokenizer:
    try:
        proto = Path(path).read_bytes()
    except OSError as err:
        raise SpmModelError(f"{key}={path}: cannot be read ({err.strerror or type(err).__name__})") from None
    try:
        return SubwordTokenizer(proto, num_threads=num_threads)
    except ValueError as err:
        raise SpmModelError(f"{key}={path}: {err}") from None


def given_tokenizers(
    spm_model: str | Path | None,
    src_spm_model: str | Path | None,
    tgt_spm_model: str | Path | None,
    joint: bool,
    num_threads: int = 1,
) -> tuple[SubwordTokenizer, SubwordTokenizer] | None:
    """The tokenizers of existing SentencePiece models, used instead of training any; None if none given.

    The arguments are the data config's keys, named by them in errors: ``spm_model`` (one model for
    both sides, with ``joint``) or ``src_spm_model`` and ``tgt_spm_model`` (one per side, without).

    Returns:
        ``(src_tokenizer, tgt_tokenizer)``, the same object twice for ``spm_model``; None where no
        model is given (SentencePiece is trained or taken from the cache, as usual).

    Raises:
        SpmModelError: a file that is missing, unreadable or not a SentencePiece model with the
            project's special ids; or keys that do not go together (``spm_model`` with a per-side
            one or with ``joint_vocab=false``, one side without the other, a side with ``joint_vocab=true``).
    """
    per_side = {"data.src_spm_model": src_spm_model, "data.tgt_spm_model": tgt_spm_model}
    given = [k for k, v in per_side.items() if v]
    if spm_model and given:
        raise SpmModelError(
            f"data.spm_model={spm_model} and {given[0]}={per_side[given[0]]} are both given: "
            "data.spm_model is one model for both sides, the per-side keys one model each; "
            "give one or the other"
        )
    if spm_model:
        if not joint:
            raise SpmModelError(
                f"data.spm_model={spm_model} is one model for both sides, but data.joint_vocab=false: "
                "give data.src_spm_model and data.tgt_spm_model instead, or data.joint_vocab=true"
            )
        tokenizer = _given_tokenizer("data.spm_model", spm_model, num_threads)
        return tokenizer, tokenizer
    if not given:
        return None
    if joint:
        raise SpmModelError(
            f"{given[0]}={per_side[given[0]]} is a per-side model, but data.joint_vocab=true: "
            "give data.spm_model for one model of both sides, or data.joint_vocab=false"
        )
    if len(given) == 1:
        missing = next(k for k in per_side if k not in given)
        raise SpmModelError(f"{given[0]}={per_side[given[0]]} is given without {missing}: give both")
    return (
        _given_tokenizer("data.src_spm_model", src_spm_model, num_threads),  # type: ignore[arg-type]
        _given_tokenizer("data.tgt_spm_model", tgt_spm_model, num_threads),  # type: ignore[arg-type]
    )


def save_run_tokenizers(src_tok: SubwordTokenizer, tgt_tok: SubwordTokenizer, run_dir: str | Path) -> None:
    """Copies the tokenizers into ``<run_dir>/tokenizer/``: ``joint.model`` where they are one
    object, else ``src.model`` and ``tgt.model`` (what :func:`load_run_tokenizers` reads)."""
    out = Path(run_dir) / "tokenizer"
    if src_tok is tgt_tok:
        src_tok.save(out / "joint.model")
    else:
        src_tok.save(out / "src.model")
        tgt_tok.save(out / "tgt.model")


def load_run_tokenizers(
    run_dir: str | Path, num_threads: int = 1
) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """The tokenizers saved by :func:`train_or_load_tokenizers` in ``run_dir``.

    Returns:
        ``(src_tokenizer, tgt_tokenizer)``; the same object twice for a joint model.

    Raises:
        FileNotFoundError: ``run_dir`` holds neither ``joint.model`` nor ``src``/``tgt.model``.
    """
    out = Path(run_dir) / "tokenizer"
    if (out / "joint.model").is_file():
        tok = SubwordTokenizer.load(out / "joint.model", num_threads)
        return tok, tok
    if (out / "src.model").is_file() and (out / "tgt.model").is_file():
        return (
            SubwordTokenizer.load(out / "src.model", num_threads),
            SubwordTokenizer.load(out / "tgt.model", num_threads),
        )
    raise FileNotFoundError(f"no joint.model or src.model + tgt.model in {out}")
