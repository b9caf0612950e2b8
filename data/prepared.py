"""A parallel corpus prepared for training: streamed into Arrow once, cached, reused.

:func:`prepare_corpus` reads the source that :mod:`data.corpus` picks and writes its splits, blank
training pairs dropped, into a cache entry ``<cache_dir>/corpus/<key>/`` that is complete or absent
(:mod:`data.cache`); a later call with the same files maps the entry without reading anything.
:func:`drop_long_pairs` drops over-long training pairs later, once their lengths in subwords are
known.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from data.arrow_pairs import SplitStats, write_pairs
from data.atomic import atomic_write
from data.cache import exclusive, remove_temporaries
from data.corpus import (
    SPLITS,
    CorpusError,
    CorpusLocation,
    CorpusNotFoundError,
    CorpusSource,
    SkippedLines,
    _local_blocks,
    _local_files,
    _no_local_copy_message,
    _split_names,
)
from data.filters import PairFilter, PairFilters
from data.hub import hub_blocks, pair_picker, read_hub
from data.overlap import PriorPairs

logger = logging.getLogger(__name__)

# Bump when reading or filtering rules change, so old corpus cache entries are not reused.
_CORPUS_CACHE_VERSION = "2"  # 2: \\r\\n read as a line end in every file
# What a training line with invalid UTF-8 or a NUL byte does (data.bad_lines).
BAD_LINES = ("error", "skip")
# The last file written into a corpus cache entry; the entry is complete once it exists.
_COMPLETE = "complete.json"


def _said(filtered: dict[str, int]) -> str:
    return ", ".join(f"{n:,} pairs ({reason})" for reason, n in filtered.items())


def drop_long_pairs(
    dataset: datasets.Dataset,
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    max_len: int,
    split: str = "train",
) -> datasets.Dataset:
    """Drop pairs whose source or target is longer than ``max_len`` tokens, logging the counts.

    Args:
        dataset: any rows.
        src_lengths: per-row source length (e.g. subword ids including EOS).
        tgt_lengths: per-row target length, same unit.
        max_len: longest length kept.
        split: name used in the log line.

    Returns:
        The kept rows (``id`` unchanged).
    """
    keep = np.flatnonzero(np.maximum(np.asarray(src_lengths), np.asarray(tgt_lengths)) <= max_len)
    logger.info(
        "%s: kept %d of %d pairs; dropped %d longer than %d tokens",
        split,
        len(keep),
        len(dataset),
        len(dataset) - len(keep),
        max_len,
    )
    return dataset if len(keep) == len(dataset) else dataset.select(keep)


@dataclass
class PreparedCorpus:
    """A corpus in Arrow, with what downstream caches key on and what preparing it took.

    Attributes:
        splits: ``train`` (blank pairs dropped) / ``validation`` / ``test``, columns ``id``,
            ``src``, ``tgt``; memory-mapped from the cache where one is used.
        digests: per split, a sha256 of its columns: equal digests, equal content.
        seconds: wall time of this call's ``read`` and ``filter`` stages (zero when reused).
        reused: the splits came from a complete cache entry; nothing was read.
        filtered: training pairs ``data.filters`` dropped, by reason.
    """

    splits: datasets.DatasetDict
    digests: dict[str, str]
    seconds: dict[str, float]
    reused: bool
    filtered: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _OpenSource:
    """The splits of a resolved source, located and ready to stream.

    Attributes:
        splits: which of :data:`SPLITS` are read, in that order.
        identity: per split, what names its content in the cache key without reading it.
        blocks: ``(split, skipped)`` to its blocks of ``(ids, sources, targets)``.
        origin: a split's files or hub split, for the log and errors.
    """

    splits: tuple[str, ...]
    identity: dict[str, object]
    blocks: Callable[[str, SkippedLines | None], Iterator]
    origin: Callable[[str], str]


def prepare_corpus(
    location: CorpusLocation,
    cache_dir: str | Path | None = None,
    bad_lines: str = "error",
    which_splits: Sequence[str] = SPLITS,
    src_prefix: str = "",
    filters: PairFilters | None = None,
    prior: PriorPairs | None = None,
) -> PreparedCorpus:
    """Stream a parallel corpus into Arrow, drop blank training pairs, cache it; or reuse the cache.

    The source is chosen by :meth:`data.corpus.CorpusLocation.resolve` and named in a log line.
    Files are read block by block (:func:`data.corpus.iter_parallel_blocks`) and hub splits batch
    by batch, each block written as it comes (:func:`data.arrow_pairs.write_pairs`), so memory
    stays bounded whatever the corpus size. With ``cache_dir`` the splits go to
    ``<cache_dir>/corpus/<key>/``, ``key`` naming the source and each local file's path, size and
    modification time (a hub split's ``datasets`` fingerprint); its files are written whole or not
    at all and a marker written last says it is complete (:mod:`data.cache`), and a second call
    with the same files maps it without reading anything. Over-long pairs are dropped later, once
    lengths in subwords are known (:func:`drop_long_pairs`). Validation and test are never
    filtered: they are scored against their references line by line.

    Args:
        location: where the corpus is, its languages and its split names.
        cache_dir: cache root; ``None``: the splits are built in memory, uncached.
        bad_lines: a local training line with invalid UTF-8 or a NUL byte is an ``"error"``
            naming the file and line, or its pair is dropped (``"skip"``), counted and logged by
            file and line. Validation and test lines are always errors: their pairs are scored
            against each other line by line.
        which_splits: which of ``train`` / ``validation`` / ``test`` to read (a corpus that only adds
            training pairs has no others); the others are neither read nor required.
        src_prefix: text put before every source sentence of every split read, e.g. the tags
            ``"<BT> "`` or ``"<2fr> "`` (after the blank check; part of the cache key).
        filters: ``data.filters`` for the training split (:mod:`data.filters`): those applied where
            it is read (:meth:`data.filters.PairFilters.where_read`) are part of the cache key, each
            reason counted in the log.
        prior: what ``eval_overlap`` and ``cross_duplicates`` compare the training pairs with
            (only what the filters on use); its digests are part of the cache key, and it is hashed
            only where the entry is built.

    Raises:
        CorpusNotFoundError: the chosen source cannot be read; when it is the fallback, the
            message names the three local options and the hub id.
        CorpusError: misaligned, undecodable or corrupt files, an empty split, a missing hub
            split.
        ValueError: ``bad_lines`` is not one of :data:`BAD_LINES`.
    """
    if bad_lines not in BAD_LINES:
        raise ValueError(f"data.bad_lines must be one of {', '.join(BAD_LINES)}, not {bad_lines!r}")
    source = location.resolve()
    logger.info("corpus: %s", source.describe())
    unknown = set(which_splits) - set(SPLITS)
    if unknown or not which_splits:
        raise ValueError(f"which_splits must be some of {SPLITS}, not {tuple(which_splits)}")
    which = tuple(name for name in SPLITS if name in which_splits)
    opened = (
        _open_local(location, source, which) if source.hub_id is None else _open_hub(location, source, which)
    )
    filters = (filters or PairFilters()).where_read()
    make_filter = (
        functools.partial(PairFilter, filters, location.src_lang, location.tgt_lang, prior)
        if filters.active
        else None
    )
    if cache_dir is None:
        return _build(opened, None, bad_lines, src_prefix, make_filter)
    key = _source_key(location, source, opened.identity, bad_lines, src_prefix, which, filters, prior)
    entry = Path(cache_dir) / "corpus" / key
    if not (entry / _COMPLETE).is_file():
        with exclusive(entry):
            if not (entry / _COMPLETE).is_file():
                entry.mkdir(parents=True, exist_ok=True)
                return _build(opened, entry, bad_lines, src_prefix, make_filter)
    return _reuse(entry, which)


def _source_key(
    location: CorpusLocation,
    source: CorpusSource,
    identity: object,
    bad_lines: str,
    prefix: str,
    which_splits: Sequence[str],
    filters: PairFilters | None = None,
    prior: PriorPairs | None = None,
) -> str:
    """The corpus cache entry's name: a hash of the source, its files' identity and the settings
    (the filters applied where it is read, and what they compare with)."""
    settings = {
        "version": _CORPUS_CACHE_VERSION,
        "bad_lines": bad_lines,
        "src_prefix": prefix,
        "splits": list(which_splits),
        "langs": [location.src_lang, location.tgt_lang],
        "source": [str(source.data_dir), source.hub_id, source.hub_config, list(source.splits)],
        "identity": identity,
    }
    filters = None if filters is None else filters.where_read()  # lengths in pieces act later
    if filters is not None and filters.active:  # entries made before filters existed keep their key
        settings["filters"] = filters.key()
        if prior is not None and prior.key():
            settings["prior"] = prior.key()
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:32]


def _file_identity(path: Path) -> list:
    # Path, size and modification time: a changed file gets a new entry without being read.
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _open_local(location: CorpusLocation, source: CorpusSource, splits: tuple[str, ...]) -> _OpenSource:
    """The local files of ``splits``, all located before any is read."""
    files = _local_files(source.data_dir, location.src_lang, location.tgt_lang, *source.splits, only=splits)
    return _OpenSource(
        splits,
        identity={name: [_file_identity(p) for p in pair] for name, pair in files.items()},
        blocks=lambda name, skipped: _local_blocks(*files[name], skipped, skippable=name == "train"),
        origin=lambda name: f"{files[name][0]} and {files[name][1]}",
    )


def _open_hub(location: CorpusLocation, source: CorpusSource, splits: tuple[str, ...]) -> _OpenSource:
    """The hub splits of ``splits``, their layout checked before anything is written.

    Raises:
        CorpusNotFoundError: the hub cannot be read; for the fallback, naming the local options.
    """
    names = {name: hub_name for name, hub_name in _split_names(*source.splits).items() if name in splits}
    try:
        hub = read_hub(source.hub_id, source.hub_config, names)
    except CorpusNotFoundError as err:
        if source.chosen_by != "fallback":
            raise
        raise CorpusNotFoundError(
            _no_local_copy_message(location, source.hub_id, err.__cause__ or err)
        ) from err
    src_lang, tgt_lang = location.src_lang, location.tgt_lang
    for ds in hub.values():
        pair_picker(ds, src_lang, tgt_lang)  # a layout error before anything is written
    return _OpenSource(
        splits,
        identity={name: ds._fingerprint for name, ds in hub.items()},
        blocks=lambda name, skipped: hub_blocks(hub[name], src_lang, tgt_lang),
        origin=lambda name: f"{source.hub_id} split {names[name]}",
    )


def _build(
    source: _OpenSource,
    directory: Path | None,
    bad_lines: str,
    src_prefix: str,
    make_filter: Callable[[], PairFilter] | None,
) -> PreparedCorpus:
    """Each split streamed into ``directory`` (None: memory), checked, then the entry marked complete."""
    splits, digests, seconds = {}, {}, {"read": 0.0, "filter": 0.0}
    filtered: dict[str, int] = {}
    skipped = SkippedLines() if bad_lines == "skip" else None
    for name in source.splits:
        path = None if directory is None else directory / f"{name}.arrow"
        if path is not None:
            remove_temporaries(path)
        train = name == "train"
        splits[name], stats = write_pairs(
            source.blocks(name, skipped if train else None),
            path,
            drop_blank=train,
            src_prefix=src_prefix,
            pair_filter=make_filter() if train and make_filter is not None else None,
        )
        digests[name] = stats.digest
        for stage, value in stats.seconds.items():
            seconds[stage] += value
        _account(name, stats, source.origin(name), skipped if train else None)
        if train and stats.filtered:
            filtered = stats.filtered
    if directory is not None:
        _mark_complete(directory, digests, splits, skipped, filtered)
    return PreparedCorpus(datasets.DatasetDict(splits), digests, seconds, reused=False, filtered=filtered)


def _account(name: str, stats: SplitStats, origin: str, skipped: SkippedLines | None) -> None:
    """Logs what was read of one split and what was dropped of it.

    Raises:
        CorpusError: the split is empty, or no training pair is left.
    """
    logger.info("read %d %s pairs from %s", stats.rows, name, origin)
    if skipped is not None and skipped.summary():
        logger.warning("%s: skipped %s (data.bad_lines=skip)", name, skipped.summary())
    if stats.rows == 0:
        raise CorpusError(f"the {name} split is empty: {origin} hold no lines")
    if name != "train":
        return
    logger.info(
        "%s: kept %d of %d pairs; dropped %d with an empty side, %d with a whitespace-only side",
        name,
        stats.kept,
        stats.rows,
        stats.empty,
        stats.blank,
    )
    if stats.filtered:
        logger.info("%s: data.filters dropped %s", origin, _said(stats.filtered))
    if stats.kept == 0:
        raise CorpusError(
            f"no training pair is left in {origin}: each of its {stats.rows} pairs has an"
            " empty or whitespace-only side"
        )


def _mark_complete(
    directory: Path,
    digests: dict[str, str],
    splits: dict[str, datasets.Dataset],
    skipped: SkippedLines | None,
    filtered: dict[str, int],
) -> None:
    """Writes the entry's marker, last: only now is the entry complete."""
    meta = {"digests": digests, "sizes": {k: len(v) for k, v in splits.items()}}
    if skipped is not None and skipped.summary():
        meta["skipped"] = skipped.summary()
    meta["filtered"] = filtered
    with atomic_write(directory / _COMPLETE) as f:
        f.write((json.dumps(meta, indent=2) + "\n").encode())


def _reuse(entry: Path, splits: tuple[str, ...]) -> PreparedCorpus:
    """The splits of a complete entry, memory-mapped; what preparing it dropped, logged again."""
    meta = json.loads((entry / _COMPLETE).read_text())
    mapped = datasets.DatasetDict(
        {name: datasets.Dataset.from_file(str(entry / f"{name}.arrow")) for name in splits}
    )
    logger.info("reusing corpus %s (%s)", entry, ", ".join(f"{k} {v}" for k, v in meta["sizes"].items()))
    if "skipped" in meta:
        logger.warning(
            "train: skipped %s when the corpus was prepared (data.bad_lines=skip)", meta["skipped"]
        )
    filtered = meta.get("filtered", {})
    if filtered:
        logger.info("train: data.filters dropped %s when the corpus was prepared", _said(filtered))
    return PreparedCorpus(
        mapped, meta["digests"], {"read": 0.0, "filter": 0.0}, reused=True, filtered=filtered
    )
