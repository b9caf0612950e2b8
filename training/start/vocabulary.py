"""A resumed run's vocabulary is its checkpoint's.

A run's weights mean something only under the SentencePiece models they were trained with. A run
resumed with a changed corpus (``resume.allow_changes=[data.corpora]``, back-translations added
mid-run) would otherwise train SentencePiece afresh on the new text and load the weights under
it. So resuming always takes the checkpoint's models: every checkpoint holds their bytes (its
``"nmt"`` entry, what ``translate.py`` reads), and :func:`resumed_vocabulary` writes them into the
new run's ``tokenizer/`` and names them as ``data.spm_model`` (or ``src_spm_model`` and
``tgt_spm_model``), so the corpus, changed or not, is tokenised with them. The run directory's own
``tokenizer/`` files are checked against the checkpoint's bytes (their SHA-256 is logged), and a
model the run names itself must be the checkpoint's: either mismatch is an error naming both files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from training.resume import CheckpointError

SPM_KEYS = ("spm_model", "src_spm_model", "tgt_spm_model")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def resumed_vocabulary(
    checkpoint: dict[str, Any], path: Path, run_dir: Path | None, data: dict[str, Any], output_dir: Path
) -> tuple[dict[str, Any], str]:
    """The ``data`` keys that make a resumed run tokenise with its checkpoint's SentencePiece models.

    Args:
        checkpoint: the checkpoint being resumed (read already).
        path: its file, for messages.
        run_dir: the run directory it belongs to, whose ``tokenizer/`` is checked (None: none).
        data: this run's ``data`` config, resolved.
        output_dir: this run's directory: the models are written into its ``tokenizer/``.

    Returns:
        The keys to set in this run's ``data`` config (empty for a checkpoint without the models,
        written before they were stored), and a sentence for the log.

    Raises:
        CheckpointError: a ``tokenizer/`` file of the run, or a model this run names, is not the
            one the checkpoint was trained with; both files are named.
    """
    nmt = checkpoint.get("nmt") or {}
    src = nmt.get("src_spm")
    if not src:
        return {}, ""
    tgt = nmt.get("tgt_spm")  # None: one joint model
    expected = {"joint": src} if tgt is None else {"src": src, "tgt": tgt}
    if run_dir is not None:
        for side, model in expected.items():
            own = run_dir / "tokenizer" / f"{side}.model"
            if own.is_file() and own.read_bytes() != model:
                raise CheckpointError(
                    f"{own} (sha256 {_sha(own.read_bytes())}) is not the SentencePiece model {path} was "
                    f"trained with (sha256 {_sha(model)}): a run resumes with its checkpoint's vocabulary"
                )
    given = {key: data[key] for key in SPM_KEYS if data.get(key)}
    for key, named in given.items():
        model = src if key in ("spm_model", "src_spm_model") else (tgt or src)
        file = Path(named)
        if not file.is_file() or file.read_bytes() != model:
            raise CheckpointError(
                f"data.{key}={file} is not the SentencePiece model {path} was trained with (sha256 "
                f"{_sha(model)}): a resumed run keeps its checkpoint's vocabulary; to train under "
                "another, start a new run from its weights (init_from) with that model"
            )
    out = output_dir / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for side, model in expected.items():
        file = out / f"{side}.model"
        file.write_bytes(model)
        written[side] = file
    if tgt is None:
        keys = {"spm_model": str(written["joint"]), "src_spm_model": None, "tgt_spm_model": None}
        keys["joint_vocab"] = True
    else:
        keys = {"spm_model": None, "src_spm_model": str(written["src"]), "tgt_spm_model": str(written["tgt"])}
        keys["joint_vocab"] = False
    shas = ", ".join(f"{side} sha256 {_sha(model)}" for side, model in expected.items())
    said = f"the SentencePiece model(s) {path} was trained with ({shas}), not trained again on the corpus"
    return keys, said
