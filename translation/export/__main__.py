"""Export a checkpoint of this project for CTranslate2 or Hugging Face ``transformers``.

    python3 -m translation.export --checkpoint CKPT --format ctranslate2 --output DIR [--quantization int8]
    python3 -m translation.export --checkpoint CKPT --format huggingface --output DIR

Each writes a complete folder (model, SentencePiece models ``source.spm`` and ``target.spm``, a
model card ``README.md``) aside and moves it into place at the end, so ``DIR`` is never half
written. A missing extra, a bad checkpoint, an existing ``DIR`` (without ``--force``) or a model
the format cannot express (a non-softmax attention mechanism, for either) gives a one-line error
and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from transformer.mechanisms import ROLES
from translation.checkpoint import CheckpointError, InferenceCheckpoint, load_checkpoint
from translation.export.card import card_facts, model_card
from translation.export.ctranslate2 import QUANTIZATIONS

logger = logging.getLogger("translation.export")

PROG = "python3 -m translation.export"
INSTALL = 'python3 -m pip install -e ".[export]"'
# The package each format needs (both are in the ``export`` extra).
NEEDS = {"ctranslate2": "ctranslate2", "huggingface": "transformers"}
EXAMPLE_SOURCES = {"de": "Ein Hund rennt über die Wiese.", "en": "A dog runs across the meadow."}
# A model of several target languages: each language's source tag, in the export folder.
TAGS_FILE = "target_tags.json"


class ExportError(Exception):
    """A problem reported in one line with exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint written by training")
    parser.add_argument(
        "--format",
        required=True,
        choices=sorted(NEEDS),
        help="ctranslate2: a ctranslate2.Translator model directory; huggingface: a folder that "
        "MarianMTModel and MarianTokenizer.from_pretrained load, ready for `huggingface-cli upload`",
    )
    parser.add_argument("--output", required=True, metavar="DIR", help="the folder to write")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="ctranslate2 only: the weights' type (default: float32); int8 weights take a quarter of "
        "float32's bytes and decode faster on CPUs, with nearly the same BLEU (BENCHMARKS.md, 'Export')",
    )
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")
    return parser


def check_extra(fmt: str) -> None:
    """Raises :class:`ExportError` with the install command when the format's package is missing."""
    package = NEEDS[fmt]
    try:
        importlib.import_module(package)
    except ImportError:
        raise ExportError(
            f"--format {fmt} needs the {package} package, part of the optional extra 'export': {INSTALL}"
        ) from None


def usage(fmt: str, checkpoint: InferenceCheckpoint, name: str) -> str:
    """A Python snippet that loads the export from folder ``name`` and translates one sentence
    (into each target language, with its tag, for a model of several)."""
    sentence = EXAMPLE_SOURCES.get(checkpoint.src_lang, "<a sentence>")
    beam = checkpoint.search.beam_size  # the checkpoint's search, as translate.py's
    tags = checkpoint.target_tags
    if tags:  # the target language's tag before the source, as translate.py --target-lang puts it
        first = sorted(tags)[0]
        head = (
            f'tags = json.load(open(f"{{model_dir}}/{TAGS_FILE}"))  # {tags}\n'
            f'sentences = [tags[{first!r}] + " " + {sentence!r}]  # into {first}; any of {sorted(tags)}\n'
        )
        imports = "import json\n"
    else:
        head, imports = f"sentences = [{sentence!r}]\n", ""
    if fmt == "ctranslate2":
        return f"""
{imports}import ctranslate2
import sentencepiece as spm

model_dir = "{name}"
translator = ctranslate2.Translator(model_dir, device="cpu")  # computes in the exported weights' type
source = spm.SentencePieceProcessor(model_file=f"{{model_dir}}/source.spm")
target = spm.SentencePieceProcessor(model_file=f"{{model_dir}}/target.spm")
{head}results = translator.translate_batch(source.encode(sentences, out_type=str), beam_size={beam})
print([target.decode(r.hypotheses[0]) for r in results])
"""
    return f"""
{imports}from transformers import MarianMTModel, MarianTokenizer

model_dir = "{name}"  # or its hub id once uploaded
tokenizer = MarianTokenizer.from_pretrained(model_dir)
model = MarianMTModel.from_pretrained(model_dir)
{head}batch = tokenizer(sentences, return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch, num_beams={beam}), skip_special_tokens=True))
"""


def non_softmax_attention(checkpoint: InferenceCheckpoint) -> str:
    """Why the model's attention has no CTranslate2 or Marian equivalent; '' for softmax everywhere."""
    attention = checkpoint.model.cfg.attention
    others = [f"{role}={getattr(attention, role)}" for role in ROLES if getattr(attention, role) != "softmax"]
    if not others:
        return ""
    return f"its attention is not softmax ({', '.join(others)}) and CTranslate2 and Marian have softmax only"


def write_export(checkpoint: InferenceCheckpoint, fmt: str, directory: Path, quantization: str) -> None:
    """The model, its SentencePiece models and, for a model of several target languages, their
    tags (``target_tags.json``), in ``directory`` (the card is written after)."""
    if checkpoint.target_tags:
        (directory / TAGS_FILE).write_text(
            json.dumps(checkpoint.target_tags, indent=2, sort_keys=True) + "\n"
        )
    if fmt == "ctranslate2":
        from translation.export.ctranslate2 import to_ctranslate2

        src, tgt = checkpoint.src_tokenizer, checkpoint.tgt_tokenizer
        to_ctranslate2(
            checkpoint.model,
            directory,
            src.id_to_piece(range(src.vocab_size)),
            tgt.id_to_piece(range(tgt.vocab_size)),
            quantization,
        )
        (directory / "source.spm").write_bytes(src.model_proto)
        (directory / "target.spm").write_bytes(tgt.model_proto)
    else:
        from transformers.utils import logging as hf_logging

        from translation.export.huggingface import write_huggingface

        hf_logging.disable_progress_bar()
        write_huggingface(checkpoint, directory)


def run(args: argparse.Namespace) -> Path:
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise ExportError(f"--output {output}: exists and is not a folder")
    if output.is_dir() and any(output.iterdir()) and not args.force:
        raise ExportError(f"--output {output}: exists and is not empty; --force replaces it")
    check_extra(args.format)  # before reading the checkpoint, which takes longer
    checkpoint = load_checkpoint(args.checkpoint)
    reason = non_softmax_attention(checkpoint)
    if reason:
        raise ExportError(f"cannot export to {args.format}: {reason}")
    if args.format == "huggingface":
        from translation.export.huggingface import unsupported

        reason = unsupported(checkpoint.model)
        if reason:
            raise ExportError(f"cannot export to huggingface: {reason}; --format ctranslate2 can")
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        quantization = args.quantization or "float32"
        write_export(checkpoint, args.format, staging, quantization)
        snippet = usage(args.format, checkpoint, output.name)
        facts = card_facts(args.checkpoint, checkpoint.data)  # the file read once
        card = model_card(checkpoint, facts, args.format, snippet, quantization)
        (staging / "README.md").write_text(card, encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the export is not
        if output.exists():
            shutil.rmtree(output)
        staging.rename(output)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return output


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0, or 2 for a one-line error)."""
    args = build_parser().parse_args(argv)
    if args.quantization and args.format != "ctranslate2":
        build_parser().error("--quantization is for --format ctranslate2")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        output = run(args)
    except (CheckpointError, ExportError) as err:
        what = "checkpoint " if isinstance(err, CheckpointError) else ""
        sys.stderr.write(f"{PROG}: error: {what}{' '.join(str(err).split())}\n")
        return 2
    files = sorted(output.iterdir())
    size = sum(f.stat().st_size for f in files) / 2**20
    logger.info("wrote %s (%.1f MiB): %s", output, size, ", ".join(f.name for f in files))
    logger.info("usage: %s", output / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
