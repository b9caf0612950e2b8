"""The model card (``README.md``) that goes with an exported model, as Hugging Face hub pages show it.

What OPUS-MT and fairseq cards give: languages, the model's size, test scores, training data,
licence, and how to run it. What the checkpoint cannot tell is left as a ``<fill in: ...>``
placeholder for the user to replace before uploading.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from decoding.config import SearchSettings
from translation.checkpoint import InferenceCheckpoint, read_checkpoint

MULTI30K_HUB_ID = "bentrevett/multi30k"
MULTI30K_LICENSE = (
    "Multi30k (Elliott et al., 2016) extends the Flickr30k image captions, which are distributed for "
    "non-commercial research and educational use only; a model trained on it inherits those terms. "
    "Check them before any other use."
)


@dataclass
class CardFacts:
    """What the card says beyond the model itself.

    Attributes:
        scores: test metric -> value, e.g. ``{"BLEU": 39.61}``; empty: a placeholder row.
        test_set: the scores' test set, e.g. ``"test_2016_flickr"``.
        data: the training corpus in words; "" for a placeholder.
        multi30k: the corpus is Multi30k (the card then states its licence terms).
    """

    scores: dict[str, float] = field(default_factory=dict)
    test_set: str = ""
    data: str = ""
    multi30k: bool = False


def _run_config(run_dir: Path) -> dict[str, Any]:
    try:
        return yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def card_facts(checkpoint_path: str | os.PathLike, data: dict | None = None) -> CardFacts:
    """Scores and training data of a checkpoint, from the checkpoint and the run beside it.

    Training writes ``<run>/checkpoints/<name>.ckpt`` and, after its test stage,
    ``<run>/results.json`` for the checkpoint named by ``test_ckpt`` in ``<run>/config.yaml``
    (``averaged``, ``best`` or ``last``). The scores are taken only when they are this
    checkpoint's. The corpus comes from the checkpoint's data-module hyperparameters: ``data``,
    those of the checkpoint already read (``InferenceCheckpoint.data``), or read here.
    """
    path = Path(checkpoint_path)
    facts = CardFacts()
    if data is None:
        data = read_checkpoint(path).get("datamodule_hyper_parameters") or {}
    hub_id, data_dir = data.get("hub_id"), data.get("data_dir")
    test_split = data.get("test_split") or ""
    if hub_id:
        facts.data = f"`{hub_id}` on the Hugging Face hub"
    elif data_dir:
        facts.data = f"the files in `{Path(data_dir).name}/`"
    facts.multi30k = (
        hub_id == MULTI30K_HUB_ID or "multi30k" in str(data_dir).lower() or test_split.startswith("test_2016")
    )
    if facts.multi30k:
        source = f" (read from {facts.data})" if facts.data else ""
        facts.data = f"Multi30k (Elliott et al., 2016), its 29,000 training sentence pairs{source}."
    run_dir = path.resolve().parent.parent
    tested = str(_run_config(run_dir).get("test_ckpt") or "")
    results_file = run_dir / "results.json"
    if tested and (path.stem == tested or path.stem.startswith(f"{tested}-")) and results_file.is_file():
        try:
            results = json.loads(results_file.read_text())
        except (OSError, ValueError):
            results = {}
        names = {"test/bleu": "BLEU", "test/chrf": "chrF"}
        facts.scores = {name: float(results[key]) for key, name in names.items() if key in results}
        facts.test_set = test_split
    return facts


def target_languages(checkpoint: InferenceCheckpoint) -> list[str]:
    """Every language the model translates into: its target tags' (a model of several), else its one."""
    return sorted(checkpoint.target_tags) or [lang for lang in [checkpoint.tgt_lang] if lang]


def _front_matter(checkpoint: InferenceCheckpoint, facts: CardFacts, library: str) -> str:
    langs = list(
        dict.fromkeys([*[checkpoint.src_lang] * bool(checkpoint.src_lang), *target_languages(checkpoint)])
    )
    lines = ["---", "language:", *[f"- {lang}" for lang in langs]]
    lines += ["license: other" if facts.multi30k else "license: <fill in>", f"library_name: {library}"]
    lines += ["pipeline_tag: translation", "tags:", "- translation", "- nmt-transformer"]
    if library == "transformers":
        lines.append("- marian")
    if facts.multi30k:
        lines += ["datasets:", f"- {MULTI30K_HUB_ID}"]
    lines += ["metrics:", "- bleu", "- chrf", "---"]
    return "\n".join(lines)


def model_card(
    checkpoint: InferenceCheckpoint, facts: CardFacts, fmt: str, usage: str, quantization: str = "float32"
) -> str:
    """The ``README.md`` text.

    Args:
        checkpoint: the exported checkpoint (languages, sizes).
        facts: from :func:`card_facts`.
        fmt: ``"ctranslate2"`` or ``"huggingface"``.
        usage: a Python snippet that loads and runs the export.
        quantization: the exported weights' type.
    """
    cfg = checkpoint.model.cfg
    src, tgt = checkpoint.src_lang or "<source>", ", ".join(target_languages(checkpoint)) or "<target>"
    library = "ctranslate2" if fmt == "ctranslate2" else "transformers"
    fidelity = (
        "Its greedy outputs are those of the original checkpoint (`translate.py --greedy`)."
        if quantization == "float32"
        else f"Weights stored as {quantization}: outputs may differ a little from the original's."
    )
    languages, vocab = _languages_note(checkpoint), _vocabulary(checkpoint)
    scores = _results(facts, checkpoint.search)
    licence = (
        MULTI30K_LICENSE
        if facts.multi30k
        else "<fill in: the licence of the weights and of the training data>"
    )
    return f"""{_front_matter(checkpoint, facts, library)}

# {src}→{tgt} Transformer ({library})

An encoder-decoder Transformer (Vaswani et al., 2017) trained with nmt-transformer and exported
with `python3 -m translation.export --format {fmt}`. {checkpoint.model.num_parameters():,} parameters:
d_model {cfg.d_model}, {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers, {cfg.n_heads} heads, \
feed-forward {cfg.d_ff}, {"pre-LN" if cfg.norm_first else "post-LN"}; {vocab} (`source.spm`, `target.spm`).
{fidelity}{languages}

## Results

{scores}

## Usage

```python
{usage.strip()}
```

## Training data

{facts.data or "<fill in: the corpus, its size and its preprocessing>"}

## Licence

{licence}
"""


def _languages_note(checkpoint: InferenceCheckpoint) -> str:
    """For a model of several target languages, how to ask for one; else ""."""
    tags = checkpoint.target_tags
    if not tags:
        return ""
    return (
        "\n\nOne model for several target languages: each source starts with its target language's "
        "tag and a space, "
        + ", ".join(f"`{tag}` for {lang}" for lang, tag in sorted(tags.items()))
        + " (`target_tags.json`; `translate.py --target-lang` puts it there)."
    )


def _vocabulary(checkpoint: InferenceCheckpoint) -> str:
    """The SentencePiece vocabularies, in words."""
    cfg = checkpoint.model.cfg
    if checkpoint.src_tokenizer is checkpoint.tgt_tokenizer:
        return f"one joint SentencePiece vocabulary of {cfg.tgt_vocab_size} pieces"
    return (
        f"SentencePiece vocabularies of {cfg.src_vocab_size} (source) and {cfg.tgt_vocab_size} "
        "(target) pieces"
    )


def _search(search: SearchSettings) -> str:
    """The checkpoint's search in words, and how the exported model's libraries differ from it."""
    limits = f"at most {search.max_len_a:g} x source pieces + {search.max_len_b} output pieces"
    return (
        f"beam {search.beam_size}, GNMT length penalty {search.alpha:g} (log P / ((5 + |y|) / 6) ** "
        f"{search.alpha:g}), {limits}: the checkpoint's search (its test stage's), which "
        "`translate.py` runs on it by default. CTranslate2's and transformers' `length_penalty` "
        "divides by |y| ** p instead, so their beam search picks a little differently; the snippet "
        "below uses the same beam size."
    )


def _results(facts: CardFacts, search: SearchSettings) -> str:
    """The Results section: the run's test scores and the search that gave them, or a table to fill in."""
    if not facts.scores:
        return (
            "| test set | BLEU | chrF |\n|---|---|---|\n| <fill in> | <fill in> | <fill in> |\n\n"
            "<fill in: e.g. the output of `python3 translate.py --checkpoint CKPT --input TEST.src "
            "--references TEST.ref`>\n\n"
            f"With {_search(search)}"
        )
    header = " | ".join(facts.scores)
    return (
        f"| test set | {header} |\n|---|{'---|' * len(facts.scores)}\n"
        f"| {facts.test_set or '<fill in>'} | "
        + " | ".join(f"{value:.2f}" for value in facts.scores.values())
        + " |\n\nsacreBLEU on detokenized output, from the training run's test stage: "
        + _search(search)
    )
