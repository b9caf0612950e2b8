"""A Hugging Face hub dataset's splits read as sentence pairs, block by block.

Either layout gives the same pairs: flat language columns (``{"de": ..., "en": ...}``, as in the
usual Multi30k upload) or a ``translation`` dict column (WMT, IWSLT uploads). Rows are taken as
they are (no stripping, no splitting on any separator), as local lines are; ``id`` is the row
number in the split. Which hub dataset is read is :meth:`data.corpus.CorpusLocation.resolve`'s
choice; :func:`data.prepared.prepare_corpus` streams the blocks into its cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import datasets
import numpy as np
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub.errors import LocalEntryNotFoundError

from data.corpus import CorpusError, CorpusNotFoundError

# What the hub raises when it cannot be reached and the dataset is not in the cache (offline,
# HF_HUB_OFFLINE=1, a timeout), or when the dataset does not exist there.
_HUB_UNREADABLE = (ConnectionError, TimeoutError, LocalEntryNotFoundError, DatasetNotFoundError)
# Rows per block when a hub split is streamed into the corpus cache.
_HUB_BLOCK_ROWS = 50_000


def pair_picker(
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


def hub_blocks(
    dataset: datasets.Dataset, src_lang: str, tgt_lang: str
) -> Iterator[tuple[np.ndarray, list[str], list[str]]]:
    """Blocks of ``(row ids from 0, sources, targets)`` of a hub split, :data:`_HUB_BLOCK_ROWS` at a time."""
    pick = pair_picker(dataset, src_lang, tgt_lang)
    start = 0
    for batch in dataset.iter(batch_size=_HUB_BLOCK_ROWS):
        src, tgt = pick(batch)
        yield np.arange(start, start + len(src), dtype=np.int64), list(src), list(tgt)
        start += len(src)


def read_hub(hub_id: str, hub_config: str | None, splits: dict[str, str]) -> dict[str, datasets.Dataset]:
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
