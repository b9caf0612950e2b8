"""A parallel corpus prepared for training: streamed into Arrow once, cached, reused.

:func:`prepare_corpus` reads the source that :mod:`data.corpus` picks and writes its splits, blank
training pairs dropped, into a cache entry ``<cache_dir>/corpus/<key>/`` that is complete or absent
(:mod:`data.cache`); a later call with the same files maps the entry without reading anything.
:func:`drop_long_pairs` drops over-long training pairs later, once their lengths in subwords are
known.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from data.arrow_pairs import write_pairs
from data.atomic import atomic_write
from data.cache import exclusive, remove_temporaries
from data.corpus import (
    MULTI30K_HUB_ID,
    SPLITS,
    CorpusError,
    CorpusNotFoundError,
    CorpusSource,
    SkippedLines,
    _hub_blocks,
    _local_blocks,
    _local_files,
    _no_local_copy_message,
    _pair_picker,
    _read_hub,
    _split_names,
    resolve_corpus_source,
)
from data.filters import PairFilter, PairFilters

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


def _source_key(
    source: CorpusSource,
    src_lang: str,
    tgt_lang: str,
    identity: object,
    bad_lines: str,
    prefix: str,
    which_splits: Sequence[str],
    filters: PairFilters | None = None,
) -> str:
    settings = {
        "version": _CORPUS_CACHE_VERSION,
        "bad_lines": bad_lines,
        "src_prefix": prefix,
        "splits": list(which_splits),
        "langs": [src_lang, tgt_lang],
        "source": [str(source.data_dir), source.hub_id, source.hub_config, list(source.splits)],
        "identity": identity,
    }
    if filters is not None and filters.active:  # entries made before filters existed keep their key
        settings["filters"] = filters.key()
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:32]


def _file_identity(path: Path) -> list:
    # Path, size and modification time: a changed file gets a new entry without being read.
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def prepare_corpus(
    src_lang: str,
    tgt_lang: str,
    data_dir: str | Path | None = None,
    hub_id: str | None = None,
    hub_config: str | None = None,
    train_split: str = "train",
    valid_split: str = "val",
    test_split: str = "test_2016_flickr",
    fallback_hub_id: str | None = MULTI30K_HUB_ID,
    cache_dir: str | Path | None = None,
    bad_lines: str = "error",
    which_splits: Sequence[str] = SPLITS,
    src_prefix: str = "",
    filters: PairFilters | None = None,
) -> PreparedCorpus:
    """Stream a parallel corpus into Arrow, drop blank training pairs, cache it; or reuse the cache.

    The source is chosen by :func:`data.corpus.resolve_corpus_source` and named in a log line. Files are read
    block by block (:func:`data.corpus.iter_parallel_blocks`) and hub splits batch by batch, each block
    written as it comes (:func:`data.arrow_pairs.write_pairs`), so memory stays bounded whatever
    the corpus size. With ``cache_dir`` the splits go to ``<cache_dir>/corpus/<key>/``, ``key``
    naming the source and each local file's path, size and modification time (a hub split's
    ``datasets`` fingerprint); its files are written whole or not at all and a marker written last
    says it is complete (:mod:`data.cache`), and a second call with the same files maps it
    without reading anything. Over-long pairs are dropped later,
    once lengths in subwords are known (:func:`drop_long_pairs`). Validation and test are never
    filtered: they are scored against their references line by line.

    Args:
        src_lang: source language, e.g. ``"de"``.
        tgt_lang: target language, e.g. ``"en"``.
        data_dir: local directory; ``None``: ``$MULTI30K_DIR``, else ``../shared/data/multi30k``
            where it exists, else ``fallback_hub_id``. Ignored with ``hub_id``.
        hub_id: hub dataset id; takes precedence over ``data_dir`` when set.
        hub_config: hub dataset configuration, e.g. ``"de-en"``.
        train_split: name of the training split in the source.
        valid_split: name of the split read as ``validation`` (``"val"`` in Multi30k files).
        test_split: name of the split read as ``test`` (``"test_2016_flickr"`` in Multi30k files).
        fallback_hub_id: hub dataset read, with the hub's split names train / validation / test,
            where no local directory is given or found; ``None``: no fallback.
        cache_dir: cache root; ``None``: the splits are built in memory, uncached.
        bad_lines: a local training line with invalid UTF-8 or a NUL byte is an ``"error"``
            naming the file and line, or its pair is dropped (``"skip"``), counted and logged by
            file and line. Validation and test lines are always errors: their pairs are scored
            against each other line by line.
        which_splits: which of ``train`` / ``validation`` / ``test`` to read (a corpus that only adds
            training pairs has no others); the others are neither read nor required.
        src_prefix: text put before every source sentence of every split read, e.g. the tags
            ``"<BT> "`` or ``"<2fr> "`` (after the blank check; part of the cache key).
        filters: ``data.filters`` for the training split (:mod:`data.filters`; part of the cache
            key), each reason counted in the log.

    Raises:
        CorpusNotFoundError: the chosen source cannot be read; when it is the fallback, the
            message names the three local options and the hub id.
        CorpusError: misaligned, undecodable or corrupt files, an empty split, a missing hub
            split.
        ValueError: ``bad_lines`` is not one of :data:`BAD_LINES`.
    """
    if bad_lines not in BAD_LINES:
        raise ValueError(f"data.bad_lines must be one of {', '.join(BAD_LINES)}, not {bad_lines!r}")
    source = resolve_corpus_source(
        data_dir, hub_id, hub_config, fallback_hub_id, train_split, valid_split, test_split
    )
    logger.info("corpus: %s", source.describe())
    unknown = set(which_splits) - set(SPLITS)
    if unknown or not which_splits:
        raise ValueError(f"which_splits must be some of {SPLITS}, not {tuple(which_splits)}")
    which_splits = tuple(name for name in SPLITS if name in which_splits)
    names = {name: prefix for name, prefix in _split_names(*source.splits).items() if name in which_splits}
    if source.hub_id is None:
        files = _local_files(source.data_dir, src_lang, tgt_lang, *source.splits, only=which_splits)
        identity = {name: [_file_identity(p) for p in pair] for name, pair in files.items()}

        def blocks(name: str, skipped: SkippedLines | None) -> Iterator:
            return _local_blocks(*files[name], skipped, skippable=name == "train")

        def origin(name: str) -> str:
            return f"{files[name][0]} and {files[name][1]}"

    else:
        try:
            hub = _read_hub(source.hub_id, source.hub_config, names)
        except CorpusNotFoundError as err:
            if source.chosen_by != "fallback":
                raise
            raise CorpusNotFoundError(
                _no_local_copy_message(
                    source.hub_id,
                    err.__cause__ or err,
                    (train_split, valid_split, test_split),
                    src_lang,
                    tgt_lang,
                )
            ) from err
        for ds in hub.values():
            _pair_picker(ds, src_lang, tgt_lang)  # a layout error before anything is written
        identity = {name: ds._fingerprint for name, ds in hub.items()}

        def blocks(name: str, skipped: SkippedLines | None) -> Iterator:
            return _hub_blocks(hub[name], src_lang, tgt_lang)

        def origin(name: str) -> str:
            return f"{source.hub_id} split {names[name]}"

    filters = filters or PairFilters()

    def build(directory: Path | None) -> PreparedCorpus:
        splits, digests, seconds = {}, {}, {"read": 0.0, "filter": 0.0}
        filtered: dict[str, int] = {}
        skipped = SkippedLines() if bad_lines == "skip" else None
        for name in which_splits:
            path = None if directory is None else directory / f"{name}.arrow"
            if path is not None:
                remove_temporaries(path)
            train = name == "train"
            splits[name], stats = write_pairs(
                blocks(name, skipped if train else None),
                path,
                drop_blank=train,
                src_prefix=src_prefix,
                pair_filter=PairFilter(filters) if train and filters.active else None,
            )
            digests[name] = stats.digest
            for stage, value in stats.seconds.items():
                seconds[stage] += value
            logger.info("read %d %s pairs from %s", stats.rows, name, origin(name))
            if train and skipped is not None and skipped.summary():
                logger.warning("%s: skipped %s (data.bad_lines=skip)", name, skipped.summary())
            if stats.rows == 0:
                raise CorpusError(f"the {name} split is empty: {origin(name)} hold no lines")
            if train:
                logger.info(
                    "%s: kept %d of %d pairs; dropped %d with an empty side, %d with a whitespace-only side",
                    name,
                    stats.kept,
                    stats.rows,
                    stats.empty,
                    stats.blank,
                )
                if stats.filtered:
                    filtered = stats.filtered
                    logger.info("%s: data.filters dropped %s", origin(name), _said(filtered))
                if stats.kept == 0:
                    raise CorpusError(
                        f"no training pair is left in {origin(name)}: each of its {stats.rows} pairs has an"
                        " empty or whitespace-only side"
                    )
        if directory is not None:  # the marker, last: only now is the entry complete
            meta = {"digests": digests, "sizes": {k: len(v) for k, v in splits.items()}}
            if skipped is not None and skipped.summary():
                meta["skipped"] = skipped.summary()
            meta["filtered"] = filtered
            with atomic_write(directory / _COMPLETE) as f:
                f.write((json.dumps(meta, indent=2) + "\n").encode())
        return PreparedCorpus(datasets.DatasetDict(splits), digests, seconds, reused=False, filtered=filtered)

    if cache_dir is None:
        return build(None)
    entry = (
        Path(cache_dir)
        / "corpus"
        / _source_key(source, src_lang, tgt_lang, identity, bad_lines, src_prefix, which_splits, filters)
    )
    if not (entry / _COMPLETE).is_file():
        with exclusive(entry):
            if not (entry / _COMPLETE).is_file():
                entry.mkdir(parents=True, exist_ok=True)
                return build(entry)
    meta = json.loads((entry / _COMPLETE).read_text())
    splits = datasets.DatasetDict(
        {name: datasets.Dataset.from_file(str(entry / f"{name}.arrow")) for name in which_splits}
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
        splits, meta["digests"], {"read": 0.0, "filter": 0.0}, reused=True, filtered=filtered
    )
