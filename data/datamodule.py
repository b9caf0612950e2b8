"""``TranslationDataModule``: corpus, subwords and token-budget batches behind Lightning's interface.

Built from plain keyword arguments so that Hydra instantiates it from ``conf/data/*.yaml``
(``_target_: data.datamodule.TranslationDataModule``) and a checkpoint's saved hyperparameters
stay plain. The Trainer must run with ``use_distributed_sampler=False``: the batch sampler already
splits batches across ranks (rank and world size are read from ``self.trainer``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time

import datasets
import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from data.arrow_pairs import StreamedColumn
from data.batching import TokenBucketBatchSampler, collate_columns, padding_fraction
from data.corpora import RunCorpora
from data.corpus import MULTI30K_HUB_ID, SPLITS, CorpusLocation
from data.filters import PairFilters
from data.length_buckets import LengthBuckets, bucketed_padding, distinct_shapes
from data.mixing import CorpusMix, corpus_weights
from data.prepared import BAD_LINES, drop_long_pairs, prepare_corpus
from data.sampling import SampledPairs
from data.subword_models import (
    TokenizerSettings,
    check_tags_are_pieces,
    given_tokenizers,
    train_or_load_tokenizers,
)
from data.tokenized import tokenize_split
from data.tokenized_pairs import TokenizedPairs
from data.tokenizer import SubwordTokenizer, default_cache_dir, save_run_tokenizers

logger = logging.getLogger(__name__)


def _column(dataset: datasets.Dataset, name: str) -> np.ndarray:
    """An int column of a memory-mapped split as a numpy array, without Python lists.

    Returns:
        ``[len(dataset)]`` int64.
    """
    return np.asarray(dataset.select_columns([name]).with_format("numpy")[:][name], dtype=np.int64)


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
        src_lang: source language, e.g. ``"de"``.
        tgt_lang: target language, e.g. ``"en"``.
        data_dir: local ``{split}.{lang}[.gz]`` directory; ``None``: ``$MULTI30K_DIR``, else
            ``<project root>/../shared/data/multi30k`` where it exists, else ``fallback_hub_id``.
        hub_id: hub dataset id; takes precedence over ``data_dir`` when set.
        hub_config: hub dataset configuration, e.g. ``"de-en"``.
        train_split: source split name read as ``train`` (local files, or ``hub_id``).
        valid_split: source split name read as ``validation``.
        test_split: source split name read as ``test``.
        fallback_hub_id: hub dataset read, with the hub's split names train / validation / test,
            where no local directory is given or found; ``None``: no fallback (a missing
            directory is an error).
        joint_vocab: one SentencePiece model for both languages, else one per language.
        vocab_size: vocabulary size of each SentencePiece model, special ids included.
        spm_model_type: ``"unigram"`` or ``"bpe"``.
        character_coverage: SentencePiece character coverage (1.0 for Latin scripts).
        spm_input_sentence_size: at most this many sentences sampled to train SentencePiece.
        spm_threads: threads for SentencePiece training and encoding.
        spm_model: an existing SentencePiece ``.model`` file used for both sides instead of
            training one (with ``joint_vocab``); ``vocab_size`` and the other training settings
            are then unused. ``None``: train one, or reuse the cached one.
        src_spm_model, tgt_spm_model: the same, one model per side (both, without ``joint_vocab``).
        max_len: training pairs whose source (with EOS) or target (with BOS/EOS) is longer than
            this many subwords are dropped (counts logged); validation and test are never cut.
        spm_sampling_alpha: subword regularisation of the training split (:mod:`data.sampling`):
            each batch's segmentation drawn afresh by SentencePiece, ``alpha`` its smoothing
            exponent (unigram) or merge dropout (BPE); ``None``: the one best segmentation.
            Validation, test and translation always use the best.
        spm_sampling_nbest: with ``spm_sampling_alpha`` and a unigram model: sample among all
            segmentations (-1) or the ``nbest`` best.
        max_tokens: padded tokens per batch, ``batch_size * max(src_len, tgt_len)``.
        eval_max_tokens: the same for validation and test; ``None`` means ``max_tokens``.
        length_buckets: pad each training batch's lengths up to these few (and its rows up to
            ``max_tokens`` at that width, with filler pairs), so that a compiled step meets a few
            shapes and can run as CUDA graphs (:mod:`data.length_buckets`); the padding it costs is
            logged at set-up. ``None``: batches as long as their longest pair.
        seed: seed of the per-epoch batch order.
        num_workers: DataLoader worker processes (0: load in the main process).
        pin_memory: pin batches in page-locked memory, so that Lightning's host-to-GPU copies
            (``non_blocking=True`` on CUDA) run asynchronously; ``None``: pin when the Trainer
            runs on a CUDA device.
        cache_dir: root for cached SentencePiece models and tokenized splits; ``None``:
            ``$NMT_CACHE_DIR``, else ``~/.cache/nmt-transformer``.
        run_dir: the run's directory; the SentencePiece model(s) are copied to
            ``<run_dir>/tokenizer/``. ``None``: kept in the cache only.
        bad_lines: a training line of a local file with invalid UTF-8 or a NUL byte is an
            ``"error"`` naming the file and line, or its pair is dropped (``"skip"``), counted and
            logged by file and line (:func:`data.prepared.prepare_corpus`).
        filters: ``data.filters``, which training pairs to drop where each training corpus is read
            (:class:`data.filters.PairFilters` fields; None: none), counted per corpus
            (:attr:`filtered`).
        corpora: the training corpora, mixed by weight, each a mapping of
            :class:`data.corpora.TrainingCorpus` fields; ``None`` or empty: the training split of
            the corpus above. The test split is always the corpus above's.
        target_lang_tags: put the target language's tag (``<2fr>``) before every source
            sentence, of every split, and reserve it in SentencePiece: one model for several
            target languages.
        valid_sets: the validation sets, all validated at every validation, each a mapping of
            :class:`data.corpora.ValidationSet` fields, served in this order as the validation
            dataloaders (split keys ``"validation/<name>"``); ``None`` or empty: the corpus
            above's ``valid_split`` alone (split key ``"validation"``).
    """

    def __init__(
        self,
        src_lang: str = "de",
        tgt_lang: str = "en",
        data_dir: str | None = None,
        hub_id: str | None = None,
        hub_config: str | None = None,
        train_split: str = "train",
        valid_split: str = "val",
        test_split: str = "test_2016_flickr",
        fallback_hub_id: str | None = MULTI30K_HUB_ID,
        joint_vocab: bool = True,
        vocab_size: int = 8000,
        spm_model_type: str = "unigram",
        character_coverage: float = 1.0,
        spm_input_sentence_size: int = 2_000_000,
        spm_threads: int = 1,
        spm_model: str | None = None,
        src_spm_model: str | None = None,
        tgt_spm_model: str | None = None,
        max_len: int = 250,
        spm_sampling_alpha: float | None = None,
        spm_sampling_nbest: int = -1,
        max_tokens: int = 4096,
        eval_max_tokens: int | None = None,
        length_buckets: list[int] | None = None,
        seed: int = 1234,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        cache_dir: str | None = None,
        run_dir: str | None = None,
        bad_lines: str = "error",
        filters: dict | None = None,
        corpora: list[dict] | None = None,
        corpora_temperature: float | None = None,
        target_lang_tags: bool = False,
        valid_sets: list[dict] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tokenizer_settings = TokenizerSettings(
            joint_vocab,
            vocab_size,
            spm_model_type,
            character_coverage,
            spm_input_sentence_size,
            spm_threads,
            spm_model,
            src_spm_model,
            tgt_spm_model,
        )
        self.max_len = max_len
        self.spm_sampling_alpha, self.spm_sampling_nbest = spm_sampling_alpha, spm_sampling_nbest
        self.max_tokens = max_tokens
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.length_buckets = LengthBuckets.parse(length_buckets)
        self.seed = seed
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
        self.run_dir = run_dir
        if bad_lines not in BAD_LINES:
            raise ValueError(f"data.bad_lines must be one of {', '.join(BAD_LINES)}, not {bad_lines!r}")
        self.bad_lines = bad_lines
        self.filters = PairFilters.from_dict(filters)  # refused at once, naming the key
        self.filtered: dict[str, dict[str, int]] = {}  # per training corpus: pairs dropped by reason
        location = CorpusLocation(
            src_lang,
            tgt_lang,
            data_dir,
            hub_id,
            hub_config,
            train_split,
            valid_split,
            test_split,
            fallback_hub_id,
        )
        self.corpora = RunCorpora.parse(location, corpora, corpora_temperature, valid_sets, target_lang_tags)
        self.corpus_summary: list[dict] = []  # per training corpus: pairs, weight, per epoch, tag
        self._mix: CorpusMix | None = None

        self.corpus: datasets.DatasetDict | None = None  # raw text: id, src, tgt
        self.tokenized: datasets.DatasetDict | None = None  # id, src_ids, tgt_ids, src/tgt_len
        self.src_tokenizer: SubwordTokenizer | None = None
        self.tgt_tokenizer: SubwordTokenizer | None = None
        self.lengths: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # split: (src_len, tgt_len)
        self.stage_seconds: dict[str, float] = {}  # read, filter, sentencepiece, tokenize (this load)
        self._served: dict[str, TokenizedPairs] = {}  # what the loaders fetch batches from
        self._train_sampler: TokenBucketBatchSampler | None = None
        self._pending_train_state: dict | None = None
        self._padding_logged = False
        # The training order's epoch offset: a fine-tuned run continuing its checkpoint's data order
        # sets it (training/finetune_reset.py); a resumed run gets it back with the sampler's state.
        self.epoch_offset = 0

    # ----------------------------------------------------------------- loading

    def _load(self) -> None:
        if self.tokenized is not None:
            return
        # Given models are read first: a wrong path stops the run before the corpus is read.
        given = given_tokenizers(self.tokenizer_settings)
        seconds = {}
        corpus, digests, sizes = self._read_corpora(seconds)
        tick = time.perf_counter()
        if given is not None:
            src_tok, tgt_tok = given
            said = self.tokenizer_settings.given_keys()
            logger.info(
                "SentencePiece: using data.%s (%s pieces), not training one (data.vocab_size and the "
                "other training settings are unused)",
                " and data.".join(said),
                " and ".join(str(t.vocab_size) for t in dict.fromkeys((src_tok, tgt_tok))),
            )
            check_tags_are_pieces(src_tok, self.reserved, " and data.".join(said))
            if self.run_dir is not None:
                save_run_tokenizers(src_tok, tgt_tok, self.run_dir)
        else:
            src_tok, tgt_tok = train_or_load_tokenizers(
                StreamedColumn(corpus["train"], "src"),  # only a sample is kept, the rest streamed past
                StreamedColumn(corpus["train"], "tgt"),
                self.tokenizer_settings,
                cache_dir=self.cache_dir,
                run_dir=self.run_dir,
                content_key=digests["train"],
                reserved=self.reserved,
            )
        seconds["sentencepiece"] = time.perf_counter() - tick
        tick = time.perf_counter()
        tokenized, lengths = {}, {}
        for split in ["train", *self.validation_splits, "test"]:
            ds = tokenize_split(corpus[split], src_tok, tgt_tok, self.cache_dir, content_key=digests[split])
            tokenized[split] = ds
            lengths[split] = (_column(ds, "src_len"), _column(ds, "tgt_len"))
        seconds["tokenize"] = time.perf_counter() - tick
        src_len, tgt_len = lengths["train"]
        keep = np.flatnonzero(np.maximum(src_len, tgt_len) <= self.max_len)
        evaluated = [*self.validation_splits, "test"]
        self._served = {split: TokenizedPairs(tokenized[split]) for split in evaluated}
        if self.spm_sampling_alpha is None:
            self._served["train"] = TokenizedPairs(tokenized["train"], keep)
        else:  # the raw text, encoded afresh for each batch; the tokenized lengths plan the batches
            self._served["train"] = SampledPairs(
                corpus["train"],
                keep,
                src_tok,
                tgt_tok,
                alpha=self.spm_sampling_alpha,
                nbest_size=self.spm_sampling_nbest,
                seed=self.seed,
                max_len=self.max_len,
            )
        tokenized["train"] = drop_long_pairs(tokenized["train"], src_len, tgt_len, self.max_len, "train")
        lengths["train"] = (src_len[keep], tgt_len[keep])
        self._mix_corpora(np.repeat(np.arange(len(sizes)), sizes)[keep], *lengths["train"])
        for split in evaluated:
            n_long = int((np.maximum(*lengths[split]) > self.max_len).sum())
            if n_long:
                logger.warning(
                    "%s: %d of %d pairs are longer than max_len=%d tokens (kept)",
                    split,
                    n_long,
                    len(tokenized[split]),
                    self.max_len,
                )
        self.corpus = corpus
        self.src_tokenizer, self.tgt_tokenizer = src_tok, tgt_tok
        self.tokenized = datasets.DatasetDict(tokenized)
        self.lengths = lengths
        self.stage_seconds = seconds

    def _read_corpora(
        self, seconds: dict[str, float]
    ) -> tuple[datasets.DatasetDict, dict[str, str], list[int]]:
        """The splits (train: every training corpus's pairs, in ``self.corpora`` order; each of
        :attr:`validation_splits`; test), their content digests, and each training corpus's number
        of pairs."""
        corpora, tags = self.corpora, self.corpora.target_lang_tags
        read = functools.partial(
            prepare_corpus, cache_dir=self.cache_dir, bad_lines=self.bad_lines, filters=self.filters
        )
        # The main corpus gives what no list replaces: its training split unless data.corpora lists
        # the training corpora, its validation split unless data.valid_sets lists the validation
        # sets (it need not exist then), and always the test split.
        main_splits = [
            split
            for split, replaced in zip(SPLITS, (self.listed, bool(corpora.valid_sets), False), strict=True)
            if not replaced
        ]
        main = read(corpora.main, which_splits=main_splits, src_prefix=corpora.main_prefix)
        parts = [main]
        if self.listed:
            parts = [
                read(c.location, which_splits=("train",), src_prefix=c.source_prefix(tags))
                for c in corpora.training
            ]
        valid = [
            read(v.location, which_splits=("validation",), src_prefix=v.source_prefix(tags))
            for v in corpora.valid_sets
        ]
        self.filtered = {
            c.name: p.filtered for c, p in zip(corpora.training, parts, strict=True) if p.filtered
        }
        for part in {id(p): p for p in [main, *parts, *valid]}.values():
            for stage, value in part.seconds.items():
                seconds[stage] = seconds.get(stage, 0.0) + value
        splits, digests = dict(main.splits), dict(main.digests)
        if self.listed:
            splits["train"] = datasets.concatenate_datasets([p.splits["train"] for p in parts])
            joined = "|".join(
                f"{c.name}:{p.digests['train']}" for c, p in zip(corpora.training, parts, strict=True)
            )
            digests["train"] = hashlib.sha256(joined.encode()).hexdigest()
        for v, prepared in zip(corpora.valid_sets, valid, strict=True):
            splits[v.split_key] = prepared.splits["validation"]
            digests[v.split_key] = prepared.digests["validation"]
        return datasets.DatasetDict(splits), digests, [len(p.splits["train"]) for p in parts]

    def _mix_corpora(self, corpus_of: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray) -> None:
        """Each corpus's weight made a :class:`CorpusMix` (none where all are 1); the summary logged.

        Args:
            corpus_of: ``[N]`` training corpus of each kept training pair.
            src_len: ``[N]`` source widths.
            tgt_len: ``[N]`` target widths.
        """
        training = self.corpora.training
        pairs = np.bincount(corpus_of, minlength=len(training))
        weights = [c.weight for c in training]
        if self.corpora.temperature is not None:  # shares proportional to pairs ** (1 / T)
            weights = corpus_weights(pairs.tolist(), self.corpora.temperature)
        keys = TokenBucketBatchSampler.length_keys(src_len, tgt_len)
        self._mix = None if all(w == 1 for w in weights) else CorpusMix(corpus_of, weights, keys)
        per_epoch = pairs if self._mix is None else self._mix.per_corpus
        self.corpus_summary = [
            {"name": c.name, "pairs": int(n), "weight": round(w, 6), "per_epoch": int(e), "tag": c.tag}
            for c, n, w, e in zip(training, pairs, weights, per_epoch, strict=True)
        ]
        if self.listed:
            logger.info(
                "training corpora, pairs per epoch: %s",
                "; ".join(
                    f"{s['name']} {s['per_epoch']:,} ({s['pairs']:,} pairs x {s['weight']:g}"
                    + (f", tagged {s['tag']}" if s["tag"] else "")
                    + ")"
                    for s in self.corpus_summary
                ),
            )

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

    def _log_train_padding(self) -> None:
        """Logs the first epoch's padding and batch shapes; with ``length_buckets``, what they cost."""
        lengths = self.lengths["train"]
        plain = self.batch_sampler("train", buckets=False).global_batches()
        logger.info(
            "train padding fraction at max_tokens=%d: %.4f (%d batch shapes an epoch)",
            self.max_tokens,
            padding_fraction(plain, *lengths),
            distinct_shapes(plain, *lengths),
        )
        if self.length_buckets is None:
            return
        batches = self.batch_sampler("train").global_batches()
        padding, fillers, shapes = bucketed_padding(batches, *lengths, self.length_buckets, self.max_tokens)
        logger.info(
            "train padding fraction with data.length_buckets=%s: %.4f, filler rows %.4f "
            "(%d batch shapes, %d batches)",
            list(self.length_buckets.lengths),
            padding,
            fillers,
            shapes,
            len(batches),
        )

    # --------------------------------------------------------------- accessors

    @property
    def listed(self) -> bool:
        """Whether ``data.corpora`` lists the training corpora."""
        return self.corpora.listed

    @property
    def reserved(self) -> list[str]:
        """Every tag the sources can carry, kept one SentencePiece piece."""
        return self.corpora.reserved

    @property
    def validation_splits(self) -> list[str]:
        """The split keys validated, in the order of :meth:`val_dataloader`'s loaders:
        ``["validation/<name>", ...]`` for ``valid_sets``, else ``["validation"]``."""
        return self.corpora.validation_splits

    def split_target_lang(self, split: str) -> str:
        """The target language of a split's references (a validation set's own, else ``tgt_lang``):
        what chooses BLEU's tokenizer (``common.metrics``)."""
        return self.corpora.split_target_lang(split)

    @property
    def valid_set_names(self) -> list[str]:
        """The names of ``valid_sets`` in loader order; [] where the main validation split alone is."""
        return [v.name for v in self.corpora.valid_sets]

    @property
    def target_tags(self) -> dict[str, str]:
        """With ``target_lang_tags``: each target language's source tag (``{"fr": "<2fr>"}``), else {}."""
        return self.corpora.target_tags

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

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def batch_sampler(
        self, split: str, num_replicas: int = 1, rank: int = 0, buckets: bool = True
    ) -> TokenBucketBatchSampler:
        """A fresh sampler over ``split``: shuffled for ``train``, fixed order otherwise; training's
        cut by ``length_buckets`` unless ``buckets`` is False (validation and test never are)."""
        assert self.tokenized is not None, "call setup() first"
        src_len, tgt_len = self.lengths[split]
        train = split == "train"
        return TokenBucketBatchSampler(
            src_len,
            tgt_len,
            max_tokens=self.max_tokens if train else self.eval_max_tokens,
            shuffle=train,
            seed=self.seed,
            num_replicas=num_replicas,
            rank=rank,
            mix=self._mix if train else None,
            length_buckets=self.length_buckets if train and buckets else None,
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
        collate = collate_columns
        if split == "train" and self.length_buckets is not None:  # a partial: picklable for workers
            collate = functools.partial(
                collate_columns, length_buckets=self.length_buckets, max_tokens=self.max_tokens
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
            "generator": torch.Generator().manual_seed(self.seed),
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

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Validation batches in a fixed order (sorted by length), split across ranks: one loader
        for the main validation split, or a list of one per validation set, in
        :attr:`validation_splits` order (Lightning's ``dataloader_idx``)."""
        loaders = [self._loader(s, self.batch_sampler(s, *self._world())) for s in self.validation_splits]
        return loaders if self.corpora.valid_sets else loaders[0]

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
