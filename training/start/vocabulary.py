"""A run that starts from a checkpoint keeps its vocabulary.

A model's weights mean something only under the SentencePiece models they were trained with. A run
resumed with a changed corpus (``resume.allow_changes=[data.corpora]``, back-translations added
mid-run), or fine-tuned on a new one (``init_from``), would otherwise train SentencePiece afresh on
the new text and load the weights under it. So a run from a checkpoint always takes its models:
every checkpoint holds their bytes (its ``"nmt"`` entry, what ``translate.py`` reads), and
:func:`pinned_vocabulary` writes them into the new run's ``tokenizer/`` and names them as
``data.spm_model`` (or ``src_spm_model`` and ``tgt_spm_model``), so the corpus, changed or not, is
tokenised with them. A model the run names itself must be the checkpoint's, and a resumed run's own
``tokenizer/`` files must be too (their SHA-256 is in the message): either mismatch is an error
naming both files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from common.checkpoint_file import CheckpointError
from data.tokenizer import SubwordTokenizer

# The data keys that point at existing SentencePiece models (data/tokenizer.py, given_tokenizers).
SPM_KEYS = ("spm_model", "src_spm_model", "tgt_spm_model")
# The data keys a checkpoint's vocabulary sets: compared by content, not by path, on resume.
VOCABULARY_KEYS = ("joint_vocab", *SPM_KEYS)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def run_vocabulary(output_dir: Path, joint: bool) -> dict[str, Any]:
    """The data keys naming a run's own SentencePiece model file(s) (``<run>/tokenizer/``)."""
    out = output_dir / "tokenizer"
    if joint:
        return {
            "joint_vocab": True,
            "spm_model": str(out / "joint.model"),
            "src_spm_model": None,
            "tgt_spm_model": None,
        }
    return {
        "joint_vocab": False,
        "spm_model": None,
        "src_spm_model": str(out / "src.model"),
        "tgt_spm_model": str(out / "tgt.model"),
    }


def pinned_vocabulary(
    checkpoint: dict[str, Any],
    path: Path,
    data: dict[str, Any],
    output_dir: Path,
    run_dir: Path | None,
    key: str,
) -> tuple[dict[str, Any], str]:
    """The ``data`` keys that make a run tokenise with its checkpoint's SentencePiece models, whose
    files this writes into ``<output_dir>/tokenizer/``.

    Args:
        checkpoint: the checkpoint the run starts from (read already).
        path: its file, for messages.
        data: this run's ``data`` config, resolved.
        output_dir: this run's directory.
        run_dir: the run the checkpoint belongs to, whose ``tokenizer/`` is checked (None: none).
        key: how the run names the checkpoint in messages (``ckpt_path`` or ``init_from``).

    Returns:
        The keys to set in this run's ``data`` config (empty for a checkpoint without the models,
        written before they were stored), and a sentence for the log.

    Raises:
        CheckpointError: a model of the checkpoint is not a SentencePiece model; a ``tokenizer/``
            file of its run, or a model this run names, is not the checkpoint's; both files named.
    """
    nmt = checkpoint.get("nmt") or {}
    src = nmt.get("src_spm")
    if not src:
        return {}, ""
    tgt = nmt.get("tgt_spm")  # None: one joint model
    expected = {"joint": src} if tgt is None else {"src": src, "tgt": tgt}
    for side, model in expected.items():
        try:
            SubwordTokenizer(model)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: its {side} SentencePiece model: {err}") from None
    if run_dir is not None:
        for side, model in expected.items():
            own = run_dir / "tokenizer" / f"{side}.model"
            if own.is_file() and own.read_bytes() != model:
                raise CheckpointError(
                    f"{own} (sha256 {_sha(own.read_bytes())}) is not the SentencePiece model {path} was "
                    f"trained with (sha256 {_sha(model)}): a run resumes with its checkpoint's vocabulary"
                )
    _check_given(data, src, tgt, path, key)
    out = output_dir / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    for side, model in expected.items():
        (out / f"{side}.model").write_bytes(model)
    shas = ", ".join(f"{side} sha256 {_sha(model)}" for side, model in expected.items())
    said = f"the SentencePiece model(s) {path} was trained with ({shas}), not trained again on the corpus"
    return run_vocabulary(output_dir, tgt is None), said


def _check_given(data: dict[str, Any], src: bytes, tgt: bytes | None, path: Path, key: str) -> None:
    """Refuses a SentencePiece model this run names that is not the checkpoint's."""
    for name in SPM_KEYS:
        given = data.get(name)
        if not given:
            continue
        if name == "spm_model" and tgt is not None or name != "spm_model" and tgt is None:
            model = None  # a joint model given for per-side ones, or the reverse
        else:
            model = tgt if name == "tgt_spm_model" else src
        file = Path(given)
        if model is None or not file.is_file() or file.read_bytes() != model:
            sha = _sha(model) if model is not None else "another layout"
            raise CheckpointError(
                f"data.{name}={file} is not the SentencePiece model {path} was trained with ({sha}): "
                f"a run from a checkpoint ({key}) keeps its vocabulary; drop data.{name}"
                + (
                    ""
                    if key == "init_from"
                    else ", or start a new run from its weights (init_from) with that model"
                )
            )
