"""Validation and the test stage: the module's sources searched as ``translate.py`` searches them.

Validation and the test stage decode through ``decoding.Searcher``, as ``translate.py`` does: the
sources of the stage are collected batch by batch (with their loss) and searched at its end,
batched longest first under the device's budget, then gathered from every rank by example id and
scored with sacreBLEU (:mod:`common.metrics`). :class:`EvalDecoding` is the search of each stage;
:class:`EvaluationSteps` the Lightning hooks that run it, mixed into
:class:`training.module.TranslationModule`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor

from common.metrics import CorpusScores, corpus_scores
from data.corpora import valid_split_key
from decoding import DecodingConfig, Searcher, SearchSettings
from training.memory import peak_resident_mib, release_free_memory, resident_mib
from training.selection import metric_prefix

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalDecoding(SearchSettings):
    """The test stage's decoding (:class:`~decoding.config.SearchSettings`) and validation's beam.

    Attributes:
        valid_beam_size: beam size of the validation BLEU each epoch, with the test stage's
            ``alpha`` and length limit; 1 is greedy search, the fastest.
    """

    valid_beam_size: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.valid_beam_size < 1:
            raise ValueError(f"valid_beam_size must be at least 1, not {self.valid_beam_size}")

    def stage(self, split: str) -> DecodingConfig:
        """The search of a stage: validation's (``valid_beam_size``; 1 greedy) or the test's."""
        beam = self.beam_size if split == "test" else self.valid_beam_size
        settings = {f.name: getattr(self, f.name) for f in fields(SearchSettings)}
        return DecodingConfig(**{**settings, "beam_size": beam}, greedy=beam == 1)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EvalDecoding:
        """From the ``decoding`` hyperparameters; missing settings take their defaults.

        Raises:
            ValueError: a setting that is not a field, or a value the fields refuse.
        """
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"decoding: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return cls(**values)


def gather_objects(items: list[Any]) -> list[Any]:
    """Concatenates ``items`` from every rank (all ranks get the whole list); a no-op alone."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return items
    gathered: list[list[Any]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


class EvaluationSteps(L.LightningModule):
    """The validation and test hooks of :class:`training.module.TranslationModule`.

    Reads the module's ``model``, ``bos_id``/``eos_id``, ``search_kernels``, ``decoding_budget``,
    ``decoding`` (:class:`EvalDecoding`), ``bleu_tokenize``, ``output_dir`` and ``loss()``.
    """

    @property
    def searcher(self) -> Searcher:
        """The model as ``translate.py`` searches it (``decoding.Searcher``), with this run's kernels."""
        return Searcher(self.model, self.bos_id, self.eos_id, self.search_kernels)

    def _eval_step(self, batch: dict[str, Tensor], split: str) -> None:
        """The batch's loss, and its sources kept for the stage's search: one read by the host."""
        nll, n_tokens = self.loss(batch, label_smoothing=0.0)
        src = batch["src"]
        head = torch.stack([batch["ids"], batch["src_lengths"]], dim=1).to(src.dtype)
        rows = [(row[0], row[2 : 2 + row[1]]) for row in torch.cat([head, src], dim=1).tolist()]
        self._eval_records.setdefault(split, []).append((rows, nll, n_tokens))

    def _search(self, split: str) -> list[tuple[int, float, int, list[int]]]:
        """This rank's sentences of ``split``: (example id, summed NLL, target tokens, output ids),
        their outputs searched at once, as ``translate.py`` searches (``decoding.Searcher``)."""
        batches = self._eval_records.pop(split, [])
        if not batches:
            return []
        numbers = torch.cat([torch.stack([b[1].double(), b[2].double()], dim=1) for b in batches])
        nll, n_tokens = zip(*numbers.tolist(), strict=True)  # one read for the stage
        # (example id, source ids with EOS) of every real pair (filler rows have id -1).
        kept = [(r, i) for i, r in enumerate(row for found, _, _ in batches for row in found) if r[0] >= 0]
        sources = [ids[:-1] if ids and ids[-1] == self.eos_id else ids for (_, ids), _ in kept]
        found = self.searcher.search_ids(sources, self.decoding.stage(split), self.decoding_budget)
        return [
            (id_, nll[i], int(n_tokens[i]), hyps[0].tokens if hyps else [])
            for ((id_, _), i), hyps in zip(kept, found, strict=True)
        ]

    def on_validation_end(self) -> None:
        # After the epoch's checkpoint (callbacks' hooks run first): what validation held, and the
        # holes training's batches left, go back to the kernel (training/memory.py).
        release_free_memory()

    def on_test_start(self) -> None:
        release_free_memory()  # training's and averaging's freed memory, before the search

    def on_validation_epoch_start(self) -> None:
        self._eval_records = {}

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        # One loader per validation set, in the data module's order of their splits.
        split = self.trainer.datamodule.validation_splits[dataloader_idx]
        self._eval_step(batch, split)

    def on_test_epoch_start(self) -> None:
        self._eval_records = {}

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def _score(self, split: str) -> tuple[CorpusScores, float, list[str]]:
        """Gathers every rank's outputs of ``split`` by example id (once each) and scores the whole
        split. Every rank calls it for every split evaluated, in the same order, records or not:
        the gather is collective."""
        records = self._search(split)
        by_id = {rec[0]: rec for rec in gather_objects(records)}  # drops sampler repeats
        datamodule = self.trainer.datamodule
        references = datamodule.reference_texts(split)
        ids = sorted(by_id)
        if len(ids) < len(references) and self.trainer.is_global_zero:
            # Only with limit_*_batches / fast_dev_run: say so rather than pass a subset off as the split.
            logger.warning(
                "%s: scoring %d of %d sentences (batches were limited)", split, len(ids), len(references)
            )
        records = [by_id[i] for i in ids]
        hypotheses = datamodule.tgt_tokenizer.decode([rec[3] for rec in records])
        nll = sum(rec[1] for rec in records) / max(sum(rec[2] for rec in records), 1)
        refs = [references[i] for i in ids]
        lang = datamodule.split_target_lang(split) if hasattr(datamodule, "split_target_lang") else ""
        scores = corpus_scores(hypotheses, refs, lang or self.hparams.tgt_lang, self.bleu_tokenize)
        return scores, nll, hypotheses

    def on_validation_epoch_end(self) -> None:
        """Scores and logs each validation set: ``val/bleu``, ``val/chrf``, ``val/loss``, ``val/ppl``
        for the main validation split, ``val/<name>/bleu`` and the rest for each of
        ``data.valid_sets`` (training/selection.py)."""
        if self.trainer.sanity_checking:
            self._eval_records = {}
            return
        names = self.trainer.datamodule.valid_set_names or [None]
        said = []
        for name in names:
            scores, nll, _ = self._score(valid_split_key(name))
            ppl = float(torch.tensor(nll).exp())
            prefix = metric_prefix(name)
            metrics = {"loss": nll, "ppl": ppl, "bleu": scores.bleu, "chrf": scores.chrf, "ter": scores.ter}
            for metric, value in metrics.items():
                # The main split's four in the progress bar, as always; of several sets, their BLEU.
                shown = (name is None and metric != "ter") or metric == "bleu"
                # add_dataloader_idx=False: the names say the set (Lightning would append
                # /dataloader_idx_<i> to what is logged while a loader's index is current).
                self.log(
                    prefix + metric,
                    value,
                    prog_bar=shown,
                    sync_dist=False,
                    rank_zero_only=False,
                    add_dataloader_idx=False,
                )
            said.append(("" if name is None else f" {name}", nll, ppl, scores))
        # Where a run's memory goes, validation by validation (results.json has the run's peak).
        memory = {"memory/resident_mib": resident_mib(), "memory/peak_resident_mib": peak_resident_mib()}
        self.log_dict(memory, sync_dist=False, rank_zero_only=False, add_dataloader_idx=False)
        if not self.trainer.is_global_zero:
            return
        mib = memory["memory/resident_mib"], memory["memory/peak_resident_mib"]
        resident = f"; resident {mib[0]:.0f} MiB, peak {mib[1]:.0f}"
        for i, (label, nll, ppl, scores) in enumerate(said):
            logger.info(
                "epoch %d validation%s: loss %.4f ppl %.2f BLEU %.2f chrF %.2f TER %.2f  (%s)%s",
                self.current_epoch,
                label,
                nll,
                ppl,
                scores.bleu,
                scores.chrf,
                scores.ter,
                scores.bleu_signature,
                resident if i == len(said) - 1 else "",  # the memory once, after the last set
            )

    def on_test_epoch_end(self) -> None:
        scores, nll, hypotheses = self._score("test")
        self.test_scores = scores
        self.log_dict(
            {
                "test/bleu": scores.bleu,
                "test/bleu_lc": scores.bleu_lowercase,
                "test/chrf": scores.chrf,
                "test/ter": scores.ter,
            },
            rank_zero_only=False,
        )
        if self.trainer.is_global_zero:
            complete = len(hypotheses) == len(self.trainer.datamodule.reference_texts("test"))
            if self.output_dir is not None and complete:  # a partial file would misalign with the test set
                path = Path(self.output_dir) / f"test.{self.hparams.tgt_lang}.hyp"
                path.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
                logger.info("test translations written to %s", path)
            logger.info("test (beam %d):\n%s", self.decoding.beam_size, scores.report())
