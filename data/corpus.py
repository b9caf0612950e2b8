"""Parallel corpora as a ``datasets.DatasetDict`` with ``train`` / ``validation`` / ``test`` splits.

Two sources give the same result, each split with columns ``id`` (int), ``src`` (str), ``tgt`` (str):

* a hub dataset (``hub_id``), either with flat language columns (``{"de": ..., "en": ...}``, as in
  the usual Multi30k upload) or with a ``translation`` dict column (WMT, IWSLT uploads);
* a local directory laid out ``{split}.{lang}`` or ``{split}.{lang}.gz`` (Multi30k, fairseq).

Which one is read (:func:`resolve_corpus_source`): an explicit ``hub_id``; else the first local
directory of an explicit ``data_dir``, ``$MULTI30K_DIR``, ``<project root>/../shared/data/multi30k``;
else, where none of these is given or exists, the fallback hub dataset (``bentrevett/multi30k``, the
same Multi30k splits under the hub's names train / validation / test), downloaded once and cached
by ``datasets``. A log line names the source and why it was chosen.

``id`` is the row index of the example within its split *before* filtering, i.e. the line number
(0-based) in the local files, the row number in a hub split. Validation and test are never
filtered, so there ``id`` is also the position of the row and of its reference.

Hub rows are taken as they are (no stripping, no splitting on any separator), as local lines are.
Local files are read by :func:`data.lines.read_lines` in its strict mode (``LineMode.STRICT``):
split on ``b"\\n"`` only, so ``\\r``, U+2028, ``\\x85``, ... stay inside their line and source and
target stay aligned; ``\\r`` removed only from a file whose every line ends with ``\\r\\n``; a byte
order mark removed; invalid UTF-8 an error naming the file and line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub.errors import LocalEntryNotFoundError

from data.arrow_pairs import write_pairs
from data.atomic import atomic_write
from data.cache import exclusive, remove_temporaries
from data.lines import CorruptFileError, UndecodableLineError, iter_line_blocks

logger = logging.getLogger(__name__)

# The splits every corpus ends up with, whatever the names in the source.
SPLITS: tuple[str, ...] = ("train", "validation", "test")

# Project root = the directory holding the `data` package; never the current working directory.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR_ENV = "MULTI30K_DIR"
# Multi30k on the Hugging Face hub: read where no local copy is found (conf/data/multi30k.yaml).
MULTI30K_HUB_ID = "bentrevett/multi30k"
# The hub's standard split names (datasets.Split), which the fallback hub dataset is read with.
HUB_SPLITS: tuple[str, str, str] = ("train", "validation", "test")
# What the hub raises when it cannot be reached and the dataset is not in the cache (offline,
# HF_HUB_OFFLINE=1, a timeout), or when the dataset does not exist there.
_HUB_UNREADABLE = (ConnectionError, TimeoutError, LocalEntryNotFoundError, DatasetNotFoundError)


class CorpusError(ValueError):
    """A corpus that cannot be used as it is: misaligned, undecodable, or missing a split."""


class CorpusNotFoundError(FileNotFoundError):
    """No source of the corpus can be read: a file or directory is missing, or the hub is unreachable.

    The fix is the user's (a path, an environment variable, the network), and the message says
    which; ``train.py`` prints it alone, without a traceback.
    """


def shared_data_dir() -> Path:
    """``<project root>/../shared/data/multi30k``, where the build machines keep Multi30k.

    Computed from the package location, never from the current working directory.
    """
    return (PROJECT_ROOT.parent / "shared" / "data" / "multi30k").resolve()


def default_data_dir() -> str:
    """The local corpus directory used when none is configured (whether or not it exists).

    Returns:
        ``$MULTI30K_DIR`` if set, else ``<project root>/../shared/data/multi30k``.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return env
    return str(shared_data_dir())


@dataclass(frozen=True)
class CorpusSource:
    """Where a corpus is read from, and what its three splits are called there.

    Attributes:
        data_dir: local directory of ``{split}.{lang}[.gz]`` files; ``None`` for a hub dataset.
        hub_id: hub dataset id; ``None`` for local files.
        hub_config: hub dataset configuration, e.g. ``"de-en"``.
        splits: the source's names of the splits read as train, validation and test.
        chosen_by: why this source, for the log line: ``"data_dir"``, ``"$MULTI30K_DIR"``,
            ``"../shared/data/multi30k"``, ``"hub_id"`` or ``"fallback"``.
    """

    data_dir: Path | None
    hub_id: str | None
    hub_config: str | None
    splits: tuple[str, str, str]
    chosen_by: str

    def describe(self) -> str:
        """One line for the log: the path or the hub id, its split names, and why it was chosen."""
        names = "/".join(self.splits)
        if self.hub_id is None:
            return f"local files in {self.data_dir} (splits {names}; chosen by {self.chosen_by})"
        config = f" ({self.hub_config})" if self.hub_config else ""
        why = (
            f"no local copy: data.data_dir not set, ${DATA_DIR_ENV} not set, {shared_data_dir()} absent"
            if self.chosen_by == "fallback"
            else f"chosen by {self.chosen_by}"
        )
        return f"Hugging Face hub dataset {self.hub_id}{config} (splits {names}; {why})"


def resolve_corpus_source(
    data_dir: str | Path | None = None,
    hub_id: str | None = None,
    hub_config: str | None = None,
    fallback_hub_id: str | None = MULTI30K_HUB_ID,
    train_split: str = "train",
    valid_split: str = "val",
    test_split: str = "test_2016_flickr",
) -> CorpusSource:
    """Pick the corpus source: ``hub_id`` > ``data_dir`` > ``$MULTI30K_DIR`` > ../shared > fallback hub.

    An explicit ``hub_id``, ``data_dir`` or ``$MULTI30K_DIR`` is used even if it turns out not to
    exist (reading it then fails with a message naming it): a typo must not silently turn into a
    download. The shared directory is used only where it exists; otherwise ``fallback_hub_id`` is
    read with the hub's split names :data:`HUB_SPLITS`. With no fallback, the shared directory is
    returned anyway, and reading it fails with a message naming it.

    Args:
        data_dir: explicit local directory, or ``None``.
        hub_id: explicit hub dataset id, or ``None``; read with the given split names.
        hub_config: configuration of ``hub_id``.
        fallback_hub_id: hub dataset read where no local directory is given or found; ``None``
            disables the fallback.
        train_split: source name of the training split (local files, or ``hub_id``).
        valid_split: source name of the split read as ``validation``.
        test_split: source name of the split read as ``test``.

    Returns:
        The source, with the split names that go with it.
    """
    splits = (train_split, valid_split, test_split)
    if hub_id:
        return CorpusSource(None, hub_id, hub_config, splits, "hub_id")
    if data_dir is not None:
        return CorpusSource(Path(data_dir), None, None, splits, "data_dir")
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return CorpusSource(Path(env), None, None, splits, f"${DATA_DIR_ENV}")
    shared = shared_data_dir()
    if shared.is_dir() or not fallback_hub_id:
        return CorpusSource(shared, None, None, splits, "../shared/data/multi30k")
    return CorpusSource(None, fallback_hub_id, None, HUB_SPLITS, "fallback")


def _no_local_copy_message(
    hub_id: str, reason: BaseException, splits: Sequence[str], src_lang: str, tgt_lang: str
) -> str:
    """The error where no local directory exists and the fallback hub dataset cannot be read."""
    offline = " (HF_HUB_OFFLINE is set)" if datasets.config.HF_HUB_OFFLINE else ""
    places = [
        ("data.data_dir=PATH", "on the command line"),
        (f"${DATA_DIR_ENV}=PATH", "in the environment"),
        (str(shared_data_dir()), "../shared/data/multi30k beside the project; absent"),
    ]
    width = max(len(p) for p, _ in places)
    return "\n".join(
        [
            f"no local copy of the corpus, and the Hugging Face hub copy {hub_id} cannot be read"
            f"{offline}: {reason}",
            f"Put the files {{{','.join(splits)}}}.{{{src_lang},{tgt_lang}}}[.gz] in a directory given by "
            "one of (checked in this order):",
            *(f"  {place:<{width}}  {where}" for place, where in places),
            f"or reach the hub once: `datasets` then keeps {hub_id} in its cache "
            f"({datasets.config.HF_DATASETS_CACHE}) and later runs read it offline.",
        ]
    )


def find_split_file(data_dir: str | Path, split: str, lang: str) -> Path:
    """Locate ``{split}.{lang}`` or ``{split}.{lang}.gz`` in ``data_dir``.

    Raises:
        CorpusNotFoundError: ``data_dir`` or both files are missing; the message names the
            candidates and what is there.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise CorpusNotFoundError(
            f"corpus directory {data_dir} does not exist (set data_dir or ${DATA_DIR_ENV})"
        )
    candidates = [data_dir / f"{split}.{lang}", data_dir / f"{split}.{lang}.gz"]
    for path in candidates:
        if path.is_file():
            return path
    present = sorted(p.name for p in data_dir.iterdir())
    raise CorpusNotFoundError(
        f"no file for split {split!r} language {lang!r}: looked for "
        f"{' and '.join(str(p) for p in candidates)}; {data_dir} holds {present}"
    )


def _corpus_errors(blocks: Iterator[list[str]]) -> Iterator[list[str]]:
    """``blocks``, with a file's undecodable or corrupt content raised as a :class:`CorpusError`."""
    try:
        yield from blocks
    except (UndecodableLineError, CorruptFileError) as err:
        raise CorpusError(str(err)) from None


def iter_parallel_blocks(src_path: Path, tgt_path: Path) -> Iterator[tuple[list[str], list[str]]]:
    """Stream two line-aligned files as aligned blocks of ``(source lines, target lines)``.

    Each file is read by :func:`data.lines.iter_line_blocks` (the strict mode, in bounded memory).

    Raises:
        CorpusError: the line counts differ (the message names both files and both counts,
            counted to the end of both files); a file is not valid UTF-8 (the message names the
            file, the line and the bytes); a compressed file is corrupt or cut short (the
            message names the file and the last line read whole).
    """
    src_blocks, tgt_blocks = (
        _corpus_errors(iter_line_blocks(src_path)),
        _corpus_errors(iter_line_blocks(tgt_path)),
    )
    src_buf: list[str] = []
    tgt_buf: list[str] = []
    src_n = tgt_n = 0  # lines read so far from each file
    while True:
        if not src_buf:
            src_buf = next(src_blocks, None) or []
            src_n += len(src_buf)
        if not tgt_buf:
            tgt_buf = next(tgt_blocks, None) or []
            tgt_n += len(tgt_buf)
        if not src_buf or not tgt_buf:
            break
        n = min(len(src_buf), len(tgt_buf))
        yield src_buf[:n], tgt_buf[:n]
        src_buf, tgt_buf = src_buf[n:], tgt_buf[n:]
    if src_buf or tgt_buf:
        src_n += sum(len(b) for b in src_blocks)
        tgt_n += sum(len(b) for b in tgt_blocks)
        raise CorpusError(f"line counts differ: {src_path} has {src_n} lines, {tgt_path} has {tgt_n} lines")


def read_parallel_files(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    """Read two line-aligned files.

    Raises:
        CorpusError: a file is not valid UTF-8 (the message names the file, the line and the
            bytes), or the line counts differ (the message names both files and both counts).
    """
    src: list[str] = []
    tgt: list[str] = []
    for s, t in iter_parallel_blocks(src_path, tgt_path):
        src += s
        tgt += t
    return src, tgt


def _split_names(train_split: str, valid_split: str, test_split: str) -> dict[str, str]:
    return {"train": train_split, "validation": valid_split, "test": test_split}


# Bump when reading or filtering rules change, so old corpus cache entries are not reused.
_CORPUS_CACHE_VERSION = "1"
# The last file written into a corpus cache entry; the entry is complete once it exists.
_COMPLETE = "complete.json"
# Rows per block when a hub split is streamed into the corpus cache.
_HUB_BLOCK_ROWS = 50_000


def _local_blocks(src_path: Path, tgt_path: Path) -> Iterator[tuple[None, list[str], list[str]]]:
    for src, tgt in iter_parallel_blocks(src_path, tgt_path):
        yield None, src, tgt


def load_local_corpus(
    data_dir: str | Path,
    src_lang: str,
    tgt_lang: str,
    train_split: str = "train",
    valid_split: str = "val",
    test_split: str = "test_2016_flickr",
) -> datasets.DatasetDict:
    """Load ``{split}.{lang}[.gz]`` files into in-memory splits ``train`` / ``validation`` / ``test``.

    For corpora that fit in memory (tests, a quick look); :func:`prepare_corpus` with a cache
    directory streams any size into memory-mapped files.

    Args:
        data_dir: directory with the files.
        src_lang: source language suffix, e.g. ``"de"``.
        tgt_lang: target language suffix, e.g. ``"en"``.
        train_split: file prefix of the training split.
        valid_split: file prefix read as ``validation``.
        test_split: file prefix read as ``test``.

    Returns:
        Unfiltered splits with columns ``id``, ``src``, ``tgt``.
    """
    out = {}
    for name, (src_path, tgt_path) in _local_files(
        data_dir, src_lang, tgt_lang, train_split, valid_split, test_split
    ).items():
        out[name], _ = write_pairs(_local_blocks(src_path, tgt_path), None, drop_blank=False)
        logger.info("read %d %s pairs from %s and %s", len(out[name]), name, src_path, tgt_path)
    return datasets.DatasetDict(out)


def _local_files(
    data_dir: str | Path, src_lang: str, tgt_lang: str, *splits: str
) -> dict[str, tuple[Path, Path]]:
    """The source and target file of every split, all located before any is read."""
    return {
        name: (find_split_file(data_dir, prefix, src_lang), find_split_file(data_dir, prefix, tgt_lang))
        for name, prefix in _split_names(*splits).items()
    }


def _pair_picker(
    dataset: datasets.Dataset, src_lang: str, tgt_lang: str
) -> Callable[[dict], tuple[list, list]]:
    """A function from a batch of ``dataset`` to ``(sources, targets)``, for either hub layout.

    Raises:
        CorpusError: neither a ``translation`` column nor both language columns, or the
            ``translation`` column lacks a language.
    """
    columns = dataset.column_names
    if "translation" in columns:
        pair = dataset.features["translation"]
        langs = list(pair.languages) if isinstance(pair, datasets.Translation) else list(pair)
        if langs and (src_lang not in langs or tgt_lang not in langs):
            raise CorpusError(
                f"translation column has languages {langs}, not both {src_lang!r} and {tgt_lang!r}"
            )
        return lambda batch: (
            [t[src_lang] for t in batch["translation"]],
            [t[tgt_lang] for t in batch["translation"]],
        )
    if src_lang in columns and tgt_lang in columns:
        return lambda batch: (batch[src_lang], batch[tgt_lang])
    raise CorpusError(
        f"expected a 'translation' column or columns {src_lang!r} and {tgt_lang!r}; the dataset has {columns}"
    )


def _hub_blocks(
    dataset: datasets.Dataset, src_lang: str, tgt_lang: str
) -> Iterator[tuple[np.ndarray, list[str], list[str]]]:
    pick = _pair_picker(dataset, src_lang, tgt_lang)
    start = 0
    for batch in dataset.iter(batch_size=_HUB_BLOCK_ROWS):
        src, tgt = pick(batch)
        yield np.arange(start, start + len(src), dtype=np.int64), list(src), list(tgt)
        start += len(src)


def normalize_columns(dataset: datasets.Dataset, src_lang: str, tgt_lang: str) -> datasets.Dataset:
    """Bring a hub split to columns ``id``, ``src``, ``tgt`` (in memory; see :func:`prepare_corpus`).

    Args:
        dataset: a split with either a ``translation`` column of ``{lang: text}`` dicts or one
            string column per language.
        src_lang: source language key.
        tgt_lang: target language key.

    Raises:
        CorpusError: neither layout is present, or a language is missing.
    """
    return write_pairs(_hub_blocks(dataset, src_lang, tgt_lang), None, drop_blank=False)[0]


def _read_hub(hub_id: str, hub_config: str | None, splits: dict[str, str]) -> dict[str, datasets.Dataset]:
    """The hub splits by our names (``datasets`` keeps them memory-mapped in its own cache).

    Raises:
        CorpusError: a split is missing; the message lists the splits that exist.
        CorpusNotFoundError: the hub cannot be reached and the dataset is not cached, or the
            hub has no such dataset.
    """
    try:
        raw = datasets.load_dataset(hub_id, hub_config)
    except _HUB_UNREADABLE as err:
        raise CorpusNotFoundError(
            f"cannot read hub dataset {hub_id}" + (f" ({hub_config})" if hub_config else "") + f": {err}"
        ) from err
    out = {}
    for name, hub_split in splits.items():
        if hub_split not in raw:
            raise CorpusError(
                f"{hub_id} ({hub_config}) has no split {hub_split!r} (wanted as {name}); it has {list(raw)}"
            )
        out[name] = raw[hub_split]
    return out


def load_hub_corpus(
    hub_id: str,
    src_lang: str,
    tgt_lang: str,
    hub_config: str | None = None,
    train_split: str = "train",
    valid_split: str = "validation",
    test_split: str = "test",
) -> datasets.DatasetDict:
    """Load a parallel corpus from the Hugging Face hub into memory (see :func:`prepare_corpus`).

    Args:
        hub_id: dataset id, e.g. ``"bentrevett/multi30k"`` or ``"wmt14"``.
        src_lang: source language key.
        tgt_lang: target language key.
        hub_config: dataset configuration name, e.g. ``"de-en"`` for ``wmt14``.
        train_split: hub split read as ``train``.
        valid_split: hub split read as ``validation``.
        test_split: hub split read as ``test``.

    Returns:
        Unfiltered splits with columns ``id``, ``src``, ``tgt``.

    Raises:
        CorpusError: a split is missing; the message lists the splits that exist.
        CorpusNotFoundError: the hub cannot be reached and the dataset is not cached, or the
            hub has no such dataset.
    """
    raw = _read_hub(hub_id, hub_config, _split_names(train_split, valid_split, test_split))
    return datasets.DatasetDict({name: normalize_columns(ds, src_lang, tgt_lang) for name, ds in raw.items()})


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
    """

    splits: datasets.DatasetDict
    digests: dict[str, str]
    seconds: dict[str, float]
    reused: bool


def _source_key(source: CorpusSource, src_lang: str, tgt_lang: str, identity: object) -> str:
    settings = {
        "version": _CORPUS_CACHE_VERSION,
        "langs": [src_lang, tgt_lang],
        "source": [str(source.data_dir), source.hub_id, source.hub_config, list(source.splits)],
        "identity": identity,
    }
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
) -> PreparedCorpus:
    """Stream a parallel corpus into Arrow, drop blank training pairs, cache it; or reuse the cache.

    The source is chosen by :func:`resolve_corpus_source` and named in a log line. Files are read
    block by block (:func:`iter_parallel_blocks`) and hub splits batch by batch, each block
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

    Raises:
        CorpusNotFoundError: the chosen source cannot be read; when it is the fallback, the
            message names the three local options and the hub id.
        CorpusError: misaligned, undecodable or corrupt files, or a missing hub split.
    """
    source = resolve_corpus_source(
        data_dir, hub_id, hub_config, fallback_hub_id, train_split, valid_split, test_split
    )
    logger.info("corpus: %s", source.describe())
    names = _split_names(*source.splits)
    if source.hub_id is None:
        files = _local_files(source.data_dir, src_lang, tgt_lang, *source.splits)
        identity = {name: [_file_identity(p) for p in pair] for name, pair in files.items()}

        def blocks(name: str) -> Iterator:
            return _local_blocks(*files[name])

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

        def blocks(name: str) -> Iterator:
            return _hub_blocks(hub[name], src_lang, tgt_lang)

        def origin(name: str) -> str:
            return f"{source.hub_id} split {names[name]}"

    def build(directory: Path | None) -> PreparedCorpus:
        splits, digests, seconds = {}, {}, {"read": 0.0, "filter": 0.0}
        for name in SPLITS:
            path = None if directory is None else directory / f"{name}.arrow"
            if path is not None:
                remove_temporaries(path)
            splits[name], stats = write_pairs(blocks(name), path, drop_blank=name == "train")
            digests[name] = stats.digest
            for stage, value in stats.seconds.items():
                seconds[stage] += value
            logger.info("read %d %s pairs from %s", stats.rows, name, origin(name))
            if name == "train":
                logger.info(
                    "%s: kept %d of %d pairs; dropped %d with an empty side, %d with a whitespace-only side",
                    name,
                    stats.kept,
                    stats.rows,
                    stats.empty,
                    stats.blank,
                )
        if directory is not None:  # the marker, last: only now is the entry complete
            meta = {"digests": digests, "sizes": {k: len(v) for k, v in splits.items()}}
            with atomic_write(directory / _COMPLETE) as f:
                f.write((json.dumps(meta, indent=2) + "\n").encode())
        return PreparedCorpus(datasets.DatasetDict(splits), digests, seconds, reused=False)

    if cache_dir is None:
        return build(None)
    entry = Path(cache_dir) / "corpus" / _source_key(source, src_lang, tgt_lang, identity)
    if not (entry / _COMPLETE).is_file():
        with exclusive(entry):
            if not (entry / _COMPLETE).is_file():
                entry.mkdir(parents=True, exist_ok=True)
                return build(entry)
    meta = json.loads((entry / _COMPLETE).read_text())
    splits = datasets.DatasetDict(
        {name: datasets.Dataset.from_file(str(entry / f"{name}.arrow")) for name in SPLITS}
    )
    logger.info("reusing corpus %s (%s)", entry, ", ".join(f"{k} {v}" for k, v in meta["sizes"].items()))
    return PreparedCorpus(splits, meta["digests"], {"read": 0.0, "filter": 0.0}, reused=True)


def load_parallel_corpus(
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
) -> datasets.DatasetDict:
    """The splits of :func:`prepare_corpus` (same arguments): blank training pairs dropped.

    Returns:
        ``DatasetDict`` with ``train`` / ``validation`` / ``test``, columns ``id``, ``src``, ``tgt``.
    """
    return prepare_corpus(
        src_lang,
        tgt_lang,
        data_dir,
        hub_id,
        hub_config,
        train_split,
        valid_split,
        test_split,
        fallback_hub_id,
        cache_dir,
    ).splits
