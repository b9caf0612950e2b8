"""Where a parallel corpus comes from (local files, the hub, their errors) and how it is read.

A corpus is a ``datasets.DatasetDict`` with ``train`` / ``validation`` / ``test`` splits.

Two sources give the same result, each split with columns ``id`` (int), ``src`` (str), ``tgt`` (str):

* a hub dataset (``hub_id``), either with flat language columns (``{"de": ..., "en": ...}``, as in
  the usual Multi30k upload) or with a ``translation`` dict column (WMT, IWSLT uploads);
* a local directory laid out ``{split}.{lang}`` or ``{split}.{lang}.gz`` (Multi30k, fairseq).

Where a corpus is, which languages are read from it and what its splits are called there is one
value, :class:`CorpusLocation` (the ``data:`` keys ``src_lang`` ... ``fallback_hub_id``). Which
source it is read from (:meth:`CorpusLocation.resolve`): an explicit ``hub_id``; else the first local
directory of an explicit ``data_dir``, ``$MULTI30K_DIR``, ``<project root>/../shared/data/multi30k``;
else, where none of these is given or exists, the fallback hub dataset (``bentrevett/multi30k``, the
same Multi30k splits under the hub's names train / validation / test), downloaded once and cached
by ``datasets``. A log line names the source and why it was chosen.

``id`` is the row index of the example within its split *before* filtering, i.e. the line number
(0-based) in the local files, the row number in a hub split. Validation and test are never
filtered, so there ``id`` is also the position of the row and of its reference.

Hub rows are taken as they are (no stripping, no splitting on any separator), as local lines are.
Local files are read by :func:`data.lines.iter_line_blocks` in its strict mode (``LineMode.STRICT``):
split on ``b"\\n"`` only, so ``\\r``, U+2028, ``\\x85``, ... stay inside their line and source and
target stay aligned; ``\\r\\n`` read as a line end, with a warning naming the file; a byte order
mark removed; invalid UTF-8 or a NUL byte an error naming the file and line, or, with
``bad_lines="skip"``, a training pair dropped, counted and logged by file and line
(:class:`SkippedLines`). Hub splits are read by :mod:`data.hub`.

Preparing a corpus for training (streamed into a cache entry, blank training pairs dropped) is
:mod:`data.prepared`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from data.lines import BadLineError, CorruptFileError, OnBadLine, UndecodableLineError, iter_line_blocks

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
# Skipped lines logged one by one, per file; the rest are counted.
_LOGGED_SKIPS = 10


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


@dataclass(frozen=True)
class CorpusLocation:
    """Where a parallel corpus is, the languages read from it, and what its splits are called there.

    The ``data:`` keys of the main corpus (conf/data/multi30k.yaml) and, resolved against them,
    of each ``data.corpora`` and ``data.valid_sets`` entry (:mod:`data.corpora`): what
    :func:`data.prepared.prepare_corpus` reads and what its cache entry is keyed on.

    Attributes:
        src_lang: source language: the file suffix (``{split}.de.gz``) or the hub column.
        tgt_lang: target language.
        data_dir: local directory of ``{split}.{lang}[.gz]`` files; ``None``: ``$MULTI30K_DIR``,
            else ``<project root>/../shared/data/multi30k`` where it exists, else ``fallback_hub_id``.
        hub_id: hub dataset id; takes precedence over ``data_dir`` when set.
        hub_config: hub dataset configuration, e.g. ``"de-en"``.
        train_split: the source's name of the split read as ``train`` (local files, or ``hub_id``).
        valid_split: the source's name of the split read as ``validation`` (``"val"`` in Multi30k).
        test_split: the source's name of the split read as ``test`` (``"test_2016_flickr"``).
        fallback_hub_id: hub dataset read, with the hub's split names :data:`HUB_SPLITS`, where no
            local directory is given or found; ``None``: no fallback (a missing directory is an error).

    Raises:
        ValueError: a language or split name that is empty, naming its ``data.`` key.
    """

    src_lang: str = "de"
    tgt_lang: str = "en"
    data_dir: str | None = None
    hub_id: str | None = None
    hub_config: str | None = None
    train_split: str = "train"
    valid_split: str = "val"
    test_split: str = "test_2016_flickr"
    fallback_hub_id: str | None = MULTI30K_HUB_ID

    def __post_init__(self) -> None:
        for key in ("src_lang", "tgt_lang", "train_split", "valid_split", "test_split"):
            if not getattr(self, key):
                raise ValueError(f"data.{key} must name a language or split, not {getattr(self, key)!r}")

    @property
    def split_names(self) -> tuple[str, str, str]:
        """The source's names of the splits read as train, validation and test."""
        return (self.train_split, self.valid_split, self.test_split)

    def resolve(self) -> CorpusSource:
        """The source read: ``hub_id`` > ``data_dir`` > ``$MULTI30K_DIR`` > ../shared > fallback hub.

        An explicit ``hub_id``, ``data_dir`` or ``$MULTI30K_DIR`` is used even if it turns out not
        to exist (reading it then fails with a message naming it): a typo must not silently turn
        into a download. The shared directory is used only where it exists; otherwise
        ``fallback_hub_id`` is read with the hub's split names :data:`HUB_SPLITS`. With no
        fallback, the shared directory is returned anyway, and reading it fails naming it.
        """
        splits = self.split_names
        if self.hub_id:
            return CorpusSource(None, self.hub_id, self.hub_config, splits, "hub_id")
        if self.data_dir is not None:
            return CorpusSource(Path(self.data_dir), None, None, splits, "data_dir")
        env = os.environ.get(DATA_DIR_ENV)
        if env:
            return CorpusSource(Path(env), None, None, splits, f"${DATA_DIR_ENV}")
        shared = shared_data_dir()
        if shared.is_dir() or not self.fallback_hub_id:
            return CorpusSource(shared, None, None, splits, "../shared/data/multi30k")
        return CorpusSource(None, self.fallback_hub_id, None, HUB_SPLITS, "fallback")


@dataclass(frozen=True)
class CorpusSource:
    """Where a corpus is read from, as :meth:`CorpusLocation.resolve` chose, and its split names there.

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


def _no_local_copy_message(location: CorpusLocation, hub_id: str, reason: BaseException) -> str:
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
            f"Put the files {{{','.join(location.split_names)}}}.{{{location.src_lang},{location.tgt_lang}}}"
            "[.gz] in a directory given by one of (checked in this order):",
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


def _corpus_errors(blocks: Iterator[list[str]], skippable: bool) -> Iterator[list[str]]:
    """``blocks``, with a file's bad or corrupt content raised as a :class:`CorpusError` saying what to do.

    ``skippable``: the lines are training lines, which ``bad_lines=skip`` could drop.
    """
    try:
        yield from blocks
    except BadLineError as err:
        fix = (
            "re-encode the file as UTF-8 (iconv -f ITS_ENCODING -t UTF-8) or remove the line"
            if isinstance(err, UndecodableLineError)
            else "remove the NUL bytes (tr -d '\\000') or the line"
        )
        if skippable:
            fix += ", or set data.bad_lines=skip to drop such training pairs (counted and logged)"
        else:
            fix += " (data.bad_lines=skip drops training pairs only: the others are scored line by line)"
        raise CorpusError(f"{err}: {fix}") from None
    except CorruptFileError as err:
        raise CorpusError(str(err)) from None


class SkippedLines:
    """The lines whose pairs ``bad_lines="skip"`` drops (invalid UTF-8, NUL bytes), by file.

    Each file's first :data:`_LOGGED_SKIPS` are logged as they are met; :meth:`summary` counts all.

    Attributes:
        lines: numbers (from 1) of the lines dropped, in either file of the pair.
    """

    def __init__(self) -> None:
        self.lines: set[int] = set()
        self._by_file: dict[str, list[int]] = {}

    def recorder(self, path: Path) -> OnBadLine:
        """What :func:`data.lines.iter_line_blocks` calls for each bad line of ``path``."""
        numbers = self._by_file.setdefault(str(path), [])

        def record(line: int, fault: str) -> None:
            self.lines.add(line)
            numbers.append(line)
            if len(numbers) <= _LOGGED_SKIPS:
                logger.warning("%s line %d: %s: pair skipped (bad_lines=skip)", path, line, fault)

        return record

    def summary(self) -> str:
        """``"3 pairs: a.de 2 (lines 5, 9), a.en 1 (line 7)"``, or ``""`` when none was skipped."""
        if not self.lines:
            return ""
        parts = []
        for name, numbers in self._by_file.items():
            if numbers:
                shown = ", ".join(map(str, numbers[:_LOGGED_SKIPS])) + (
                    ", ..." if len(numbers) > _LOGGED_SKIPS else ""
                )
                parts.append(f"{name} {len(numbers)} (line{'s' if len(numbers) > 1 else ''} {shown})")
        return f"{len(self.lines)} pair{'s' if len(self.lines) > 1 else ''}: " + ", ".join(parts)


def iter_parallel_blocks(
    src_path: Path, tgt_path: Path, skipped: SkippedLines | None = None, skippable: bool = True
) -> Iterator[tuple[list[str], list[str]]]:
    """Stream two line-aligned files as aligned blocks of ``(source lines, target lines)``.

    Each file is read by :func:`data.lines.iter_line_blocks` (the strict mode, in bounded memory).

    Args:
        src_path: the source file.
        tgt_path: the target file, line for line.
        skipped: where lines with invalid UTF-8 or a NUL byte are recorded (they are yielded with
            invalid bytes replaced, for the caller to drop); ``None``: such a line is an error.
        skippable: the files are a training split, whose bad lines ``bad_lines=skip`` could drop
            (the error says so).

    Raises:
        CorpusError: the line counts differ (the message names both files and both counts,
            counted to the end of both files); without ``skipped``, a line with invalid UTF-8 or
            a NUL byte (the message names the file, the line and the byte); a compressed file is
            not gzip, or is corrupt or cut short (the message names the file and the last line
            read whole).
    """
    src_blocks, tgt_blocks = (
        _corpus_errors(iter_line_blocks(path, None if skipped is None else skipped.recorder(path)), skippable)
        for path in (src_path, tgt_path)
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
        raise CorpusError(
            f"line counts differ: {src_path} has {src_n} lines, {tgt_path} has {tgt_n} lines; line N of"
            " one must be the translation of line N of the other: look for a sentence broken over two"
            " lines or a line missing (paste the files side by side to find where they part)"
        )


def _split_names(train_split: str, valid_split: str, test_split: str) -> dict[str, str]:
    return {"train": train_split, "validation": valid_split, "test": test_split}


def _local_blocks(
    src_path: Path, tgt_path: Path, skipped: SkippedLines | None = None, skippable: bool = True
) -> Iterator[tuple[np.ndarray, list[str], list[str]]]:
    """Aligned blocks of ``(line ids from 0, sources, targets)``; the pairs ``skipped`` records left out."""
    start = 0
    for src, tgt in iter_parallel_blocks(src_path, tgt_path, skipped, skippable):
        ids = np.arange(start, start + len(src), dtype=np.int64)
        start += len(src)
        if skipped is not None and skipped.lines:
            keep = [i for i in range(len(src)) if int(ids[i]) + 1 not in skipped.lines]
            if len(keep) < len(src):
                ids, src, tgt = ids[keep], [src[i] for i in keep], [tgt[i] for i in keep]
        if src:
            yield ids, src, tgt


def _local_files(
    data_dir: str | Path, src_lang: str, tgt_lang: str, *splits: str, only: Sequence[str] = SPLITS
) -> dict[str, tuple[Path, Path]]:
    """The source and target file of every split (of those in ``only``), all located before any is read."""
    return {
        name: (find_split_file(data_dir, prefix, src_lang), find_split_file(data_dir, prefix, tgt_lang))
        for name, prefix in _split_names(*splits).items()
        if name in only
    }
