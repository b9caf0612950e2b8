"""The SentencePiece models of a run: given by path, or trained on its training split and cached.

:class:`TokenizerSettings` are the ``data:`` keys that choose them. An existing model
(``data.spm_model``, e.g. an earlier run's, or a fine-tuned checkpoint's) is used as it is
(:func:`given_tokenizers`), read before the corpus so that a wrong path stops the run at once.
Otherwise one joint model, or one per side, is trained on the training split, keyed by its content
and these settings and cached (:func:`train_or_load_tokenizers`, :mod:`data.spm_training`). Either
way the models are copied into the run directory (:func:`data.tokenizer.save_run_tokenizers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from data.spm_training import train_or_load_sentencepiece
from data.tokenizer import SpmModelError, SubwordTokenizer, save_run_tokenizers


@dataclass(frozen=True)
class TokenizerSettings:
    """Which SentencePiece models a run uses, and how they are trained where none is given.

    The ``data:`` keys of the same names (conf/data/multi30k.yaml).

    Attributes:
        joint_vocab: one model for both languages, else one per language.
        vocab_size: vocabulary size of each model, special ids included.
        spm_model_type: ``"unigram"`` or ``"bpe"``.
        character_coverage: share of characters covered by the alphabet (1.0 for Latin scripts).
        spm_input_sentence_size: at most this many sentences sampled to train a model.
        spm_threads: threads for SentencePiece training and encoding.
        spm_model: an existing ``.model`` file used for both sides instead of training one (with
            ``joint_vocab``); the training settings above are then unused.
        src_spm_model: the same, one model per side (both, without ``joint_vocab``).
        tgt_spm_model: the target side's.
    """

    joint_vocab: bool = True
    vocab_size: int = 8000
    spm_model_type: str = "unigram"
    character_coverage: float = 1.0
    spm_input_sentence_size: int = 2_000_000
    spm_threads: int = 1
    spm_model: str | None = None
    src_spm_model: str | None = None
    tgt_spm_model: str | None = None

    def given_keys(self) -> list[str]:
        """The model keys given, as ``key=path``: ``["spm_model=/runs/a/tokenizer/joint.model"]``."""
        given = {
            "spm_model": self.spm_model,
            "src_spm_model": self.src_spm_model,
            "tgt_spm_model": self.tgt_spm_model,
        }
        return [f"{key}={path}" for key, path in given.items() if path]


def train_or_load_tokenizers(
    train_src: Iterable[str],
    train_tgt: Iterable[str],
    settings: TokenizerSettings,
    cache_dir: str | Path,
    run_dir: str | Path | None = None,
    content_key: str | None = None,
    reserved: Sequence[str] = (),
) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """The source and target tokenizers for a training split, copied into the run directory.

    Args:
        train_src: training source sentences (iterated twice per model).
        train_tgt: training target sentences, aligned with ``train_src``.
        settings: the joint or per-side choice, the training settings and threads (its given
            model paths are not read here: :func:`given_tokenizers`).
        cache_dir: cache root, see :func:`data.spm_training.train_or_load_sentencepiece`.
        run_dir: when given, models are copied to ``<run_dir>/tokenizer/joint.model`` (joint) or
            ``src.model`` and ``tgt.model`` (separate).
        content_key: identifies the training split (its corpus digest), so that the texts need
            not be hashed and, where larger than ``spm_input_sentence_size``, only a sample is read
            (see :func:`data.spm_training.train_or_load_sentencepiece`); ``None``: the texts are
            hashed.
        reserved: source tags kept as one piece, in the joint or the source model.

    Returns:
        ``(src_tokenizer, tgt_tokenizer)``; the same object twice when ``joint_vocab``.
    """
    kwargs = {
        "cache_dir": cache_dir,
        "vocab_size": settings.vocab_size,
        "model_type": settings.spm_model_type,
        "character_coverage": settings.character_coverage,
        "input_sentence_size": settings.spm_input_sentence_size,
        "num_threads": settings.spm_threads,
    }

    def key(side: str) -> str | None:
        return None if content_key is None else f"{content_key}|{side}"

    if settings.joint_vocab:
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


def _given_tokenizer(key: str, path: str | Path, num_threads: int) -> SubwordTokenizer:
    try:
        proto = Path(path).read_bytes()
    except OSError as err:
        raise SpmModelError(f"{key}={path}: cannot be read ({err.strerror or type(err).__name__})") from None
    try:
        return SubwordTokenizer(proto, num_threads=num_threads)
    except ValueError as err:
        raise SpmModelError(f"{key}={path}: {err}") from None


def given_tokenizers(settings: TokenizerSettings) -> tuple[SubwordTokenizer, SubwordTokenizer] | None:
    """The tokenizers of existing SentencePiece models, used instead of training any; None if none given.

    ``settings.spm_model`` is one model for both sides (with ``joint_vocab``); ``src_spm_model``
    and ``tgt_spm_model`` one per side (without). Errors name the data config's keys.

    Returns:
        ``(src_tokenizer, tgt_tokenizer)``, the same object twice for ``spm_model``; None where no
        model is given (SentencePiece is trained or taken from the cache, as usual).

    Raises:
        SpmModelError: a file that is missing, unreadable or not a SentencePiece model with the
            project's special ids; or keys that do not go together (``spm_model`` with a per-side
            one or with ``joint_vocab=false``, one side without the other, a side with ``joint_vocab=true``).
    """
    spm_model, joint, num_threads = settings.spm_model, settings.joint_vocab, settings.spm_threads
    per_side = {"data.src_spm_model": settings.src_spm_model, "data.tgt_spm_model": settings.tgt_spm_model}
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
        _given_tokenizer("data.src_spm_model", settings.src_spm_model, num_threads),  # type: ignore[arg-type]
        _given_tokenizer("data.tgt_spm_model", settings.tgt_spm_model, num_threads),  # type: ignore[arg-type]
    )


def check_tags_are_pieces(tokenizer: SubwordTokenizer, tags: Sequence[str], key: str) -> None:
    """Refuses a given model that would cut a tag into pieces (it was trained without it).

    Raises:
        SpmModelError: naming ``data.<key>`` and the pieces the tag becomes.
    """
    for tag in tags:
        pieces = tokenizer.id_to_piece(tokenizer.encode([tag])[0])  # unknown characters: <unk>
        if [piece for piece in pieces if piece != "\u2581"] != [tag]:  # a word boundary may stand before it
            raise SpmModelError(
                f"data.{key}: the tag {tag} is not one piece of this model (it becomes {pieces}), so the"
                " model cannot tell it from text: use a model trained with it reserved, or drop the tag"
            )
