"""The ``data:`` config keys (conf/data/*.yaml) as a few typed values that travel together.

Each key is a field of one value, or is read into one:

* :class:`data.corpus.CorpusLocation`: ``src_lang`` ... ``fallback_hub_id``, where the main corpus is;
* :class:`data.subword_models.TokenizerSettings`: ``joint_vocab`` ... ``tgt_spm_model``;
* :class:`BatchSettings`: ``max_len`` ... ``seed``, what the training and evaluation batches hold;
* :class:`data.corpora.RunCorpora`: ``corpora``, ``corpora_temperature``, ``target_lang_tags`` and
  ``valid_sets``, read against the main corpus's location;
* :class:`data.filters.PairFilters`: ``filters``;
* :class:`DataSettings`'s own: ``bad_lines``, ``num_workers``, ``pin_memory``, ``cache_dir``,
  ``run_dir``.

:meth:`DataSettings.from_config` reads them all, refusing an unknown key or a bad value at once and
naming the key; :func:`config_defaults` is every key with its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from data.corpora import RunCorpora
from data.corpus import CorpusLocation
from data.filters import PairFilters
from data.length_buckets import LengthBuckets
from data.prepared import BAD_LINES
from data.subword_models import TokenizerSettings
from data.tokenizer import default_cache_dir


@dataclass(frozen=True)
class BatchSettings:
    """What the batches hold: which training pairs, how they are segmented, cut and ordered.

    The ``data:`` keys of the same names.

    Attributes:
        max_len: training pairs whose source (with EOS) or target (with BOS/EOS) is longer than
            this many subwords are dropped (counts logged); validation and test are never cut.
        spm_sampling_alpha: subword regularisation of the training split (:mod:`data.sampling`):
            each batch's segmentation drawn afresh by SentencePiece, ``alpha`` its smoothing
            exponent (unigram) or merge dropout (BPE); ``None``: the one best segmentation.
        spm_sampling_nbest: with ``spm_sampling_alpha`` and a unigram model: sample among all
            segmentations (-1) or the ``nbest`` best.
        max_tokens: padded tokens per training batch, ``batch_size * max(src_len, tgt_len)``.
        eval_max_tokens: the same for validation and test; ``None`` means ``max_tokens``.
        length_buckets: the few lengths each training batch's lengths are padded up to, its rows
            up to ``max_tokens`` with filler pairs (:mod:`data.length_buckets`); ``None``: none.
        seed: seed of the per-epoch batch order (and of the subword sampling).
    """

    max_len: int = 250
    spm_sampling_alpha: float | None = None
    spm_sampling_nbest: int = -1
    max_tokens: int = 4096
    eval_max_tokens: int | None = None
    length_buckets: LengthBuckets | None = None
    seed: int = 1234

    def budget(self, split: str) -> int:
        """Padded tokens per batch of ``split``: ``max_tokens`` for ``"train"``, else the
        evaluation budget."""
        return self.max_tokens if split == "train" else self.eval_max_tokens or self.max_tokens


# Defaults of the keys that are no field of the values above, in conf/data/multi30k.yaml's order.
_OTHER_DEFAULTS: dict[str, Any] = {
    "num_workers": 0,
    "pin_memory": None,
    "cache_dir": None,
    "run_dir": None,
    "bad_lines": "error",
    "filters": None,
    "corpora": None,
    "corpora_temperature": None,
    "target_lang_tags": False,
    "valid_sets": None,
}
# The values whose fields are keys, in the config's order.
_GROUPS = (CorpusLocation, TokenizerSettings, BatchSettings)


def config_defaults() -> dict[str, Any]:
    """Every ``data:`` key with its default, in the order of conf/data/multi30k.yaml."""
    return {**{f.name: f.default for group in _GROUPS for f in fields(group)}, **_OTHER_DEFAULTS}


@dataclass(frozen=True)
class DataSettings:
    """Every ``data:`` key, read into the values that use it.

    Attributes:
        corpora: the main corpus's location (:attr:`location`), the training corpora and the
            validation sets.
        tokenizer: which SentencePiece models, given or trained how.
        batches: what the batches hold.
        filters: which training pairs are dropped where each training corpus is read.
        bad_lines: what a training line with invalid UTF-8 or a NUL byte does: ``"error"`` or ``"skip"``.
        cache_dir: root of the cached corpora, models and tokenized splits (``$NMT_CACHE_DIR``,
            else ``~/.cache/nmt-transformer``, where the key is null).
        run_dir: the run's directory, which gets a copy of the models; None: the cache only.
        num_workers: DataLoader worker processes (0: load in the main process).
        pin_memory: pin batches in page-locked memory; None: where the Trainer runs on CUDA.
    """

    corpora: RunCorpora
    tokenizer: TokenizerSettings
    batches: BatchSettings
    filters: PairFilters
    bad_lines: str
    cache_dir: str
    run_dir: str | None
    num_workers: int
    pin_memory: bool | None

    @property
    def location(self) -> CorpusLocation:
        """Where the main corpus is."""
        return self.corpora.main

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DataSettings:
        """The ``data:`` keys given (the rest at :func:`config_defaults`), read into their values.

        Args:
            config: ``data:`` keys; Hydra's own (``_target_``, ``_convert_``) are passed over.

        Raises:
            ValueError: an unknown key, or a bad value, naming ``data.<key>``; a language that
                ``data.filters.script`` or ``language`` cannot judge, or the language filter
                without its extra, naming the install command.
        """
        defaults = config_defaults()
        given = {key: value for key, value in config.items() if not str(key).startswith("_")}
        unknown = [key for key in given if key not in defaults]
        if unknown:
            raise ValueError(f"data.{unknown[0]} is not a data setting; they are {', '.join(defaults)}")
        c = {**defaults, **given}
        batches = BatchSettings(
            **_fields(BatchSettings, c, length_buckets=LengthBuckets.parse(c["length_buckets"]))
        )
        if c["bad_lines"] not in BAD_LINES:
            raise ValueError(f"data.bad_lines must be one of {', '.join(BAD_LINES)}, not {c['bad_lines']!r}")
        filters = PairFilters.from_dict(c["filters"])
        location = CorpusLocation(**_fields(CorpusLocation, c))
        corpora = RunCorpora.parse(
            location, c["corpora"], c["corpora_temperature"], c["valid_sets"], c["target_lang_tags"]
        )
        # A language the script or language filter cannot judge (or its missing extra) stops the run now.
        filters.check_languages(
            lang for t in corpora.training for lang in (t.location.src_lang, t.location.tgt_lang)
        )
        return cls(
            corpora=corpora,
            tokenizer=TokenizerSettings(**_fields(TokenizerSettings, c)),
            batches=batches,
            filters=filters,
            bad_lines=c["bad_lines"],
            cache_dir=c["cache_dir"] if c["cache_dir"] is not None else default_cache_dir(),
            run_dir=c["run_dir"],
            num_workers=c["num_workers"],
            pin_memory=c["pin_memory"],
        )


def _fields(group: type, config: Mapping[str, Any], **parsed: Any) -> dict[str, Any]:
    """The keys of ``config`` that are fields of ``group``, with ``parsed`` values in their place."""
    return {f.name: parsed.get(f.name, config[f.name]) for f in fields(group)}
