"""What the data module's set-up builds, in named steps: read, subwords, tokenize, cut, mix.

:func:`load_data` is the recipe :class:`data.datamodule.TranslationDataModule` runs once per process
(``prepare_data`` fills the caches, ``setup`` maps them):

1. :func:`read_corpora`: every corpus of :class:`data.corpora.RunCorpora` prepared
   (:func:`data.prepared.prepare_corpus`), the training corpora concatenated in their order; where
   ``data.filters`` compares training pairs with the evaluation sets or the earlier corpora, those
   are read first (:mod:`data.overlap`);
2. the SentencePiece models, given or trained on the training split (:mod:`data.subword_models`);
3. every split tokenized into the cache (:func:`data.tokenized.tokenize_split`);
4. training pairs dropped by ``data.filters``' lengths in pieces (:mod:`data.piece_lengths`) and
   those longer than ``max_len``, and what each loader fetches from made
   (:class:`data.tokenized_pairs.TokenizedPairs`, or :class:`data.sampling.SampledPairs`);
5. the training corpora mixed by weight (:class:`data.mixing.CorpusMix`) and summarised.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from dataclasses import dataclass

import datasets
import numpy as np

from data.arrow_pairs import StreamedColumn
from data.batching import TokenBucketBatchSampler
from data.corpora import RunCorpora
from data.corpus import SPLITS
from data.filters import REASONS
from data.mixing import CorpusMix, corpus_weights
from data.overlap import HashedTexts, PriorPairs
from data.piece_lengths import filter_in_pieces, tag_pieces
from data.prepared import PreparedCorpus, drop_long_pairs, prepare_corpus
from data.sampling import SampledPairs
from data.settings import BatchSettings, DataSettings
from data.subword_models import check_tags_are_pieces, given_tokenizers, train_or_load_tokenizers
from data.tokenized import tokenize_split
from data.tokenized_pairs import TokenizedPairs
from data.tokenizer import SubwordTokenizer, save_run_tokenizers

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadCorpora:
    """The splits of every corpus a run reads, in Arrow (:func:`read_corpora`).

    Attributes:
        splits: ``train`` (every training corpus's pairs, in order), each of the validation
            splits (:attr:`data.corpora.RunCorpora.validation_splits`), ``test``; columns ``id``,
            ``src``, ``tgt``.
        digests: per split, a sha256 of its content: what the models and tokenized splits key on.
        sizes: each training corpus's number of pairs, in order.
        filtered: per training corpus that ``data.filters`` dropped pairs of where it was read,
            its counts by reason.
        seconds: wall time of the ``read`` and ``filter`` stages.
        prefixes: each training corpus's source prefix (its tags and a space, or ``""``).
    """

    splits: datasets.DatasetDict
    digests: dict[str, str]
    sizes: list[int]
    filtered: dict[str, dict[str, int]]
    seconds: dict[str, float]
    prefixes: list[str]


@dataclass(frozen=True)
class LoadedData:
    """Everything :func:`load_data` builds, which the data module serves batches from.

    Attributes:
        corpus: the raw splits (:attr:`ReadCorpora.splits`).
        tokenized: the tokenized splits (``id``, ``src_ids``, ``tgt_ids``, ``src_len``,
            ``tgt_len``); ``train`` without its over-long pairs.
        lengths: per split, ``([N] source widths, [N] target widths)`` of the pairs served.
        served: per split, what its loader fetches batches from.
        src_tokenizer: the source model.
        tgt_tokenizer: the target model (the same object where the vocabulary is joint).
        mix: which examples each epoch holds, where a training corpus's weight is not 1; else None.
        corpus_summary: per training corpus: name, pairs, weight, pairs per epoch, tag.
        filtered: per training corpus, the pairs ``data.filters`` dropped, by reason (where it was
            read and, in pieces, after tokenization).
        stage_seconds: wall time of the read, filter, sentencepiece and tokenize stages.
    """

    corpus: datasets.DatasetDict
    tokenized: datasets.DatasetDict
    lengths: dict[str, tuple[np.ndarray, np.ndarray]]
    served: dict[str, TokenizedPairs]
    src_tokenizer: SubwordTokenizer
    tgt_tokenizer: SubwordTokenizer
    mix: CorpusMix | None
    corpus_summary: list[dict]
    filtered: dict[str, dict[str, int]]
    stage_seconds: dict[str, float]


def load_data(settings: DataSettings) -> LoadedData:
    """Read the corpora, train, reuse or take the SentencePiece models, tokenize, cut and mix.

    Every stage's result is cached (:mod:`data.cache`), so a second process maps what the first
    wrote.

    Raises:
        SpmModelError: a given model that cannot be used (before the corpus is read).
        CorpusError, CorpusNotFoundError: a corpus that cannot be read (:mod:`data.prepared`).
    """
    # Given models are read first: a wrong path stops the run before the corpus is read.
    given = given_tokenizers(settings.tokenizer)
    read = read_corpora(settings)
    seconds = dict(read.seconds)
    tick = time.perf_counter()
    src_tok, tgt_tok = (
        _trained_models(settings, read) if given is None else _use_given_models(settings, *given)
    )
    seconds["sentencepiece"] = time.perf_counter() - tick
    tick = time.perf_counter()
    evaluated = [*settings.corpora.validation_splits, "test"]
    tokenized = {
        split: tokenize_split(
            read.splits[split], src_tok, tgt_tok, settings.cache_dir, content_key=read.digests[split]
        )
        for split in ["train", *evaluated]
    }
    lengths = {split: (_column(ds, "src_len"), _column(ds, "tgt_len")) for split, ds in tokenized.items()}
    seconds["tokenize"] = time.perf_counter() - tick
    max_len = settings.batches.max_len
    src_len, tgt_len = lengths["train"]
    corpus_of = np.repeat(np.arange(len(read.sizes)), read.sizes)
    passed, filtered = _filter_in_pieces(settings, read, src_tok, src_len, tgt_len, corpus_of)
    keep = np.flatnonzero(passed & (np.maximum(src_len, tgt_len) <= max_len))
    served = {split: TokenizedPairs(tokenized[split]) for split in evaluated}
    served["train"] = _training_pairs(
        settings.batches, read.splits["train"], tokenized["train"], keep, src_tok, tgt_tok
    )
    if not passed.all():
        rows = np.flatnonzero(passed)
        tokenized["train"], src_len, tgt_len = tokenized["train"].select(rows), src_len[rows], tgt_len[rows]
    tokenized["train"] = drop_long_pairs(tokenized["train"], src_len, tgt_len, max_len, "train")
    lengths["train"] = lengths["train"][0][keep], lengths["train"][1][keep]
    corpus_of = corpus_of[keep]
    mix, summary = mix_corpora(settings.corpora, corpus_of, *lengths["train"])
    _warn_long_evaluated(evaluated, lengths, max_len)
    return LoadedData(
        corpus=read.splits,
        tokenized=datasets.DatasetDict(tokenized),
        lengths=lengths,
        served=served,
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        mix=mix,
        corpus_summary=summary,
        filtered=filtered,
        stage_seconds=seconds,
    )


def read_corpora(settings: DataSettings) -> ReadCorpora:
    """Every corpus of the run prepared: the main corpus's splits that no list replaces, each
    validation set's split, then each training corpus's training split, their tags on their sources.

    Where ``data.filters`` compares training pairs with the evaluation sets (``eval_overlap``), the
    main corpus's training split is read apart from its evaluation splits, after them; otherwise
    with them, in one cache entry, as always. ``cross_duplicates`` compares each corpus of
    ``data.corpora`` with those before it (one corpus alone has none).
    """
    corpora, filters = settings.corpora, settings.filters
    tags = corpora.target_lang_tags
    read = functools.partial(
        prepare_corpus, cache_dir=settings.cache_dir, bad_lines=settings.bad_lines, filters=filters
    )
    apart = corpora.listed or bool(filters.eval_overlap)  # training corpora read on their own
    main_splits = [s for s in _main_splits(corpora) if not (apart and s == "train")]
    main = read(corpora.main, which_splits=main_splits, src_prefix=corpora.main_prefix)
    valid = [
        read(v.location, which_splits=("validation",), src_prefix=v.source_prefix(tags))
        for v in corpora.valid_sets
    ]
    prefixes = [c.source_prefix(tags) for c in corpora.training]
    parts = [main]
    if apart:
        evaluation = _evaluation_texts(corpora, main, valid, filters.eval_overlap)
        parts, earlier = [], []  # earlier: the corpora read so far, hashed once if a later one is built
        for corpus, prefix in zip(corpora.training, prefixes, strict=True):
            prior = PriorPairs(evaluation, tuple(earlier) if filters.cross_duplicates else ())
            part = read(corpus.location, which_splits=("train",), src_prefix=prefix, prior=prior)
            parts.append(part)
            earlier.append(HashedTexts(part.splits["train"], prefix, part.digests["train"], "pair"))
    seconds: dict[str, float] = {}
    for part in {id(p): p for p in [main, *parts, *valid]}.values():
        for stage, value in part.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + value
    splits, digests = dict(main.splits), dict(main.digests)
    if corpora.listed:
        splits["train"] = datasets.concatenate_datasets([p.splits["train"] for p in parts])
        joined = "|".join(
            f"{c.name}:{p.digests['train']}" for c, p in zip(corpora.training, parts, strict=True)
        )
        digests["train"] = hashlib.sha256(joined.encode()).hexdigest()
    elif apart:  # the main corpus's training split alone, read after its evaluation splits
        splits["train"], digests["train"] = parts[0].splits["train"], parts[0].digests["train"]
    for v, prepared in zip(corpora.valid_sets, valid, strict=True):
        splits[v.split_key] = prepared.splits["validation"]
        digests[v.split_key] = prepared.digests["validation"]
    return ReadCorpora(
        splits=datasets.DatasetDict(splits),
        digests=digests,
        sizes=[len(p.splits["train"]) for p in parts],
        filtered={c.name: p.filtered for c, p in zip(corpora.training, parts, strict=True) if p.filtered},
        seconds=seconds,
        prefixes=prefixes,
    )


def _evaluation_texts(
    corpora: RunCorpora, main: PreparedCorpus, valid: list[PreparedCorpus], mode: str | None
) -> tuple[HashedTexts, ...]:
    """The validation and test splits as ``eval_overlap`` compares them (``mode``), their tags taken
    off; () where it is off."""
    if mode is None:
        return ()
    sets = [(main, name, corpora.main_prefix) for name in ("validation", "test") if name in main.splits]
    sets += [
        (v, "validation", s.source_prefix(corpora.target_lang_tags))
        for s, v in zip(corpora.valid_sets, valid, strict=True)
    ]
    return tuple(HashedTexts(p.splits[name], prefix, p.digests[name], mode) for p, name, prefix in sets)


def _filter_in_pieces(
    settings: DataSettings,
    read: ReadCorpora,
    src_tok: SubwordTokenizer,
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    corpus_of: np.ndarray,
) -> tuple[np.ndarray, dict[str, dict[str, int]]]:
    """``data.filters``' lengths in pieces (:mod:`data.piece_lengths`), logged per corpus.

    Returns:
        ``[N]`` bool, the training pairs kept; per training corpus, every filter's counts by
        reason (where it was read, then in pieces), for those that dropped any.
    """
    filters, names = settings.filters, [c.name for c in settings.corpora.training]
    if not filters.in_pieces:
        return np.ones(len(src_len), dtype=bool), read.filtered
    tags = tag_pieces(read.prefixes, src_tok)
    passed, counts = filter_in_pieces(filters, src_len, tgt_len, corpus_of, tags)
    filtered = {}
    for name, in_pieces in zip(names, counts, strict=True):
        if in_pieces:
            logger.info(
                "%s: data.filters dropped %s, counted in SentencePiece pieces",
                name,
                ", ".join(f"{n:,} pairs ({reason})" for reason, n in in_pieces.items()),
            )
        both = {**read.filtered.get(name, {}), **in_pieces}
        if both:
            filtered[name] = {reason: both[reason] for reason in REASONS if reason in both}
    return passed, filtered


def _main_splits(corpora: RunCorpora) -> list[str]:
    """What the main corpus gives: its training split unless ``data.corpora`` lists the training
    corpora, its validation split unless ``data.valid_sets`` lists the validation sets (it need not
    exist then), and always the test split."""
    replaced = (corpora.listed, bool(corpora.valid_sets), False)
    return [split for split, gone in zip(SPLITS, replaced, strict=True) if not gone]


def _trained_models(settings: DataSettings, read: ReadCorpora) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """The models trained on the training split, or reused from the cache, copied into the run."""
    return train_or_load_tokenizers(
        StreamedColumn(read.splits["train"], "src"),  # only a sample is kept, the rest streamed past
        StreamedColumn(read.splits["train"], "tgt"),
        settings.tokenizer,
        cache_dir=settings.cache_dir,
        run_dir=settings.run_dir,
        content_key=read.digests["train"],
        reserved=settings.corpora.reserved,
    )


def _use_given_models(
    settings: DataSettings, src_tok: SubwordTokenizer, tgt_tok: SubwordTokenizer
) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    """The given models, logged, refused where one would cut a tag, copied into the run."""
    said = " and data.".join(settings.tokenizer.given_keys())
    logger.info(
        "SentencePiece: using data.%s (%s pieces), not training one (data.vocab_size and the "
        "other training settings are unused)",
        said,
        " and ".join(str(t.vocab_size) for t in dict.fromkeys((src_tok, tgt_tok))),
    )
    check_tags_are_pieces(src_tok, settings.corpora.reserved, said)
    if settings.run_dir is not None:
        save_run_tokenizers(src_tok, tgt_tok, settings.run_dir)
    return src_tok, tgt_tok


def _column(dataset: datasets.Dataset, name: str) -> np.ndarray:
    """An int column of a memory-mapped split as a numpy array, without Python lists.

    Returns:
        ``[len(dataset)]`` int64.
    """
    return np.asarray(dataset.select_columns([name]).with_format("numpy")[:][name], dtype=np.int64)


def _training_pairs(
    batches: BatchSettings,
    raw: datasets.Dataset,
    tokenized: datasets.Dataset,
    keep: np.ndarray,
    src_tok: SubwordTokenizer,
    tgt_tok: SubwordTokenizer,
) -> TokenizedPairs:
    """What the training loader fetches from: the tokenized rows ``keep``, or, with subword
    sampling, the raw text encoded afresh for each batch (the tokenized lengths plan the batches)."""
    if batches.spm_sampling_alpha is None:
        return TokenizedPairs(tokenized, keep)
    return SampledPairs(
        raw,
        keep,
        src_tok,
        tgt_tok,
        alpha=batches.spm_sampling_alpha,
        nbest_size=batches.spm_sampling_nbest,
        seed=batches.seed,
        max_len=batches.max_len,
    )


def mix_corpora(
    corpora: RunCorpora, corpus_of: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray
) -> tuple[CorpusMix | None, list[dict]]:
    """Each training corpus's weight made a :class:`CorpusMix` (none where all are 1), and the summary.

    Args:
        corpora: the run's corpora: their weights, or the temperature that chooses them.
        corpus_of: ``[N]`` training corpus of each kept training pair.
        src_len: ``[N]`` source widths.
        tgt_len: ``[N]`` target widths.

    Returns:
        The mix, and per training corpus its name, pairs, weight, pairs per epoch and tag
        (logged where ``data.corpora`` lists the corpora).
    """
    pairs = np.bincount(corpus_of, minlength=len(corpora.training))
    weights = [c.weight for c in corpora.training]
    if corpora.temperature is not None:  # shares proportional to pairs ** (1 / T)
        weights = corpus_weights(pairs.tolist(), corpora.temperature)
    keys = TokenBucketBatchSampler.length_keys(src_len, tgt_len)
    mix = None if all(w == 1 for w in weights) else CorpusMix(corpus_of, weights, keys)
    per_epoch = pairs if mix is None else mix.per_corpus
    summary = [
        {"name": c.name, "pairs": int(n), "weight": round(w, 6), "per_epoch": int(e), "tag": c.tag}
        for c, n, w, e in zip(corpora.training, pairs, weights, per_epoch, strict=True)
    ]
    if corpora.listed:
        logger.info(
            "training corpora, pairs per epoch: %s",
            "; ".join(
                f"{s['name']} {s['per_epoch']:,} ({s['pairs']:,} pairs x {s['weight']:g}"
                + (f", tagged {s['tag']}" if s["tag"] else "")
                + ")"
                for s in summary
            ),
        )
    return mix, summary


def _warn_long_evaluated(
    evaluated: list[str], lengths: dict[str, tuple[np.ndarray, np.ndarray]], max_len: int
) -> None:
    """Warns of validation and test pairs longer than ``max_len`` (kept: they are scored)."""
    for split in evaluated:
        n_long = int((np.maximum(*lengths[split]) > max_len).sum())
        if n_long:
            logger.warning(
                "%s: %d of %d pairs are longer than max_len=%d tokens (kept)",
                split,
                n_long,
                len(lengths[split][0]),
                max_len,
            )
