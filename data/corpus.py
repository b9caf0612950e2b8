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

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub.errors import LocalEntryNotFoundError

from data.lines import LineMode, UndecodableLineError, read_lines

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


def read_parallel_files(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str]]:
    """Read two line-aligned files.

    Raises:
        CorpusError: a file is not valid UTF-8 (the message names the file, the line and the
            bytes), or the line counts differ (the message names both files and both counts).
    """
    try:
        src = read_lines(src_path, LineMode.STRICT)
        tgt = read_lines(tgt_path, LineMode.STRICT)
    except UndecodableLineError as err:
        raise CorpusError(str(err)) from None
    if len(src) != len(tgt):
        raise CorpusError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)} lines"
        )
    return src, tgt


def _split_names(train_split: str, valid_split: str, test_split: str) -> dict[str, str]:
    return {"train": train_split, "validation": valid_split, "test": test_split}


def load_local_corpus(
    data_dir: str | Path,
    src_lang: str,
    tgt_lang: str,
    train_split: str = "train",
    valid_split: str = "val",
    test_split: str = "test_2016_flickr",
) -> datasets.DatasetDict:
    """Load ``{split}.{lang}[.gz]`` files into splits ``train`` / ``validation`` / ``test``.

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
    for name, prefix in _split_names(train_split, valid_split, test_split).items():
        src_path = find_split_file(data_dir, prefix, src_lang)
        tgt_path = find_split_file(data_dir, prefix, tgt_lang)
        src, tgt = read_parallel_files(src_path, tgt_path)
        out[name] = datasets.Dataset.from_dict(
            {"id": list(range(len(src))), "src": src, "tgt": tgt}, features=_features()
        )
        logger.info("read %d %s pairs from %s and %s", len(src), name, src_path, tgt_path)
    return datasets.DatasetDict(out)


def _features() -> datasets.Features:
    return datasets.Features(
        {"id": datasets.Value("int64"), "src": datasets.Value("string"), "tgt": datasets.Value("string")}
    )


def normalize_columns(dataset: datasets.Dataset, src_lang: str, tgt_lang: str) -> datasets.Dataset:
    """Bring a hub split to columns ``id``, ``src``, ``tgt``.

    Args:
        dataset: a split with either a ``translation`` column of ``{lang: text}`` dicts or one
            string column per language.
        src_lang: source language key.
        tgt_lang: target language key.

    Raises:
        CorpusError: neither layout is present, or a language is missing.
    """
    columns = dataset.column_names
    if "translation" in columns:
        pair = dataset.features["translation"]
        langs = list(pair.languages) if isinstance(pair, datasets.Translation) else list(pair)
        if langs and (src_lang not in langs or tgt_lang not in langs):
            raise CorpusError(
                f"translation column has languages {langs}, not both {src_lang!r} and {tgt_lang!r}"
            )

        def pick(batch: dict) -> dict:
            return {
                "src": [t[src_lang] for t in batch["translation"]],
                "tgt": [t[tgt_lang] for t in batch["translation"]],
            }

    elif src_lang in columns and tgt_lang in columns:

        def pick(batch: dict) -> dict:
            return {"src": batch[src_lang], "tgt": batch[tgt_lang]}

    else:
        raise CorpusError(
            f"expected a 'translation' column or columns {src_lang!r} and {tgt_lang!r}; "
            f"the dataset has {columns}"
        )
    dataset = dataset.map(pick, batched=True, remove_columns=columns, desc="select languages")
    dataset = dataset.add_column("id", list(range(len(dataset))))
    return dataset.select_columns(["id", "src", "tgt"]).cast(_features())


def load_hub_corpus(
    hub_id: str,
    src_lang: str,
    tgt_lang: str,
    hub_config: str | None = None,
    train_split: str = "train",
    valid_split: str = "validation",
    test_split: str = "test",
) -> datasets.DatasetDict:
    """Load a parallel corpus from the Hugging Face hub (needs the network or a warm hub cache).

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
    try:
        raw = datasets.load_dataset(hub_id, hub_config)
    except _HUB_UNREADABLE as err:
        raise CorpusNotFoundError(
            f"cannot read hub dataset {hub_id}" + (f" ({hub_config})" if hub_config else "") + f": {err}"
        ) from err
    out = {}
    for name, hub_split in _split_names(train_split, valid_split, test_split).items():
        if hub_split not in raw:
            raise CorpusError(
                f"{hub_id} ({hub_config}) has no split {hub_split!r} (wanted as {name}); it has {list(raw)}"
            )
        out[name] = normalize_columns(raw[hub_split], src_lang, tgt_lang)
    return datasets.DatasetDict(out)


def _iter_columns(dataset: datasets.Dataset, batch_size: int = 10_000) -> Iterator[tuple[str, str]]:
    for batch in dataset.iter(batch_size=batch_size):
        yield from zip(batch["src"], batch["tgt"], strict=True)


def drop_blank_pairs(dataset: datasets.Dataset, split: str = "train") -> datasets.Dataset:
    """Drop pairs with an empty or whitespace-only side, logging the counts.

    Args:
        dataset: columns ``src``, ``tgt``.
        split: name used in the log line.

    Returns:
        The kept rows (``id`` unchanged).
    """
    keep: list[int] = []
    empty = blank = 0
    for i, (src, tgt) in enumerate(_iter_columns(dataset)):
        if not src or not tgt:
            empty += 1
        elif not src.strip() or not tgt.strip():
            blank += 1
        else:
            keep.append(i)
    logger.info(
        "%s: kept %d of %d pairs; dropped %d with an empty side, %d with a whitespace-only side",
        split,
        len(keep),
        len(dataset),
        empty,
        blank,
    )
    return dataset if len(keep) == len(dataset) else dataset.select(keep)


def drop_long_pairs(
    dataset: datasets.Dataset,
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
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
    keep = [i for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)) if max(s, t) <= max_len]
    logger.info(
        "%s: kept %d of %d pairs; dropped %d longer than %d tokens",
        split,
        len(keep),
        len(dataset),
        len(dataset) - len(keep),
        max_len,
    )
    return dataset if len(keep) == len(dataset) else dataset.select(keep)


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
) -> datasets.DatasetDict:
    """Load a parallel corpus from the hub or a local directory and drop blank training pairs.

    The source is chosen by :func:`resolve_corpus_source` and named in a log line. Over-long pairs
    are dropped later, once lengths in subwords are known (:func:`drop_long_pairs`). Validation
    and test are never filtered: they are scored against their references line by line.

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

    Returns:
        ``DatasetDict`` with ``train`` / ``validation`` / ``test``, columns ``id``, ``src``, ``tgt``.

    Raises:
        CorpusNotFoundError: the chosen source cannot be read; when it is the fallback, the
            message names the three local options and the hub id.
    """
    source = resolve_corpus_source(
        data_dir, hub_id, hub_config, fallback_hub_id, train_split, valid_split, test_split
    )
    logger.info("corpus: %s", source.describe())
    if source.hub_id is None:
        corpus = load_local_corpus(source.data_dir, src_lang, tgt_lang, *source.splits)
    else:
        try:
            corpus = load_hub_corpus(source.hub_id, src_lang, tgt_lang, source.hub_config, *source.splits)
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
    corpus["train"] = drop_blank_pairs(corpus["train"], "train")
    return corpus
