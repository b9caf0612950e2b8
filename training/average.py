"""Averaging the weights of checkpoints of one model (Vaswani et al. average the last 5 or 20):
the library and its command, ``python3 -m training.average``.

    python3 -m training.average runs/x/<run>/checkpoints/epoch01{7,8,9}.ckpt --output avg.ckpt

fairseq's ``scripts/average_checkpoints.py`` and Marian's ``average.py`` do this for any files;
here the files must be checkpoints of one model with one vocabulary: the same model settings
(``hyper_parameters["model"]``), the same parameters, and the same SentencePiece models, special
ids and target-language tags (the ``"nmt"`` entry). A file that differs is refused, naming it and
what differs. The output is the element-wise mean of the weights with the other fields of a
template (the last file, or the run's ``last.ckpt``) and no training state, written whole or not
at all; ``translate.py``, ``init_from`` and the test stage read it like any checkpoint.

A run averages here too: its last epoch or update checkpoints (``average_last``), or the weights a
time budget's last part took (:mod:`training.budget.points`), into ``checkpoints/averaged.ckpt``.
Every file is read by the project's one reader (:func:`common.checkpoint_file.read_checkpoint`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from common.checkpoint_file import CheckpointError, read_checkpoint
from data.atomic import atomic_write

# The "nmt" fields that make a vocabulary: the SentencePiece models, the ids, the tags.
VOCABULARY_FIELDS = ("src_spm", "tgt_spm", "pad_id", "unk_id", "bos_id", "eos_id", "target_tags")
# What an average leaves out of its template: no training state matches averaged weights (an EMA
# run's training weights, kept beside the EMA under "ema", included: training/ema.py).
TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks", "ema")


def average_checkpoints(
    paths: list[str | Path],
    output: str | Path,
    template: str | Path | None = None,
    weights: list[float] | None = None,
) -> Path:
    """Writes a checkpoint whose ``state_dict`` is the element-wise mean of those in ``paths``,
    each file read once (:func:`write_average`).

    Args:
        paths: the checkpoints (or weights-only files) averaged, oldest first.
        output: the file to write.
        template: the checkpoint whose other fields the output takes; None: the last of ``paths``.
        weights: how many checkpoints each file stands for (a mean of several); None: one each.

    Raises:
        ValueError: no paths, or a tensor whose shape differs between files, naming it.
        CheckpointError: a file that is not a checkpoint, naming it.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    checkpoints = [read_checkpoint(path) for path in paths]
    base = checkpoints[-1] if template is None else read_checkpoint(template)
    return write_average(list(zip(paths, checkpoints, strict=True)), base, output, weights)


def write_average(
    read: list[tuple[str | Path, dict[str, Any]]],
    base: dict[str, Any],
    output: str | Path,
    weights: list[float] | None = None,
) -> Path:
    """Writes the mean of the ``state_dict`` of checkpoints already read, with ``base``'s other fields.

    Floating-point tensors are summed in float64 in the order given, divided, and stored in the
    base's type; other tensors are taken from the last file. Everything else (hyperparameters,
    tokenizer fields) is the base's, less its training state; a key of its ``state_dict`` that the
    averaged files lack is kept as it is. ``output`` is written whole or not at all
    (:func:`data.atomic.atomic_write`): a failed average leaves an earlier one as it was.

    Args:
        read: each file averaged and what it holds, oldest first.
        base: the checkpoint whose other fields the output takes.
        output: the file to write.
        weights: how many checkpoints each file stands for; None: one each.

    Raises:
        ValueError: a tensor whose shape differs between files, naming it.
    """
    weights = weights or [1.0] * len(read)
    total: dict[str, torch.Tensor] = {}
    for (path, checkpoint), weight in zip(read, weights, strict=True):
        for name, tensor in checkpoint["state_dict"].items():
            if name in total and total[name].shape != tensor.shape:
                shapes = f"{tuple(tensor.shape)}, not {tuple(total[name].shape)}"
                raise ValueError(f"{path}: {name} has shape {shapes}")
            if not tensor.is_floating_point():
                total[name] = tensor
                continue
            value = tensor.double() if weight == 1.0 else tensor.double() * weight
            total[name] = total[name] + value if name in total else value
    count = sum(weights)
    averaged = dict(base["state_dict"])
    for name, t in total.items():
        dtype = averaged[name].dtype if name in averaged else t.dtype
        averaged[name] = (t / count).to(dtype) if t.is_floating_point() else t
    keep = {k: v for k, v in base.items() if k not in TRAINING_STATE}
    keep["state_dict"] = averaged
    keep["averaged_from"] = [str(path) for path, _ in read]
    output = Path(output)
    with atomic_write(output) as f:
        torch.save(keep, f)
    return output


def check_one_model(read: list[tuple[Path, dict[str, Any]]]) -> None:
    """Refuses (ValueError) checkpoints (each file and what it holds) that are not of one model with
    one vocabulary, naming the file and what differs from the first."""
    first_path, first = read[0]
    model = (first.get("hyper_parameters") or {}).get("model")
    nmt = first.get("nmt") or {}
    shapes = {k: tuple(v.shape) for k, v in first["state_dict"].items()}
    for path, other in read[1:]:
        _same_model(path, other, first_path, model)
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


def _same_model(path: Path, other: dict[str, Any], first_path: Path, model: dict | None) -> None:
    other_model = (other.get("hyper_parameters") or {}).get("model")
    if model is None or other_model is None:
        return
    for key in sorted(set(model) | set(other_model)):
        if model.get(key) != other_model.get(key):
            mine, theirs = other_model.get(key), model.get(key)
            raise ValueError(
                f"{path}: model.{key} is {mine!r}, {theirs!r} in {first_path}: not the same model"
            )


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
        read = [(path, read_checkpoint(path)) for path in args.checkpoints]  # each file once
        check_one_model(read)
        written = write_average(read, read[-1][1], args.output)
    except ValueError as err:  # CheckpointError included
        sys.stderr.write(f"average: {err}\n")
        return 1
    sys.stderr.write(f"averaged {len(args.checkpoints)} checkpoints into {written}\n")
    return 0


__all__ = ["CheckpointError", "average_checkpoints", "check_one_model", "main", "write_average"]

if __name__ == "__main__":
    sys.exit(main())
