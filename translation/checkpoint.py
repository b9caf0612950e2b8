"""The checkpoint contract between training and inference, defined once.

A checkpoint is a Lightning-style dict written with ``torch.save`` and read back with
``torch.load(path, map_location=..., weights_only=True)``:

* ``"state_dict"``: the model's weights, keys prefixed ``"model."`` (the LightningModule holds the
  ``Transformer`` as ``self.model``); tied weights appear under each of their names. Other keys
  (a loss module's buffers, ...) are ignored by inference. A run with ``ema.decay`` stores the
  exponential moving average of its weights here, which is what it validated with and what a
  translator gets (its training weights, for resuming, are under ``"ema"``: training/ema.py).
* ``"hyper_parameters"``: plain containers; ``["model"]`` is ``TransformerConfig.to_dict()``;
  ``["decoding"]`` (optional) the search its test stage ran, ``conf/train.yaml``'s ``decoding``
  group: its :class:`decoding.SearchSettings` fields are a translator's defaults.
* ``"nmt"``: what inference needs besides the weights, built by
  :func:`common.checkpoint_fields.inference_fields`::

      {"format_version": 1, "src_lang": "de", "tgt_lang": "en",
       "src_spm": b"...",   # the serialized SentencePiece model
       "tgt_spm": None,     # or bytes; None: joint vocabulary, use src_spm
       "target_tags": {},   # a model of several target languages: {"fr": "<2fr>", ...}
       "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}

  ``target_tags`` is optional: a checkpoint without it is a model of one target language.

Lightning's own entries (``epoch``, ``optimizer_states``, ...) may be there too; inference does
not read them. The file is read by :func:`common.checkpoint_file.read_checkpoint`, the one reader of
every program; :func:`load_checkpoint` checks every part and raises its :class:`CheckpointError`
with a one-line message that names the file and what is wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from common.checkpoint_fields import FORMAT_VERSION
from common.checkpoint_file import INFERENCE, CheckpointError, read_checkpoint
from data.atomic import atomic_write
from data.tokenizer import SPECIAL_IDS, SubwordTokenizer
from decoding.config import SearchSettings
from transformer import Transformer, TransformerConfig

MODEL_PREFIX = "model."

__all__ = ["CheckpointError", "InferenceCheckpoint", "load_checkpoint", "read_checkpoint", "write_checkpoint"]


def write_checkpoint(
    path: str | os.PathLike,
    model: Transformer,
    nmt: dict[str, Any],
    hyper_parameters: dict[str, Any] | None = None,
) -> Path:
    """Write a minimal checkpoint (what training writes, less the optimizer and loop state).

    Args:
        path: the file to write, whole or not at all (:func:`data.atomic.atomic_write`).
        model: its weights and ``cfg`` are saved.
        nmt: from :func:`common.checkpoint_fields.inference_fields`.
        hyper_parameters: more plain hyperparameters to store beside ``"model"``.

    Returns:
        ``path``.
    """
    path = Path(path)
    checkpoint = {
        "state_dict": {MODEL_PREFIX + k: v for k, v in model.state_dict().items()},
        "hyper_parameters": {**(hyper_parameters or {}), "model": model.cfg.to_dict()},
        "nmt": nmt,
    }
    with atomic_write(path) as f:
        torch.save(checkpoint, f)
    return path


def _config(path: Path, checkpoint: dict[str, Any]) -> TransformerConfig:
    values = (checkpoint.get("hyper_parameters") or {}).get("model")
    if not isinstance(values, dict):
        raise CheckpointError(f"{path}: no model configuration (hyper_parameters['model'])")
    try:
        return TransformerConfig.from_dict(values)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: invalid model configuration ({err})") from None


def _search(path: Path, checkpoint: dict[str, Any]) -> SearchSettings:
    """The :class:`SearchSettings` fields of ``hyper_parameters["decoding"]`` (its other keys, such
    as ``valid_beam_size``, are training's); the defaults where there is no such entry."""
    values = (checkpoint.get("hyper_parameters") or {}).get("decoding") or {}
    if not isinstance(values, dict):
        kind = type(values).__name__
        raise CheckpointError(f"{path}: hyper_parameters['decoding'] is a {kind}, not a dict")
    known = {f.name for f in fields(SearchSettings)}
    try:
        return SearchSettings(**{k: v for k, v in values.items() if k in known})
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: hyper_parameters['decoding']: {err}") from None


def _tokenizers(path: Path, nmt: dict[str, Any]) -> tuple[SubwordTokenizer, SubwordTokenizer]:
    try:
        ids = tuple(int(nmt[k]) for k in SPECIAL_IDS)
        protos = {"source": nmt["src_spm"], "target": nmt["tgt_spm"]}
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: incomplete 'nmt' entry ({type(err).__name__}: {err})") from None
    if ids != tuple(SPECIAL_IDS.values()):
        raise CheckpointError(f"{path}: special ids {ids}, expected {tuple(SPECIAL_IDS.values())}")
    tokenizers = {}
    for side, proto in protos.items():
        if proto is None and side == "target":
            tokenizers[side] = tokenizers["source"]
            continue
        if not isinstance(proto, bytes):
            raise CheckpointError(f"{path}: the {side} tokenizer is a {type(proto).__name__}, not bytes")
        try:
            tokenizers[side] = SubwordTokenizer(proto)
        except ValueError as err:
            raise CheckpointError(f"{path}: {side} tokenizer: {err}") from None
    return tokenizers["source"], tokenizers["target"]


def _weights_mismatch(expected: dict[str, Any], found: dict[str, Any], show: int = 3) -> str:
    """What keeps ``found`` from loading into a model whose state dict is ``expected``; '' if nothing."""

    def listed(items: list[str]) -> str:
        more = f", ... ({len(items) - show} more)" if len(items) > show else ""
        return ", ".join(items[:show]) + more

    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    if any(not isinstance(v, torch.Tensor) for v in found.values()):
        return "some weights are not tensors"
    shapes = [
        f"{k} (file {list(found[k].shape)}, model {list(v.shape)})"
        for k, v in expected.items()
        if k in found and found[k].shape != v.shape
    ]
    parts = [
        f"{len(items)} {what}: {listed(items)}"
        for what, items in (("missing", missing), ("unexpected", unexpected), ("of another shape", shapes))
        if items
    ]
    return "; ".join(parts)


@dataclass
class InferenceCheckpoint:
    """What translating needs from a checkpoint, checked to fit together.

    Attributes:
        model: the ``Transformer`` with the checkpoint's weights, on the CPU, in eval mode.
        src_tokenizer, tgt_tokenizer: the subword models (the same object for a joint vocabulary).
        bos_id, eos_id: target begin/end-of-sentence ids.
        src_lang, tgt_lang: language codes ("" when the checkpoint does not say).
        target_tags: per target language, the tag its sources carry; empty for a model of one.
        data: the data settings it was trained with (its data module's hyperparameters), or {}.
        search: the search its test stage ran (beam size, length penalty, length limits), the
            project's defaults where the checkpoint does not say.
    """

    model: Transformer
    src_tokenizer: SubwordTokenizer
    tgt_tokenizer: SubwordTokenizer
    bos_id: int
    eos_id: int
    src_lang: str
    tgt_lang: str
    target_tags: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    search: SearchSettings = field(default_factory=SearchSettings)


def load_checkpoint(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> InferenceCheckpoint:
    """The checkpoint's model (eval mode, CPU, weights in ``dtype``) with its tokenizers.

    ``translation.Translator.from_checkpoint`` is the usual way in; this is the part that reads.

    Args:
        path: a checkpoint written by training or by :func:`write_checkpoint`.
        dtype: the weights' type for inference (e.g. ``torch.bfloat16``).

    Raises:
        CheckpointError: the file is missing, truncated, foreign, or its parts do not fit together
            (unknown format version, vocabulary sizes, weights that do not fit the configuration).
    """
    path = Path(path)
    checkpoint = read_checkpoint(path, INFERENCE)
    nmt = checkpoint["nmt"]
    if not isinstance(nmt, dict):
        raise CheckpointError(f"{path}: the 'nmt' entry is a {type(nmt).__name__}, not a dict")
    version = nmt.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format_version {version!r} is not supported (this code reads {FORMAT_VERSION})"
        )
    cfg = _config(path, checkpoint)
    src_tok, tgt_tok = _tokenizers(path, nmt)
    for side, tok, size in (("source", src_tok, cfg.src_vocab_size), ("target", tgt_tok, cfg.tgt_vocab_size)):
        if tok.vocab_size != size:
            raise CheckpointError(
                f"{path}: the {side} tokenizer has {tok.vocab_size} pieces, the model {size}"
            )
    if cfg.pad_id != nmt["pad_id"]:
        raise CheckpointError(f"{path}: model pad_id {cfg.pad_id} != tokenizer pad_id {nmt['pad_id']}")
    state = checkpoint["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: the 'state_dict' entry is a {type(state).__name__}, not a dict")
    weights = {k[len(MODEL_PREFIX) :]: v for k, v in state.items() if k.startswith(MODEL_PREFIX)}
    model = Transformer(cfg)
    mismatch = _weights_mismatch(model.state_dict(), weights)
    if mismatch:
        raise CheckpointError(f"{path}: the weights do not fit the model configuration: {mismatch}")
    model.load_state_dict(weights, strict=True)
    return InferenceCheckpoint(
        model=model.to(dtype).eval(),
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        bos_id=int(nmt["bos_id"]),
        eos_id=int(nmt["eos_id"]),
        src_lang=str(nmt.get("src_lang", "")),
        tgt_lang=str(nmt.get("tgt_lang", "")),
        target_tags={str(k): str(v) for k, v in (nmt.get("target_tags") or {}).items()},
        data=dict(checkpoint.get("datamodule_hyper_parameters") or {}),
        search=_search(path, checkpoint),
    )
