"""The checkpoint's ``"nmt"`` entry: what inference needs besides the weights.

Training writes it into every checkpoint (``training.pipeline``) and ``translation.checkpoint``
checks and reads it; the rest of the contract (the file, the weights, loading) is
``translation.checkpoint``'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from data.tokenizer import SPECIAL_IDS, SubwordTokenizer

FORMAT_VERSION = 1

SpmModel = bytes | str | os.PathLike


def _spm_bytes(model: SpmModel) -> bytes:
    return bytes(model) if isinstance(model, bytes | bytearray) else Path(model).read_bytes()


def inference_fields(
    src_spm: SpmModel,
    tgt_spm: SpmModel | None,
    src_lang: str,
    tgt_lang: str,
    target_tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The checkpoint's ``"nmt"`` entry: languages, tokenizers and special ids.

    Args:
        src_spm: the source SentencePiece model, as bytes or the path of its ``.model`` file.
        tgt_spm: the target model likewise, or None for a joint vocabulary (a target model with
            the same bytes as the source is stored as None too).
        src_lang, tgt_lang: language codes, e.g. ``"de"``, ``"en"``.
        target_tags: a model of several target languages: each language's source tag, e.g.
            ``{"de": "<2de>", "fr": "<2fr>"}`` (``data.target_lang_tags``); None or empty: one.

    Returns:
        A dict of plain values, safe for ``torch.load(weights_only=True)``.

    Raises:
        ValueError: a model is not a SentencePiece model or lacks the special ids 0/1/2/3.
    """
    src = _spm_bytes(src_spm)
    tgt = None if tgt_spm is None else _spm_bytes(tgt_spm)
    if tgt == src:
        tgt = None
    for side, proto in (("source", src), ("target", tgt)):
        if proto is not None:
            try:
                SubwordTokenizer(proto)
            except ValueError as err:
                raise ValueError(f"{side} tokenizer: {err}") from None
    return {
        "format_version": FORMAT_VERSION,
        "src_lang": str(src_lang),
        "tgt_lang": str(tgt_lang),
        "src_spm": src,
        "tgt_spm": tgt,
        "target_tags": dict(target_tags or {}),
        **SPECIAL_IDS,
    }
