"""Fine-tuning: a new run that starts from a checkpoint's weights, the rest fresh by default.

``init_from=PATH`` takes any checkpoint the project writes (``last.ckpt``, ``best-*.ckpt``,
``update<N>.ckpt``, the weights-only ``averaged.ckpt``): its weights, with its model config and its
SentencePiece model(s) as they are. The rest starts as in a new run: Adam's moments, the
learning-rate schedule (warmup from update 0), the update counter, the data order (epoch 0), early
stopping and the best score, and the run's own ``checkpoints/``; ``finetune.reset`` may carry some of
them on from the checkpoint instead (:mod:`training.finetune_reset`). ``ckpt_path``
(:mod:`training.resume`) is the other way in, continuing one run exactly; the two are exclusive.

- :func:`init_point`: the checkpoint, read once and checked; every refusal is a
  :class:`FineTuneError` of one line that names the keys to change.
- :func:`check_model`: a model key of the run's config that differs from the checkpoint's is
  refused, naming it and both values: the weights fit the checkpoint's model only.
- :meth:`InitPoint.tokenizer_keys`: the checkpoint's SentencePiece model(s) written into the run and
  given to the data as ``data.spm_model`` (or the per-side keys), so that none is trained on the new
  corpus: a model's weights mean nothing under another vocabulary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from data.tokenizer import SubwordTokenizer
from training.resume import CheckpointError, flatten, read_checkpoint
from transformer import TransformerConfig

logger = logging.getLogger(__name__)

# Model keys the run takes from its tokenizers, not from the config: not compared.
DERIVED_MODEL_KEYS = ("src_vocab_size", "tgt_vocab_size", "pad_id")
# The data keys that point at existing SentencePiece models (data/tokenizer.py, given_tokenizers).
SPM_KEYS = ("spm_model", "src_spm_model", "tgt_spm_model")


class FineTuneError(ValueError):
    """``init_from`` cannot be used with this checkpoint or config; the message is one line."""


@dataclass(frozen=True)
class InitPoint:
    """The checkpoint a fine-tuning run starts from, read once.

    Attributes:
        path: the checkpoint file.
        global_step: the optimizer updates its weights were trained (the last averaged
            checkpoint's for an average).
        averaged_from: the checkpoints averaged into it; empty for a training checkpoint.
        model: its model config (``hyper_parameters["model"]``), used as it is.
        src_spm: its source (or joint) SentencePiece model, serialized.
        tgt_spm: its target SentencePiece model; None for a joint vocabulary.
        src_lang, tgt_lang: the languages it was trained on ("" where it does not say).

    The weights are not held: :func:`load_weights` reads them when the module exists, and the
    memory-mapped file is let go once they are copied.
    """

    path: Path
    global_step: int
    averaged_from: tuple[str, ...]
    model: dict[str, Any]
    src_spm: bytes
    tgt_spm: bytes | None
    src_lang: str
    tgt_lang: str

    @property
    def joint(self) -> bool:
        """One SentencePiece model for both sides."""
        return self.tgt_spm is None

    def tokenizer_keys(self, data: dict[str, Any], run_dir: Path) -> dict[str, Any]:
        """Writes the checkpoint's SentencePiece model(s) into ``<run_dir>/tokenizer/``; returns the
        data keys that make the run use them (``joint_vocab`` and ``spm_model`` or the per-side keys).

        Args:
            data: the run's ``data`` config, resolved.
            run_dir: the run's directory.

        Raises:
            FineTuneError: ``data.joint_vocab`` differs from the checkpoint's, or a ``data.*spm_model``
                is given that is not the checkpoint's model.
        """
        if bool(data.get("joint_vocab", True)) != self.joint:
            raise FineTuneError(
                f"init_from: data.joint_vocab is {self.joint} in the checkpoint {self.path}, "
                f"{data.get('joint_vocab')} in this run's config: the checkpoint's SentencePiece model(s) "
                f"are used as they are; drop the override, or give data.joint_vocab={str(self.joint).lower()}"
            )
        out = run_dir / "tokenizer"
        if self.joint:
            files = {"spm_model": (out / "joint.model", self.src_spm)}
        else:
            files = {"src_spm_model": (out / "src.model", self.src_spm)}
            files["tgt_spm_model"] = (out / "tgt.model", self.tgt_spm)
        for key in SPM_KEYS:
            given = data.get(key)
            if given and (key not in files or _read(given) != files[key][1]):
                raise FineTuneError(
                    f"init_from: data.{key}={given} is not the SentencePiece model of the checkpoint "
                    f"{self.path}, which is used as it is (its weights go with its vocabulary); "
                    f"drop data.{key}"
                )
        for path, proto in files.values():
            SubwordTokenizer(proto).save(path)  # type: ignore[arg-type]
        keys: dict[str, Any] = {key: None for key in SPM_KEYS}
        keys.update({key: str(path) for key, (path, _) in files.items()})
        return {"joint_vocab": self.joint, **keys}

    def describe(self) -> str:
        """The file and how long its weights were trained, for the log."""
        if self.averaged_from:
            return (
                f"{self.path} (the average of {len(self.averaged_from)} checkpoints, the last trained "
                f"{self.global_step} updates)"
            )
        return f"{self.path} (trained {self.global_step} updates)"


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def init_point(init_from: str, ckpt_path: str | None) -> InitPoint:
    """The checkpoint ``init_from`` names, read and checked to hold weights, a model config and
    SentencePiece model(s).

    Args:
        init_from: a checkpoint file (``init_from``).
        ckpt_path: the run's ``ckpt_path``; either one or the other may be given.

    Raises:
        FineTuneError: both keys are given; the file is missing, damaged, or not a checkpoint of
            this project (no weights, model config or SentencePiece model).
    """
    if ckpt_path not in (None, ""):
        raise FineTuneError(
            f"init_from={init_from} and ckpt_path={ckpt_path} are both given: init_from starts a new run "
            "from a checkpoint's weights (fresh optimizer, schedule and data order), ckpt_path resumes "
            "a run exactly; give one of them"
        )
    path = Path(init_from)
    if not path.is_file():
        raise FineTuneError(f"init_from={init_from}: no such checkpoint file")
    try:
        checkpoint = read_checkpoint(path, training=False)  # an averaged checkpoint holds weights only
    except CheckpointError as err:
        raise FineTuneError(f"init_from: {err}") from None
    model = (checkpoint.get("hyper_parameters") or {}).get("model")
    nmt = checkpoint.get("nmt")
    if not isinstance(model, dict):
        raise FineTuneError(f"init_from: {path} holds no model config (hyper_parameters['model'])")
    if not isinstance(nmt, dict) or not isinstance(nmt.get("src_spm"), bytes):
        raise FineTuneError(f"init_from: {path} holds no SentencePiece model (its 'nmt' entry)")
    for side in ("src_spm", "tgt_spm"):
        if nmt.get(side) is not None:
            try:
                SubwordTokenizer(nmt[side])
            except (TypeError, ValueError) as err:
                raise FineTuneError(f"init_from: {path}: its {side} entry: {err}") from None
    return InitPoint(
        path=path,
        global_step=int(checkpoint.get("global_step", 0)),
        averaged_from=tuple(str(p) for p in checkpoint.get("averaged_from", ())),
        model=dict(model),
        src_spm=nmt["src_spm"],
        tgt_spm=nmt.get("tgt_spm"),
        src_lang=str(nmt.get("src_lang", "")),
        tgt_lang=str(nmt.get("tgt_lang", "")),
    )


def _normalized(model: dict[str, Any], init: InitPoint) -> dict[str, Any]:
    """``model`` as ``TransformerConfig`` reads it (defaults filled in, the attention mapping
    normalized), the vocabulary sizes the checkpoint's, and ``share_embeddings`` as the pipeline
    sets it (only with a joint vocabulary); flat by dotted key."""
    values = {
        **model,
        "src_vocab_size": init.model["src_vocab_size"],
        "tgt_vocab_size": init.model["tgt_vocab_size"],
    }
    values["share_embeddings"] = bool(values.get("share_embeddings", False) and init.joint)
    return {
        k: v
        for k, v in flatten(TransformerConfig.from_dict(values).to_dict()).items()
        if k not in DERIVED_MODEL_KEYS
    }


# Model keys a fine-tuned run may change: regularisation, which the weights do not depend on
# (domain adaptation raises dropout routinely; label_smoothing is not a model key at all).
REGULARISATION_KEYS = ("dropout", "attention_dropout", "activation_dropout")


def check_model(init: InitPoint, model: dict[str, Any]) -> None:
    """Refuses a run whose ``model`` config differs from the checkpoint's, but for its
    regularisation (:data:`REGULARISATION_KEYS`), which a fine-tuned run may set anew.

    Args:
        init: the checkpoint.
        model: the run's ``model`` config, resolved (plain containers).

    Raises:
        FineTuneError: every key that differs, with both values (a key the checkpoint predates
            counts as its default, as loading it does).
    """
    saved, current = _normalized(init.model, init), _normalized(model, init)
    differ = [k for k in current if saved.get(k) != current[k] and k not in REGULARISATION_KEYS]
    if differ:
        said = "; ".join(
            f"model.{k} is {saved.get(k)!r} in the checkpoint, {current[k]!r} in this run" for k in differ
        )
        raise FineTuneError(
            f"init_from: the model config differs from the checkpoint's ({init.path}), whose weights fit "
            f"its own model only: {said}. Drop the override(s), or give the checkpoint's values"
        )


def resumed_tokenizer_keys(saved: dict[str, Any] | None, data: dict[str, Any]) -> dict[str, Any]:
    """The ``data.*spm_model`` keys (and ``data.joint_vocab``, which goes with them) a resumed run
    takes from its checkpoint's config.

    A fine-tuned run's config names the SentencePiece model it was given
    (:meth:`InitPoint.tokenizer_keys`); resuming it with ``ckpt_path`` alone (no ``init_from``, which
    may not go with it) must not train another on the corpus. Where this run gives none of the keys,
    the checkpoint's are taken; where it gives some, :func:`training.resume.check_config` compares
    them as any other key.

    Args:
        saved: the checkpoint's config (None: written before configs were stored).
        data: this run's ``data`` config, resolved.

    Returns:
        The keys to set in this run's ``data`` config; empty where there are none to take.
    """
    saved_data = (saved or {}).get("data") or {}
    if any(data.get(key) for key in SPM_KEYS) or not any(saved_data.get(key) for key in SPM_KEYS):
        return {}
    keys = {key: saved_data.get(key) for key in SPM_KEYS}
    return {**keys, "joint_vocab": saved_data.get("joint_vocab", data.get("joint_vocab"))}


def load_weights(module: nn.Module, init: InitPoint) -> None:
    """Copies the checkpoint's weights into ``module`` (the training module, every key).

    Raises:
        FineTuneError: the file cannot be read again, or its weights do not fit the module.
    """
    try:
        state_dict = read_checkpoint(init.path, training=False)["state_dict"]  # memory-mapped
    except CheckpointError as err:
        raise FineTuneError(f"init_from: {err}") from None
    try:
        module.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:
        said = " ".join(str(err).split())
        raise FineTuneError(
            f"init_from: {init.path}: the weights do not fit the model ({said[:300]})"
        ) from None


def fresh_state_said(
    init: InitPoint, lr: float, warmup_steps: int, ckpt_dir: Path, reset: frozenset[str], carried: str
) -> str:
    """The log line of a fine-tuning start: the file, its updates, what starts afresh
    (``finetune.reset``) and what is carried on (``carried``, :meth:`Carried.describe`)."""
    fresh = {
        "optimizer": "the optimizer (Adam's moments)",
        "schedule": f"the learning-rate schedule (warmup from update 0 to optimizer.lr={lr:g} over "
        f"{warmup_steps} updates)",
        "data_order": "the data order (epoch 0)",
        "early_stopping": "early stopping",
        "best_score": "the best score",
    }
    said = [text for part, text in fresh.items() if part in reset]
    return (
        f"init_from: starting from the weights of {init.describe()}, with its model config and "
        f"SentencePiece model(s) as they are. Fresh (finetune.reset): {', '.join(said) or 'nothing'}; "
        f"carried on from the checkpoint: {carried or 'nothing'}; the update counter starts from 0 and "
        f"checkpoints go to {ckpt_dir}"
    )
