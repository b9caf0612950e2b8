"""Text in, text out: a checkpoint's model with its tokenizers.

The command line (``translate.py``, through ``pipeline.py`` and ``scoring.py``) calls this one.
:class:`Translator` encodes and crops sentences, has them searched by ``decoding.Searcher``
(beam, greedy or sampling, with one model or an ensemble; batched longest first under the
device's token budget, the same search that validation and the test stage run) and decodes the
results, in input order; empty lines never reach the model. :meth:`Translator.score` gives given
targets' log-probabilities instead. The model is the plain one: ``translate.py`` applies the
device's fast paths to it (``fastpaths.optimize``) and hands their kernels over
(:meth:`Translator.use`). What it returns is in ``results.py``; the device is checked by
``device.py`` and an ensemble's checkpoints by ``ensemble_check.py``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from data.batching import longest_first_batches
from data.lines import one_line
from decoding import DecodingConfig, Searcher, SearchSettings
from decoding.budget import CPU_TOKENS
from decoding.ensemble import Ensemble
from decoding.scoring import target_log_probs
from transformer import Transformer
from translation.attention_reading import AttentionReading
from translation.checkpoint import load_checkpoint
from translation.device import resolve_device
from translation.ensemble_check import check_ensemble_member
from translation.results import Score, Translation
from translation.terminology import report_unmet
from translation.workers import WorkerPool

logger = logging.getLogger(__name__)


# translate.py's default batch budget on the CPU (``decoding.budget``); a GPU's is larger.
DEFAULT_MAX_TOKENS = CPU_TOKENS
# How to search: the one decoding config (greedy, beam or sampling), under its old name.
SearchOptions = DecodingConfig


class Tokenizer(Protocol):
    """What the translator needs from a subword model (``data.tokenizer.SubwordTokenizer`` has it)."""

    def encode(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[list[int]]) -> list[str]: ...

    def id_to_piece(self, ids: list[int]) -> list[str]: ...


def _source_prefix(target_tags: dict[str, str], target_lang: str | None, tgt_lang: str) -> str:
    """The tag (and a space) that asks a model of several target languages for ``target_lang``."""
    if not target_tags:
        if target_lang and tgt_lang and target_lang != tgt_lang:
            raise ValueError(f"this model translates into {tgt_lang} only, not {target_lang}")
        return ""
    known = ", ".join(sorted(target_tags))
    if not target_lang:
        raise ValueError(f"this model translates into {known}: say which (--target-lang, target_lang)")
    if target_lang not in target_tags:
        raise ValueError(f"this model was not trained to translate into {target_lang}, only into {known}")
    return target_tags[target_lang] + " "


class Translator(AttentionReading):
    """A model in eval mode with its tokenizers: sentences in, ranked translations out.

    Args:
        model: the Transformer, or an :class:`~transformer.ensemble.Ensemble` of several; put in
            eval mode and moved to ``device``.
        src_tokenizer: source subword model.
        tgt_tokenizer: target subword model (the same object for a joint vocabulary).
        bos_id, eos_id: target begin/end-of-sentence ids.
        device: where the model runs.
        src_lang, tgt_lang: languages, for messages.
        target_tags: a model of several target languages: per language, the tag put before its
            sources (``{"de": "<2de>", "fr": "<2fr>"}``); empty for a model of one.
        target_lang: the language to translate into; required with ``target_tags`` (its tag is
            put before every non-empty source), else ``tgt_lang`` or None.
        search: the search settings :meth:`translate` and ``translate.py`` use where none are
            given: a checkpoint's are those its test stage ran (``translation/checkpoint.py``);
            None: the project's (:class:`decoding.SearchSettings`).

    Raises:
        ValueError: no ``target_lang`` for a model of several, or one it was not trained for;
            the message names those it was.
    """

    def __init__(
        self,
        model: Transformer | Ensemble,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        bos_id: int,
        eos_id: int,
        device: torch.device,
        src_lang: str = "",
        tgt_lang: str = "",
        target_tags: dict[str, str] | None = None,
        target_lang: str | None = None,
        search: SearchSettings | None = None,
    ) -> None:
        self.search_settings = search or SearchSettings()
        self.src_prefix = _source_prefix(target_tags or {}, target_lang, tgt_lang)
        self.model = model.to(device).eval()
        self.searcher = Searcher(self.model, bos_id, eos_id)
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, model.cfg.pad_id
        self.device = device
        self.src_lang = src_lang
        self.tgt_lang = target_lang or tgt_lang

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        target_lang: str | None = None,
    ) -> Translator:
        """The translator of a checkpoint written by training (``translation/checkpoint.py``).

        Args:
            path: the ``.ckpt`` file (``best``, ``last`` or ``averaged``).
            device: where the model runs, e.g. ``"cpu"``, ``"cuda"``, ``"cuda:1"``.
            dtype: the weights' type: ``torch.bfloat16`` halves their memory and is faster on
                CPUs with AVX512-BF16 and on recent GPUs (BENCHMARKS.md, "Decoding speed"); scores
                and the search's bookkeeping stay in fp32.
            target_lang: the language to translate into, for a model of several (trained with
                ``data.target_lang_tags``); it must be one of them.

        Raises:
            CheckpointError: the file is missing, truncated, foreign, or its parts do not fit.
            ValueError: ``device`` is not a device name or not available here; ``target_lang``
                missing for a model of several languages, or not one of them (naming them).
        """
        return cls.from_checkpoints([path], device=device, dtype=dtype, target_lang=target_lang)

    @classmethod
    def from_checkpoints(
        cls,
        paths: Sequence[str | os.PathLike],
        weights: Sequence[float] | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        target_lang: str | None = None,
    ) -> Translator:
        """The translator of an ensemble of checkpoints: every search step (and :meth:`score`)
        uses the weighted mean of their log-probabilities (``transformer/ensemble.py``).

        Args:
            paths: one or more ``.ckpt`` files with one SentencePiece model (each side), special
                ids and target languages; their models may differ in size and attention.
            weights: one per checkpoint, normalised to sum to 1; default equal.
            device, dtype, target_lang: as in :meth:`from_checkpoint`. The search settings are
                the first checkpoint's.

        Raises:
            CheckpointError: a file is not a usable checkpoint, or two checkpoints do not fit
                together (the message names both and what differs).
            ValueError: as in :meth:`from_checkpoint`; weights that do not fit the checkpoints.
        """
        if not paths:
            raise ValueError("an ensemble needs at least one checkpoint")
        if weights is not None and len(weights) != len(paths):
            raise ValueError(f"{len(weights)} weights for {len(paths)} checkpoints")
        device = resolve_device(device)  # before reading: a wrong device is reported at once
        loaded = [load_checkpoint(path, dtype) for path in paths]
        for path, other in zip(paths[1:], loaded[1:], strict=True):
            check_ensemble_member(Path(paths[0]), loaded[0], Path(path), other)
        first = loaded[0]
        return cls(
            Ensemble([c.model for c in loaded], weights) if len(loaded) > 1 else first.model,
            first.src_tokenizer,
            first.tgt_tokenizer,
            bos_id=first.bos_id,
            eos_id=first.eos_id,
            device=device,
            src_lang=first.src_lang,
            tgt_lang=first.tgt_lang,
            target_tags=first.target_tags,
            target_lang=target_lang,
            search=first.search,
        )

    def default_options(self) -> SearchOptions:
        """Beam search with :attr:`search_settings` (an ensemble's: its first checkpoint's)."""
        return SearchOptions(**asdict(self.search_settings))

    def use(self, paths: Any) -> None:
        """Searches with the kernels ``fastpaths.optimize`` chose for the device (a ``FastPaths``);
        that call made the model's module swaps."""
        self.searcher.kernels = paths.search

    @property
    def first_model(self) -> Transformer:
        """The model, or an ensemble's first (its attention is the one that is plotted)."""
        return self.model.members[0] if isinstance(self.model, Ensemble) else self.model

    @property
    def max_source_tokens(self) -> int:
        """Most subwords a source may have: EOS takes the last of the model's positions."""
        return self.model.cfg.max_positions - 1

    def encode_sources(
        self, texts: Sequence[str], name: str = "<input>", first_line: int = 1
    ) -> list[list[int]]:
        """Source subword ids (no EOS), one list per text; too long ones cropped with a warning.

        Line-break characters inside a text are read as spaces. A text with no subwords (empty or
        whitespace) gives an empty list.

        Args:
            texts: ``n`` sentences; warnings name them as line ``first_line + i`` of ``name``.
            name: the input's name, for warnings.
            first_line: the line number of ``texts[0]`` (a later part of a stream).
        """
        # The target language's tag goes before each sentence; an empty one stays empty (no output).
        ids = self.src_tokenizer.encode([self.src_prefix + one_line(t) if t.strip() else t for t in texts])
        return [self._cropped(seq, name, number) for number, seq in enumerate(ids, start=first_line)]

    @torch.no_grad()
    def translate_ids(
        self,
        sources: Sequence[list[int]],
        options: SearchOptions,
        max_tokens: int | None = None,
        progress: Callable[[int], None] | None = None,
        pool: WorkerPool | None = None,
        prefixes: Sequence[list[int]] | None = None,
        constraints: Sequence[list[list[int]]] | None = None,
    ) -> list[list[Translation]]:
        """Translate subword sources in batches of at most ``max_tokens`` padded hypothesis tokens.

        Args:
            sources: ``n`` id lists without EOS, each at most :attr:`max_source_tokens` long.
            options: search settings.
            max_tokens: budget per batch of sentences * hypotheses per sentence (the beam size;
                1 for greedy search) * longest source (EOS included); None: the device's
                (``decoding.budget``: 3,072 on the CPU).
            progress: called with the number of sentences finished after each batch.
            pool: worker processes that search the batches (each with its own copy of this
                model); None searches here.
            prefixes: ``n`` target id lists (:meth:`encode_prefixes`): each output starts with
                its sentence's ([] forces nothing); None: none.
            constraints: ``n`` lists of target id sequences (:meth:`encode_constraints`) that
                every output of its sentence contains ([]: none; beam search only), in
                ``options.constraints_order``; None: none.

        Returns:
            ``n`` lists of up to ``options.nbest`` translations, best first, in input order; an
            empty list for an empty source (the model never sees it) and for a source whose
            constraints were not all met within its length limit.
        """
        found = self.searcher.search_ids(sources, options, max_tokens, prefixes, progress, pool, constraints)
        results: list[list[Translation]] = []
        for hyps in found:
            texts = self.tgt_tokenizer.decode([h.tokens for h in hyps]) if hyps else []
            results.append(
                [
                    Translation(one_line(text).strip(), h.tokens, h.score, h.log_prob, h.sample)
                    for text, h in zip(texts, hyps, strict=True)
                ]
            )
        return results

    def translate(
        self,
        texts: Sequence[str],
        options: SearchOptions | None = None,
        max_tokens: int | None = None,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        **search: Any,
    ) -> list[str]:
        """The best translation of each text: one per text, in order, as ``translate.py`` gives.

        An empty or whitespace-only text gives ""; line breaks inside a text are read as spaces
        and too long texts are cropped with a warning.

        Args:
            texts: ``n`` sentences.
            options: search settings (default: :meth:`default_options`, the checkpoint's).
            max_tokens: budget per batch, as in :meth:`translate_ids`.
            prefixes: ``n`` texts each translation must start with ("" forces nothing).
            constraints: ``n`` lists of texts each translation must contain (beam search only;
                ``constraints_order="ordered"``: in that order); a text whose constraints were not
                all met within its length limit gives "", with an error logged
                (``translation/terminology.py``).
            **search: :class:`SearchOptions` fields by name, over ``options``, e.g.
                ``beam_size=4``, ``alpha=1.0``, ``greedy=True``, ``max_len_b=50``.

        Returns:
            ``n`` strings.

        Raises:
            TypeError: a keyword that is not a :class:`SearchOptions` field.
            ValueError: settings :class:`SearchOptions` refuses (e.g. ``beam_size=0``).
        """
        options = replace(options or self.default_options(), **search)
        forced = None if prefixes is None else self.encode_prefixes(prefixes)
        sources = self.encode_sources(texts)
        wanted = None if constraints is None else self.encode_constraints(constraints)
        found = self.translate_ids(sources, options, max_tokens, prefixes=forced, constraints=wanted)
        if wanted is not None:
            report_unmet(self, sources, wanted, [list(c) for c in constraints or []], found, options)
        return [hyps[0].text if hyps else "" for hyps in found]

    def encode_prefixes(
        self, texts: Sequence[str], name: str = "<prefix>", first_line: int = 1
    ) -> list[list[int]]:
        """Target subword ids of forced output prefixes, one list per text ([] for an empty one).

        Too long ones are cropped to the model's positions with a warning naming line
        ``first_line + i`` of ``name``.
        """
        ids = self.tgt_tokenizer.encode([one_line(t) if t.strip() else "" for t in texts])
        return [self._cropped(seq, name, number) for number, seq in enumerate(ids, start=first_line)]

    def encode_constraints(self, texts: Sequence[Sequence[str]]) -> list[list[list[int]]]:
        """Target subword ids of each line's lexical constraints; those with no subwords dropped.

        Each constraint is encoded as a line of its own, so it begins with the word-initial
        ``▁``: the pieces it has inside a sentence (``translation/terminology.py``).
        """
        encoded = [self.tgt_tokenizer.encode([one_line(t) for t in line]) if line else [] for line in texts]
        return [[ids for ids in line if ids] for line in encoded]

    def _cropped(self, seq: list[int], name: str, number: int) -> list[int]:
        """``seq`` cut to :attr:`max_source_tokens` ids, with a warning naming line ``number`` of ``name``."""
        limit = self.max_source_tokens
        if len(seq) > limit:
            logger.warning(
                "%s line %d: %d subword tokens, cropped to the first %d (the model's max_positions "
                "is %d, one of them for </s>)",
                name,
                number,
                len(seq),
                limit,
                self.model.cfg.max_positions,
            )
            del seq[limit:]
        return seq

    @torch.no_grad()
    def score_ids(
        self,
        sources: Sequence[list[int]],
        targets: Sequence[list[int]],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        progress: Callable[[int], None] | None = None,
    ) -> list[Score]:
        """Forced decoding: each target's log-probability given its source (``transformer/scoring.py``).

        Args:
            sources: ``n`` source id lists without EOS (:meth:`encode_sources`).
            targets: ``n`` target id lists without BOS and EOS (:meth:`encode_targets`).
            max_tokens: budget per batch of sentences * (longest source + longest target + 2).
            progress: called with the number of pairs scored after each batch.

        Returns:
            ``n`` scores in input order; every pair is scored, an empty source or target too
            (EOS alone).
        """
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources for {len(targets)} targets")
        results: list[Score | None] = [None] * len(sources)
        widths = [len(s) + len(t) + 2 for s, t in zip(sources, targets, strict=True)]
        for batch in longest_first_batches(widths, max_tokens):
            src = self.searcher.batch([sources[i] for i in batch])
            longest = max(len(targets[i]) for i in batch) + 1
            tgt_in = torch.full((len(batch), longest), self.pad_id, device=self.device)
            tgt_out = torch.full((len(batch), longest), self.pad_id, device=self.device)
            for row, i in enumerate(batch):
                target = targets[i]
                tgt_in[row, : len(target) + 1] = torch.tensor([self.bos_id, *target])
                tgt_out[row, : len(target) + 1] = torch.tensor([*target, self.eos_id])
            with torch.inference_mode():
                sums = target_log_probs(self.model, src, tgt_in, tgt_out).double().sum(dim=1)
            for row, i in enumerate(batch):
                results[i] = Score(float(sums[row]), len(targets[i]) + 1)
            if progress is not None:
                progress(len(batch))
        return [r for r in results if r is not None]

    def encode_targets(
        self, texts: Sequence[str], name: str = "<targets>", first_line: int = 1
    ) -> list[list[int]]:
        """Target subword ids (no BOS or EOS) of given translations, cropped as prefixes are."""
        ids = self.tgt_tokenizer.encode([one_line(t) for t in texts])
        return [self._cropped(seq, name, number) for number, seq in enumerate(ids, start=first_line)]

    def score(
        self, sources: Sequence[str], targets: Sequence[str], max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> list[Score]:
        """Each target's log-probability as the translation of its source, one per pair, in order.

        Sources are encoded as :meth:`translate` encodes them (a target language's tag
        included); line breaks inside a text are read as spaces.
        """
        return self.score_ids(self.encode_sources(sources), self.encode_targets(targets), max_tokens)
