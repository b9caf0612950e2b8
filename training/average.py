"""Averages chosen checkpoints of one model into one: ``python3 -m training.average``.

    python3 -m training.average runs/x/<run>/checkpoints/epoch01{7,8,9}.ckpt --output avg.ckpt

fairseq's ``scripts/average_checkpoints.py`` and Marian's ``average.py`` do this for any files;
here the files must be checkpoints of one model with one vocabulary: the same model settings
(``hyper_parameters["model"]``), the same parameters, and the same SentencePiece models, special
ids and target-language tags (the ``"nmt"`` entry). A file that differs is refused, naming it and
what differs. The output is the element-wise mean of the weights with the last file's other
fields and no training state (``training.averaging.average_checkpoints``), written whole or not
at all; ``translate.py``, ``init_from`` and the test stage read it like any checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from training.averaging import average_checkpoints

# The "nmt" fields that make a vocabulary: the SentencePiece models, the ids, the tags.
VOCABULARY_FIELDS = ("src_spm", "tgt_spm", "pad_id", "unk_id", "bos_id", "eos_id", "target_tags")


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 (any failure to read is the file's fault, said once)
        raise ValueError(f"{path}: not a checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"{path}: not a checkpoint of this project (no state_dict)")
    return checkpoint


def check_one_model(paths: list[Path]) -> None:
    """Refuses (ValueError) files that are not checkpoints of one model with one vocabulary,
    naming the file and what differs from the first."""
    first_path, first = paths[0], _read(paths[0])
    model = (first.get("hyper_parameters") or {}).get("model")
    nmt = first.get("nmt") or {}
    shapes = {k: tuple(v.shape) for k, v in first["state_dict"].items()}
    for path in paths[1:]:
        other = _read(path)
        other_model = (other.get("hyper_parameters") or {}).get("model")
        if model is not None and other_model is not None:
            for key in sorted(set(model) | set(other_model)):
                if model.get(key) != other_model.get(key):
                    mine, theirs = other_model.get(key), model.get(key)
                    raise ValueError(
                        f"{path}: model.{key} is {mine!r}, {theirs!r} in {first_path}: not the same model"
                    )
        other_nmt = other.get("nmt") or {}
        for key in VOCABULARY_FIELDS:
            if nmt.get(key) != other_nmt.get(key):
                what = "SentencePiece model" if key.endswith("_spm") else key
                raise ValueError(
                    f"{path}: its {what} ({key}) differs from {first_path}'s: not the same vocabulary"
                )
        other_shapes = {k: tuple(v.shape) for k, v in other["state_dict"].items()}
        if other_shapes != shapes:
            name = sorted(set(shapes) ^ set(other_shapes)) or [
                k for k in shapes if shapes[k] != other_shapes[k]
            ]
            raise ValueError(f"{path}: parameter {name[0]} differs from {first_path}'s: not the same model")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m training.average", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path, help="the checkpoints to average (two or more)")
    parser.add_argument("--output", required=True, type=Path, help="the averaged checkpoint to write")
    args = parser.parse_args(argv)
    if len(args.checkpoints) < 2:
        parser.error("give two or more checkpoints to average")
    if args.output.resolve() in {p.resolve() for p in args.checkpoints}:
        parser.error(f"--output {args.output} is one of the checkpoints averaged")
    try:
        check_one_model(args.checkpoints)
        written = average_checkpoints(args.checkpoints, args.output)
    except ValueError as err:
        sys.stderr.write(f"average: {err}\n")
        return 1
    sys.stderr.write(f"averaged {len(args.checkpoints)} checkpoints into {written}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
