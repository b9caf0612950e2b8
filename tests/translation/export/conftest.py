"""Tiny checkpoints to export: random weights, word-level SentencePiece, joint and separate vocabularies.

The weights hardly matter: an export must compute the same function, whatever the function. A
few training steps make the outputs end with EOS; the tests also translate with a length limit of
2 tokens, so that both ways of stopping are compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from common.checkpoint_fields import inference_fields
from data.tokenizer import SubwordTokenizer
from tests.toy_text import toy_pairs, train_word_spm
from tests.transformer.helpers import BOS, EOS, PAD, tiny_model
from transformer import Transformer
from translation.checkpoint import write_checkpoint

MAX_POSITIONS = 24
STEPS = 40
# Sentences of the toy lexicon, an empty line and a word outside it (<unk>).
TEXTS = [s for s, _ in toy_pairs(14, seed=3)] + ["", "hund xyzzy läuft"]


def output_limit(n_source: int, a: float = 1.5, b: int = 10) -> int:
    """Our longest output for a source of ``n_source`` subwords (+ EOS) with ``max_len_a/b``."""
    return min(int(a * (n_source + 1) + b), MAX_POSITIONS - 1)


def train_briefly(
    model: Transformer, src_proto: bytes, tgt_proto: bytes, pairs: list[tuple[str, str]]
) -> None:
    """A few Adam steps on the toy task: enough for EOS to come, often, before the length limit."""
    src_tok, tgt_tok = SubwordTokenizer(src_proto), SubwordTokenizer(tgt_proto)
    src_ids = [ids + [EOS] for ids in src_tok.encode([s for s, _ in pairs])]
    tgt_ids = tgt_tok.encode([t for _, t in pairs])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(STEPS):
        batch = torch.randint(len(pairs), (32,), generator=generator).tolist()
        src = pad([src_ids[i] for i in batch])
        tgt_in = pad([[BOS] + tgt_ids[i] for i in batch])
        tgt_out = pad([tgt_ids[i] + [EOS] for i in batch])
        loss = F.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt_out, ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


@pytest.fixture(scope="session")
def toy_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"joint": path, "separate": path}``.

    joint: one SentencePiece model, shared embeddings tied to the output layer; separate: a
    model per language, separate embeddings and an untied output layer.
    """
    torch.set_num_threads(1)
    pairs = toy_pairs(200, seed=0)
    src = [s for s, _ in pairs]
    tgt = [t for _, t in pairs]
    protos = {
        "joint": (train_word_spm(src + tgt), None),
        "separate": (train_word_spm(src), train_word_spm(tgt)),
    }
    out = tmp_path_factory.mktemp("export_toys")
    paths = {}
    for name, (src_proto, tgt_proto) in protos.items():
        joint = tgt_proto is None
        src_size = SubwordTokenizer(src_proto).vocab_size
        tgt_size = src_size if joint else SubwordTokenizer(tgt_proto).vocab_size
        torch.manual_seed(4)
        model = tiny_model(
            src_vocab_size=src_size,
            tgt_vocab_size=tgt_size,
            share_embeddings=joint,
            tie_output=joint,
            max_positions=MAX_POSITIONS,
        )
        train_briefly(model, src_proto, tgt_proto or src_proto, pairs)
        fields = inference_fields(src_proto, tgt_proto, "de", "en")
        paths[name] = write_checkpoint(out / f"{name}.ckpt", model, fields)
    return paths


TAGS = {"de": "<2de>", "fr": "<2fr>"}


@pytest.fixture(scope="session")
def multilingual_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny en→{de,fr} checkpoint: one joint word-level vocabulary holding the tags ``<2de>`` and
    ``<2fr>``, each source tagged with its target language, trained briefly on both directions."""
    torch.set_num_threads(1)
    pairs = toy_pairs(200, seed=1)
    tagged = [(f"{TAGS['de']} {t}", s) for s, t in pairs[:100]] + [
        (f"{TAGS['fr']} {t}", t[::-1]) for _, t in pairs[100:]
    ]
    proto = train_word_spm([s for s, _ in tagged] + [t for _, t in tagged])
    size = SubwordTokenizer(proto).vocab_size
    torch.manual_seed(5)
    model = tiny_model(
        src_vocab_size=size,
        tgt_vocab_size=size,
        share_embeddings=True,
        tie_output=True,
        max_positions=MAX_POSITIONS,
    )
    train_briefly(model, proto, proto, tagged)
    fields = inference_fields(proto, None, "en", "de", target_tags=TAGS)
    return write_checkpoint(tmp_path_factory.mktemp("multilingual") / "en_defr.ckpt", model, fields)


def export_with_tags(
    checkpoint: Path, fmt: str, out: Path
) -> tuple[dict[str, str], list[str], dict[str, list[str]]]:
    """Exports a multilingual checkpoint to ``out`` by the command line and checks that the export
    records its tags (``target_tags.json``) and that the card lists every language and the tag.

    Returns:
        The tags by language, 8 source sentences, and per language our greedy translations of them
        (what the export must give with the language's tag before each source), which differ by
        language.
    """
    from translation import Translator
    from translation.export.__main__ import main

    assert main(["--checkpoint", str(checkpoint), "--format", fmt, "--output", str(out)]) == 0
    tags = json.loads((out / "target_tags.json").read_text())
    assert tags == TAGS
    card = (out / "README.md").read_text()
    assert "- de\n- fr" in card and "`<2de>` for de, `<2fr>` for fr" in card and "tags[" in card
    texts = [s for s, _ in toy_pairs(8, seed=9)]
    ours = {lang: Translator.from_checkpoint(checkpoint, target_lang=lang) for lang in tags}
    expected = {lang: translator.translate(texts, greedy=True) for lang, translator in ours.items()}
    assert expected["de"] != expected["fr"]  # the tag chooses the language
    return tags, texts, expected
