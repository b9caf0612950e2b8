"""SentencePiece subwords: the special ids and :class:`SubwordTokenizer`, which every user encodes with.

The special ids are fixed here, once, and every model is trained with them:
``PAD_ID=0``, ``UNK_ID=1``, ``BOS_ID=2``, ``EOS_ID=3``. The Transformer uses pad id 0 without
importing this module; :class:`SubwordTokenizer` refuses a model whose ids differ.

A run's models are copied into its directory (``<run_dir>/tokenizer/{joint,src,tgt}.model``,
:func:`save_run_tokenizers`) so that it carries the exact vocabulary it was trained with. Which
models a run uses, given by path or trained and cached by content, is :mod:`data.subword_models`;
training one model, :mod:`data.spm_training`; whole splits tokenized into Arrow, :mod:`data.tokenized`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import sentencepiece as spm

from data.atomic import atomic_write

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
# By name, as SentencePiece's trainer options and checkpoints spell them; the model agrees.
SPECIAL_IDS: dict[str, int] = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
_NOT_DECODED = frozenset({PAD_ID, BOS_ID, EOS_ID})


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


class SpmModelError(ValueError):
    """A given SentencePiece model (``data.spm_model``, ...) that cannot be used; one line naming the
    key and the path."""


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
    """The tokenizers saved by :func:`save_run_tokenizers` in ``run_dir``.

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
