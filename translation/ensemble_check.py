"""Checkpoints searched together as an ensemble: what they must share with the first one.

An ensemble's search takes the weighted mean of its members' log-probabilities over one target
vocabulary, of sources encoded once (``decoding/ensemble.py``), so its checkpoints must have the
same SentencePiece models, special ids and target-language tags; their models may differ in size
and attention.
"""

from __future__ import annotations

from pathlib import Path

from translation.checkpoint import CheckpointError, InferenceCheckpoint


def check_ensemble_member(
    first_path: Path, first: InferenceCheckpoint, path: Path, other: InferenceCheckpoint
) -> None:
    """Refuses a checkpoint that cannot be searched together with the first one, naming both."""
    differences = []
    for side in ("src_tokenizer", "tgt_tokenizer"):
        if getattr(first, side).fingerprint != getattr(other, side).fingerprint:
            differences.append(f"their {side[:3]} SentencePiece models differ")
    for key in ("bos_id", "eos_id", "target_tags"):
        if getattr(first, key) != getattr(other, key):
            differences.append(f"{key} {getattr(first, key)!r} != {getattr(other, key)!r}")
    for key in ("src_vocab_size", "tgt_vocab_size", "pad_id"):
        if getattr(first.model.cfg, key) != getattr(other.model.cfg, key):
            differences.append(f"{key} {getattr(first.model.cfg, key)} != {getattr(other.model.cfg, key)}")
    if differences:
        raise CheckpointError(
            f"{first_path} and {path} cannot be ensembled: {'; '.join(differences)} "
            "(an ensemble's checkpoints must share their vocabularies)"
        )
