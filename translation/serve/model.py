"""The model a server translates with: one checkpoint, read once, and a translator per target
language.

A model of several target languages (trained with ``data.target_lang_tags``) gets one
:class:`~translation.Translator` per language, all on the same weights: each puts its own tag
before the sources. A model of one language gets one. The device's fast paths are applied
once, as ``translate.py`` applies them, and every translator searches with them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from decoding import DecodingConfig
from fastpaths.optimize import optimize
from translation.checkpoint import InferenceCheckpoint, load_checkpoint
from translation.device import resolve_device
from translation.results import Translation
from translation.serve.requests import RequestError
from translation.translator import Translator

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchKey:
    """What lines must share to be searched together: the settings and the target language."""

    options: DecodingConfig
    target_lang: str


class ServedModel:
    """A checkpoint's translators, by target language.

    Args:
        checkpoint: what :func:`translation.checkpoint.load_checkpoint` read.
        device: where the model runs.
        target_lang: the language of a request that names none; None: a model of several
            languages then refuses such a request, a model of one uses its own.
        max_tokens: the search's budget per batch (``Translator.translate_ids``); None: the
            device's.

    Raises:
        ValueError: ``target_lang`` is not one the model translates into.
    """

    def __init__(
        self,
        checkpoint: InferenceCheckpoint,
        device: torch.device,
        target_lang: str | None = None,
        max_tokens: int | None = None,
    ) -> None:
        tags = checkpoint.target_tags
        self.src_lang = checkpoint.src_lang
        self.search = checkpoint.search  # the search its test stage ran: a request's defaults
        self.languages = sorted(tags) if tags else [checkpoint.tgt_lang]
        self.translators = {
            lang: Translator(
                checkpoint.model,
                checkpoint.src_tokenizer,
                checkpoint.tgt_tokenizer,
                checkpoint.bos_id,
                checkpoint.eos_id,
                device,
                src_lang=checkpoint.src_lang,
                tgt_lang=checkpoint.tgt_lang,
                target_tags=tags,
                target_lang=lang if tags else None,
                search=checkpoint.search,
            )
            for lang in self.languages
        }
        if target_lang and self._unknown(target_lang):
            raise ValueError(f"--target-lang: {self._unknown(target_lang)}")
        # A model of one language needs none named (its language may be "": the checkpoint's).
        self.default_lang = target_lang or (None if tags else self.languages[0])
        self.max_tokens = max_tokens
        fast_paths = optimize(checkpoint.model, device, "inference")
        for translator in self.translators.values():
            translator.use(fast_paths)
        logger.debug("%s", fast_paths.describe())

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        target_lang: str | None = None,
        max_tokens: int | None = None,
    ) -> ServedModel:
        """The served model of a checkpoint file.

        Raises:
            CheckpointError: the file is not a usable checkpoint.
            ValueError: the device is not available; ``target_lang`` is not the model's.
        """
        where = resolve_device(device)  # before reading: a wrong device is reported at once
        return cls(load_checkpoint(path, dtype), where, target_lang, max_tokens)

    @property
    def model(self) -> torch.nn.Module:
        return next(iter(self.translators.values())).model

    def _unknown(self, lang: str) -> str | None:
        """Why the model cannot translate into ``lang``; None if it can."""
        if lang in self.translators or self.languages == [""]:  # "": the checkpoint names none
            return None
        known = ", ".join(self.languages)
        if len(self.languages) == 1:
            return f"this model translates into {known} only, not {lang}"
        return f"this model was not trained to translate into {lang}, only into {known}"

    def language(self, target_lang: str | None) -> str:
        """The language a request gets: its own, or the server's default.

        Raises:
            RequestError: none given where the model has several, or one it does not know
                (``field`` ``target_lang``).
        """
        lang = target_lang or self.default_lang
        if lang is None:
            known = ", ".join(self.languages)
            raise RequestError(f"this model translates into {known}: say which (target_lang)", "target_lang")
        why = self._unknown(lang)
        if why:
            raise RequestError(f"target_lang: {why}", "target_lang")
        return lang if lang in self.translators else self.languages[0]

    def encode(self, lines: Sequence[str], target_lang: str) -> list[list[int]]:
        """The lines' source ids (tagged for ``target_lang``; cropped to the model's positions)."""
        return self.translators[target_lang].encode_sources(lines, name="<request>")

    def decode(self, key: Hashable, sources: list[list[int]]) -> list[list[Translation]]:
        """One search of ``sources`` (the batcher's ``decode``): per source its translations."""
        assert isinstance(key, SearchKey)
        translator = self.translators[key.target_lang]
        return translator.translate_ids(sources, key.options, self.max_tokens)
