"""``TranslationDataModule``: corpus, subwords and token-budget batches behind Lightning's interface.

Built from the ``data:`` keys as keyword arguments, so that Hydra instantiates it from
``conf/data/*.yaml`` (``_target_: data.datamodule.TranslationDataModule``) and a checkpoint's saved
hyperparameters stay plain; the keys are read into typed values at once
(:class:`data.settings.DataSettings`). Set-up runs :func:`data.loading.load_data`; this module
serves its batches. The Trainer must run with ``use_distributed_sampler=False``: the batch sampler
already splits batches across ranks (rank and world size are read from ``self.trainer``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import datasets
import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from data.batching import TokenBucketBatchSampler, collate_columns, padding_fraction
from data.filters import PairFilters
from data.length_buckets import bucketed_padding, distinct_shapes
from data.loading import load_data
from data.mixing import CorpusMix
from data.settings import DataSettings, config_defaults
from data.tokenized_pairs import TokenizedPairs
from data.tokenizer import SubwordTokenizer

logger = logging.getLogger(__name__)


class _ResumableLoader(DataLoader):
    """The training DataLoader, marked resumable for Lightning (which otherwise warns on resume).

    Its state is the DataModule's (:meth:`TranslationDataModule.state_dict`); Lightning saves it
    once through the loader and once through the DataModule, and restoring it twice is harmless.
    """

    def __init__(self, *args: object, datamodule: TranslationDataModule, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._datamodule = datamodule

    def state_dict(self) -> dict:
        return self._datamodule.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._datamodule.load_state_dict(state_dict)


class TranslationDataModule(L.LightningDataModule):
    """Loads a parallel corpus, trains, reuses or is given SentencePiece, and serves padded batches.

    Batches are dicts from :func:`data.batching.collate_columns`: ``src`` [B, S], ``src_lengths``
    [B], ``tgt_in`` [B, T], ``tgt_out`` [B, T], ``tgt_lengths`` [B], ``ids`` [B], ``tgt_positions`` [N].

    Args:
        **config: the ``data:`` keys (conf/data/multi30k.yaml says what each means and its
            default), read into :attr:`settings`; saved as given, the rest at their defaults, as
            the module's hyperparameters (plain containers a checkpoint stores).

    Raises:
        ValueError: an unknown key or a bad value, naming ``data.<key>``.

    Attributes:
        settings: the keys as typed values: the corpora and their locations, the tokenizer, the
            batches, the filters, the places and the loaders' knobs.
        corpus: after set-up, the raw splits (``id``, ``src``, ``tgt``).
        tokenized: after set-up, the tokenized splits (``id``, ``src_ids``, ``tgt_ids``, lengths).
        lengths: after set-up, per split, ``([N] source widths, [N] target widths)``.
        src_tokenizer, tgt_tokenizer: after set-up, the SentencePiece models.
        corpus_summary: after set-up, per training corpus: pairs, weight, pairs per epoch, tag.
        filtered: after set-up, per training corpus: the pairs ``data.filters`` dropped, by reason.
        stage_seconds: after set-up, the read, filter, sentencepiece and tokenize stages' wall time.
        epoch_offset: added to the epoch that orders the training batches: a fine-tuned run
            continuing its checkpoint's data order sets it (training/finetune_reset.py); a resumed
            run gets it back with the sampler's state.
    """

    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.settings = DataSettings.from_config(config)  # refused at once, naming the key
        self.save_hyperparameters({**config_defaults(), **config})
        self.corpus: datasets.DatasetDict | None = None
        self.tokenized: datasets.DatasetDict | None = None
        self.lengths: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.src_tokenizer: SubwordTokenizer | None = None
        self.tgt_tokenizer: SubwordTokenizer | None = None
        self.corpus_summary: list[dict] = []
        self.filtered: dict[str, dict[str, int]] = {}
        self.stage_seconds: dict[str, float] = {}
        self._served: dict[str, TokenizedPairs] = {}  # what the loaders fetch batches from
        self._mix: CorpusMix | None = None
        self._train_sampler: TokenBucketBatchSampler | None = None
        self._pending_train_state: dict | None = None
        self._padding_logged = False
        self.epoch_offset = 0

    # ----------------------------------------------------------------- loading

    def prepare_data(self) -> None:
        """Read the corpus, train or reuse SentencePiece and tokenize, filling the caches.

        Lightning calls it on local rank 0 only; where every rank calls it (``train.py`` does,
        before the Trainer exists, under any launcher), the cache entries' locks make one process
        prepare each entry while the others wait and then memory-map it.
        """
        self._load()

    def setup(self, stage: str | None = None) -> None:
        """Load everything, memory-mapping the caches written by :meth:`prepare_data`."""
        self._load()
        if stage in (None, "fit") and not self._padding_logged:  # train.py and Lightning both set up
            self._log_train_padding()
            self._padding_logged = True

    def _load(self) -> None:
        if self.tokenized is not None:
            return
        loaded = load_data(self.settings)
        self.corpus, self.tokenized, self.lengths = loaded.corpus, loaded.tokenized, loaded.lengths
        self.src_tokenizer, self.tgt_tokenizer = loaded.src_tokenizer, loaded.tgt_tokenizer
        self.corpus_summary, self.filtered = loaded.corpus_summary, loaded.filtered
        self.stage_seconds = loaded.stage_seconds
        self._served, self._mix = loaded.served, loaded.mix

    def _log_train_padding(self) -> None:
        """Logs the first epoch's padding and batch shapes; with ``length_buckets``, what they cost."""
        lengths, batches = self.lengths["train"], self.settings.batches
        plain = self.batch_sampler("train", buckets=False).global_batches()
        logger.info(
            "train padding fraction at max_tokens=%d: %.4f (%d batch shapes an epoch)",
            batches.max_tokens,
            padding_fraction(plain, *lengths),
            distinct_shapes(plain, *lengths),
        )
        if batches.length_buckets is None:
            return
        bucketed = self.batch_sampler("train").global_batches()
        padding, fillers, shapes = bucketed_padding(
            bucketed, *lengths, batches.length_buckets, batches.max_tokens
        )
        logger.info(
            "train padding fraction with data.length_buckets=%s: %.4f, filler rows %.4f "
            "(%d batch shapes, %d batches)",
            list(batches.length_buckets.lengths),
            padding,
            fillers,
            shapes,
            len(bucketed),
        )

    # --------------------------------------------------------------- accessors

    @property
    def filters(self) -> PairFilters:
        """``data.filters``: which training pairs are dropped, where each training corpus is read
        and (lengths in pieces) once it is tokenized."""
        return self.settings.filters

    @property
    def listed(self) -> bool:
        """Whether ``data.corpora`` lists the training corpora."""
        return self.settings.corpora.listed

    @property
    def reserved(self) -> list[str]:
        """Every tag the sources can carry, kept one SentencePiece piece."""
        return self.settings.corpora.reserved

    @property
    def validation_splits(self) -> list[str]:
        """The split keys validated, in the order of :meth:`val_dataloader`'s loaders:
        ``["validation/<name>", ...]`` for ``valid_sets``, else ``["validation"]``."""
        return self.settings.corpora.validation_splits

    def split_target_lang(self, split: str) -> str:
        """The target language of a split's references (a validation set's own, else ``tgt_lang``):
        what chooses BLEU's tokenizer (``common.metrics``)."""
        return self.settings.corpora.split_target_lang(split)

    @property
    def valid_set_names(self) -> list[str]:
        """The names of ``valid_sets`` in loader order; [] where the main validation split alone is."""
        return [v.name for v in self.settings.corpora.valid_sets]

    @property
    def target_tags(self) -> dict[str, str]:
        """With ``target_lang_tags``: each target language's source tag (``{"fr": "<2fr>"}``), else {}."""
        return self.settings.corpora.target_tags

    @property
    def src_vocab_size(self) -> int:
        """Source vocabulary size (after :meth:`setup`)."""
        assert self.src_tokenizer is not None, "call setup() first"
        return self.src_tokenizer.vocab_size

    @property
    def tgt_vocab_size(self) -> int:
        """Target vocabulary size (after :meth:`setup`)."""
        assert self.tgt_tokenizer is not None, "call setup() first"
        return self.tgt_tokenizer.vocab_size

    def source_texts(self, split: str) -> list[str]:
        """Raw source sentences of one of :attr:`validation_splits` or ``"test"``; item ``i`` has
        ``id == i``."""
        return self._raw_column(split, "src")

    def reference_texts(self, split: str) -> list[str]:
        """Raw target sentences (references) of one of :attr:`validation_splits` or ``"test"``,
        indexed by id."""
        return self._raw_column(split, "tgt")

    def _raw_column(self, split: str, column: str) -> list[str]:
        evaluated = [*self.validation_splits, "test"]
        if split not in evaluated:
            raise ValueError(f"texts by id exist for {', '.join(map(repr, evaluated))}, not {split!r}")
        assert self.corpus is not None, "call setup() first"
        return list(self.corpus[split][column])

    # ------------------------------------------------------------- dataloaders

    @property
    def num_workers(self) -> int:
        """``data.num_workers``; settable between loaders (a new value reaches the next loader)."""
        return self.settings.num_workers

    @num_workers.setter
    def num_workers(self, value: int) -> None:
        self.settings = dataclasses.replace(self.settings, num_workers=value)

    @property
    def pin_memory(self) -> bool | None:
        """``data.pin_memory``; settable between loaders, as :attr:`num_workers`."""
        return self.settings.pin_memory

    @pin_memory.setter
    def pin_memory(self, value: bool | None) -> None:
        self.settings = dataclasses.replace(self.settings, pin_memory=value)

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def batch_sampler(
        self,
        split: str,
        num_replicas: int = 1,
        rank: int = 0,
        buckets: bool = True,
        max_tokens: int | None = None,
    ) -> TokenBucketBatchSampler:
        """A fresh sampler over ``split``: shuffled for ``train``, fixed order otherwise; training's
        cut by ``length_buckets`` unless ``buckets`` is False (validation and test never are), at
        ``max_tokens`` padded tokens a batch (None: the settings' budget for ``split``)."""
        assert self.tokenized is not None, "call setup() first"
        src_len, tgt_len = self.lengths[split]
        train, batches = split == "train", self.settings.batches
        return TokenBucketBatchSampler(
            src_len,
            tgt_len,
            max_tokens=batches.budget(split) if max_tokens is None else max_tokens,
            shuffle=train,
            seed=batches.seed,
            num_replicas=num_replicas,
            rank=rank,
            mix=self._mix if train else None,
            length_buckets=batches.length_buckets if train and buckets else None,
        )

    def train_padding_fraction(self) -> float:
        """Padding share of the first epoch's training batches (all ranks' batches together),
        without ``length_buckets``."""
        sampler = self.batch_sampler("train", buckets=False)
        return padding_fraction(sampler.global_batches(), *self.lengths["train"])

    def _pin_memory(self) -> bool:
        """``pin_memory``, or when None (auto): whether the Trainer trains on a CUDA device."""
        if self.pin_memory is not None:
            return self.pin_memory
        strategy = getattr(self.trainer, "strategy", None)  # None: no Trainer (yet)
        return strategy is not None and strategy.root_device.type == "cuda"

    def _loader(self, split: str, sampler: TokenBucketBatchSampler) -> DataLoader:
        collate, batches = collate_columns, self.settings.batches
        if split == "train" and batches.length_buckets is not None:  # a partial: picklable for workers
            collate = functools.partial(
                collate_columns, length_buckets=batches.length_buckets, max_tokens=sampler.max_tokens
            )
        kwargs = {
            "batch_sampler": sampler,
            "collate_fn": collate,
            "num_workers": self.num_workers,
            "persistent_workers": self.num_workers > 0,
            "pin_memory": self._pin_memory(),
            # Its own generator: creating an iterator draws a worker seed, and drawing it from the
            # global RNG (which drives dropout) would make dropout depend on how many loaders were
            # built before, e.g. by a sanity check; exact resumption needs that independence.
            "generator": torch.Generator().manual_seed(batches.seed),
        }
        dataset = self._served[split]
        if split == "train":
            return _ResumableLoader(dataset, datamodule=self, **kwargs)
        return DataLoader(dataset, **kwargs)

    def train_dataloader(self) -> DataLoader:
        """Shuffled token-budget batches; this rank's share when under a distributed Trainer."""
        sampler = self.batch_sampler("train", *self._world())
        sampler.epoch_offset = self.epoch_offset
        if self._pending_train_state is not None:
            self._restore(sampler, self._pending_train_state)
            self._pending_train_state = None
        self._train_sampler = sampler
        return self._loader("train", sampler)

    def train_loader_at(self, max_tokens: int) -> DataLoader:
        """The training batches as ``data.max_tokens=max_tokens`` would cut them (this rank's share,
        the same shuffle), for timing a batch size the run may choose; the run's own loader and its
        resumption state are untouched."""
        return self._loader("train", self.batch_sampler("train", *self._world(), max_tokens=max_tokens))

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Validation batches in a fixed order (sorted by length), split across ranks: one loader
        for the main validation split, or a list of one per validation set, in
        :attr:`validation_splits` order (Lightning's ``dataloader_idx``)."""
        loaders = [self._loader(s, self.batch_sampler(s, *self._world())) for s in self.validation_splits]
        return loaders if self.settings.corpora.valid_sets else loaders[0]

    def test_dataloader(self) -> DataLoader:
        """Test batches in a fixed order (sorted by length), split across ranks."""
        return self._loader("test", self.batch_sampler("test", *self._world()))

    # ------------------------------------------------------------ resumption

    def state_dict(self) -> dict:
        """The training sampler's epoch and position, saved in Lightning checkpoints.

        Under a Trainer the position is the number of batches trained in the current epoch
        (``batch_progress.current.processed``), not the sampler's own count, which runs ahead by
        the batches the DataLoader prefetched.
        """
        if self._train_sampler is None:
            return {}
        state = self._train_sampler.state_dict()
        if self.trainer is not None:
            state["epoch"] = self.trainer.current_epoch
            state["position"] = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"train_sampler": state}

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume the training sampler's position (applied when the train dataloader is built)."""
        state = state_dict.get("train_sampler")
        if state is None:
            return
        if self._train_sampler is not None:
            self._restore(self._train_sampler, state)
        else:
            self._pending_train_state = state

    @staticmethod
    def _restore(sampler: TokenBucketBatchSampler, state: dict) -> None:
        try:
            sampler.load_state_dict(state)
        except ValueError as err:
            logger.warning("not resuming the batch order mid-epoch: %s", err)
