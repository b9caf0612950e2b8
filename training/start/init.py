"""Fine-tuning: a new run that starts from a checkpoint's weights (``init_from``), the rest fresh by default.

``init_from=PATH`` takes any checkpoint the project writes (``last.ckpt``, ``best-*.ckpt``,
``update<N>.ckpt``, the weights-only ``averaged.ckpt``): its weights, with its model config and its
SentencePiece model(s) as they are. The rest starts as in a new run (Adam's moments, the
learning-rate schedule, the update counter, the data order, early stopping and the best score, the
run's own ``checkpoints/``), but for what ``finetune.reset`` carries on (:mod:`training.start.carried`).
``ckpt_path`` (:mod:`training.start.resume`) is the other way in, continuing one run exactly; the
two are exclusive.

- :func:`check_init`: the checkpoint holds weights, a model config and SentencePiece model(s), and
  this run's ``model`` config is the checkpoint's: a key that differs is refused, naming it and
  both values, but for regularisation (dropout), which a fine-tuned run may set anew; those that
  differ are said in the log, with both values.
- :func:`init_model`: the model config the run builds: the checkpoint's, with this run's
  regularisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from common.checkpoint_file import CheckpointError
from training.start.resume import flatten
from transformer import TransformerConfig

# Model keys the run takes from its tokenizers, not from the config: not compared.
DERIVED_MODEL_KEYS = ("src_vocab_size", "tgt_vocab_size", "pad_id")
# Model keys a fine-tuned run may change: regularisation, which the weights do not depend on
# (domain adaptation raises dropout routinely; label_smoothing is not a model key at all).
REGULARISATION_KEYS = ("dropout", "attention_dropout", "activation_dropout")


class FineTuneError(CheckpointError):
    """``init_from`` cannot be used with this checkpoint or config; the message is one line."""


def _normalized(model: dict[str, Any], saved: dict[str, Any], joint: bool) -> dict[str, Any]:
    """``model`` as ``TransformerConfig`` reads it (defaults filled in, the attention mapping
    normalized), the vocabulary sizes the checkpoint's, and ``share_embeddings`` as the pipeline
    sets it (only with a joint vocabulary); flat by dotted key."""
    values = {**model, "src_vocab_size": saved["src_vocab_size"], "tgt_vocab_size": saved["tgt_vocab_size"]}
    values["share_embeddings"] = bool(values.get("share_embeddings", False) and joint)
    return {
        k: v
        for k, v in flatten(TransformerConfig.from_dict(values).to_dict()).items()
        if k not in DERIVED_MODEL_KEYS
    }


def check_init(
    checkpoint: dict[str, Any], path: Path, model: dict[str, Any], data: dict[str, Any]
) -> list[str]:
    """Checks that a run can start from ``checkpoint``'s weights; returns the log's lines for the
    model keys that differ and may (regularisation), each with both values.

    Args:
        checkpoint: the ``init_from`` checkpoint, read.
        path: its file.
        model: this run's ``model`` config, resolved (plain containers).
        data: this run's ``data`` config, resolved.

    Raises:
        FineTuneError: no model config or SentencePiece model in the file; ``data.joint_vocab``
            other than the checkpoint's; a model key that differs and may not (every one, with both
            values; a key the checkpoint predates counts as its default, as loading it does).
    """
    saved = (checkpoint.get("hyper_parameters") or {}).get("model")
    nmt = checkpoint.get("nmt")
    if not isinstance(saved, dict):
        raise FineTuneError(f"init_from: {path} holds no model config (hyper_parameters['model'])")
    if not isinstance(nmt, dict) or not isinstance(nmt.get("src_spm"), bytes):
        raise FineTuneError(f"init_from: {path} holds no SentencePiece model (its 'nmt' entry)")
    joint = nmt.get("tgt_spm") is None
    if bool(data.get("joint_vocab", True)) != joint:
        raise FineTuneError(
            f"init_from: data.joint_vocab is {joint} in the checkpoint {path}, "
            f"{data.get('joint_vocab')} in this run's config: the checkpoint's SentencePiece model(s) "
            f"are used as they are; drop the override, or give data.joint_vocab={str(joint).lower()}"
        )
    before, now = _normalized(saved, saved, joint), _normalized(model, saved, joint)
    differ = [k for k in now if before.get(k) != now[k]]
    refused = [k for k in differ if k not in REGULARISATION_KEYS]
    if refused:
        said = "; ".join(
            f"model.{k} is {before.get(k)!r} in the checkpoint, {now[k]!r} in this run" for k in refused
        )
        raise FineTuneError(
            f"init_from: the model config differs from the checkpoint's ({path}), whose weights fit "
            f"its own model only: {said}. Drop the override(s), or give the checkpoint's values"
        )
    return [
        f"init_from: model.{k} is {before.get(k)!r} in the checkpoint, {now[k]!r} in this run: this run's "
        "applies (regularisation, which the weights do not depend on)"
        for k in differ
    ]


def init_model(checkpoint: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """The model config a run from ``checkpoint`` builds: the checkpoint's, as its weights were
    built (:func:`check_init`), with this run's regularisation (``model``'s dropout keys)."""
    saved = checkpoint["hyper_parameters"]["model"]
    return {**saved, **{k: model[k] for k in REGULARISATION_KEYS if k in model}}


def describe(path: Path, checkpoint: dict[str, Any]) -> str:
    """The file and how long its weights were trained, for the log."""
    step = int(checkpoint.get("global_step", 0))
    averaged = checkpoint.get("averaged_from") or ()
    if averaged:
        return f"{path} (the average of {len(averaged)} checkpoints, the last trained {step} updates)"
    return f"{path} (trained {step} updates)"


def fresh_state_said(
    described: str, lr: float, warmup_steps: int, ckpt_dir: Path, reset: frozenset[str], carried: str
) -> str:
    """The log line of a fine-tuning start: the file, its updates, what starts afresh
    (``finetune.reset``) and what is carried on (``carried``, :meth:`Carried.describe`)."""
    fresh = {
        "optimizer": "the optimizer (Adam's moments)",
        "schedule": f"the learning-rate schedule (warmup from update 0 to lr.peak={lr:g} over "
        f"{warmup_steps} updates)",
        "data_order": "the data order (epoch 0)",
        "early_stopping": "early stopping",
        "best_score": "the best score",
    }
    said = [text for part, text in fresh.items() if part in reset]
    return (
        f"init_from: starting from the weights of {described}, with its model config and "
        f"SentencePiece model(s) as they are. Fresh (finetune.reset): {', '.join(said) or 'nothing'}; "
        f"carried on from the checkpoint: {carried or 'nothing'}; the update counter starts from 0 and "
        f"checkpoints go to {ckpt_dir}"
    )


def load_weights(module: nn.Module, state_dict: dict[str, Any], path: Path | None) -> None:
    """Copies a checkpoint's weights (``state_dict``, every key) into the training module.

    Raises:
        FineTuneError: the weights do not fit the module, naming the file.
    """
    try:
        module.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:
        said = " ".join(str(err).split())
        raise FineTuneError(f"init_from: {path}: the weights do not fit the model ({said[:300]})") from None
