"""The checkpoint contract: what training writes, what inference reads, and clear errors otherwise."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from common.checkpoint_fields import inference_fields
from tests.toy_text import LEXICON, train_word_spm
from tests.transformer.helpers import tiny_model
from transformer import Transformer
from translation import Translator
from translation.checkpoint import CheckpointError, read_checkpoint, write_checkpoint

SRC_TEXT = [" ".join(LEXICON)]
TGT_TEXT = [" ".join(LEXICON.values())]
SENTENCES = ["ein hund läuft", "der mann", "ein", "katze"]


@pytest.fixture(scope="module")
def protos() -> dict[str, bytes]:
    return {"src": train_word_spm(SRC_TEXT), "tgt": train_word_spm(TGT_TEXT)}


def vocab_size(proto: bytes) -> int:
    return spm.SentencePieceProcessor(model_proto=proto).get_piece_size()


def model_for(src: bytes, tgt: bytes, **overrides) -> Transformer:
    return tiny_model(src_vocab_size=vocab_size(src), tgt_vocab_size=vocab_size(tgt), **overrides)


@pytest.fixture
def good(tmp_path: Path, protos: dict[str, bytes]) -> Path:
    model = model_for(protos["src"], protos["tgt"])
    fields = inference_fields(protos["src"], protos["tgt"], "de", "en")
    return write_checkpoint(tmp_path / "good.ckpt", model, fields, {"label_smoothing": 0.1})


def test_checkpoint_follows_the_contract(good: Path, protos: dict[str, bytes]) -> None:
    checkpoint = torch.load(good, map_location="cpu", weights_only=True)
    assert set(checkpoint) == {"state_dict", "hyper_parameters", "nmt"}
    assert all(key.startswith("model.") for key in checkpoint["state_dict"])
    # Tied weights appear under each of their names.
    assert "model.output.weight" in checkpoint["state_dict"]
    assert "model.tgt_embed.table.weight" in checkpoint["state_dict"]
    assert checkpoint["hyper_parameters"]["label_smoothing"] == 0.1
    assert checkpoint["hyper_parameters"]["model"]["d_model"] == 32
    assert checkpoint["nmt"] == {
        "format_version": 1,
        "src_lang": "de",
        "tgt_lang": "en",
        "src_spm": protos["src"],
        "tgt_spm": protos["tgt"],
        "target_tags": {},
        "pad_id": 0,
        "unk_id": 1,
        "bos_id": 2,
        "eos_id": 3,
    }


def test_a_failed_write_leaves_the_previous_checkpoint(good: Path, protos: dict[str, bytes]) -> None:
    before = good.read_bytes()
    previous = Translator.from_checkpoint(good, "cpu")
    translations = previous.translate(SENTENCES, beam_size=2)
    model = model_for(protos["src"], protos["tgt"])
    # The model whose write fails translates otherwise: a file it overwrote would show.
    other = Translator(model, previous.src_tokenizer, previous.tgt_tokenizer, 2, 3, torch.device("cpu"))
    assert other.translate(SENTENCES, beam_size=2) != translations
    fields = inference_fields(protos["src"], protos["tgt"], "de", "en")
    # torch.save stops midway: a hyperparameter it cannot pickle.
    with pytest.raises(Exception, match="lambda|pickle"):
        write_checkpoint(good, model, fields, {"not_plain": lambda: None})
    assert good.read_bytes() == before
    assert sorted(p.name for p in good.parent.iterdir()) == [good.name]
    # Still usable, as it was: the same weights, the same translations.
    reloaded = Translator.from_checkpoint(good, "cpu")
    for key, value in reloaded.model.state_dict().items():
        assert torch.equal(value, previous.model.state_dict()[key]), key
    assert reloaded.translate(SENTENCES, beam_size=2) == translations


def test_from_checkpoint_restores_model_and_tokenizers(good: Path) -> None:
    saved = torch.load(good, map_location="cpu", weights_only=True)
    translator = Translator.from_checkpoint(good, "cpu")
    assert not translator.model.training
    assert translator.model.cfg.to_dict() == saved["hyper_parameters"]["model"]
    for key, value in translator.model.state_dict().items():
        assert torch.equal(value, saved["state_dict"]["model." + key]), key
    assert (translator.bos_id, translator.eos_id, translator.pad_id) == (2, 3, 0)
    assert (translator.src_lang, translator.tgt_lang) == ("de", "en")
    assert translator.src_tokenizer.decode(translator.src_tokenizer.encode(["ein hund"])) == ["ein hund"]
    assert translator.tgt_tokenizer.decode(translator.tgt_tokenizer.encode(["a dog"])) == ["a dog"]
    assert translator.src_tokenizer.encode(["dog"]) == [[1]]  # separate vocabularies: unknown


@pytest.mark.parametrize(
    "attention",
    [{"encoder_self": "performer", "decoder_self": "linear", "cross": "performer", "features": 8},
     {"encoder_self": "sparse", "decoder_self": "atrous", "window": 2, "stride": 3}],
    ids=["performer-linear", "sparse-atrous"],
)  # fmt: skip
def test_a_checkpoint_with_other_attention_translates_as_it_was_saved(
    attention: dict, tmp_path: Path, protos: dict[str, bytes]
) -> None:
    model = model_for(protos["src"], protos["tgt"], attention=attention)
    fields = inference_fields(protos["src"], protos["tgt"], "de", "en")
    path = write_checkpoint(tmp_path / "other.ckpt", model, fields)
    translator = Translator.from_checkpoint(path, "cpu")
    assert translator.model.cfg == model.cfg  # the mechanisms, and the Performer's features (a buffer)
    for key, value in translator.model.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    assert translator.translate(["ein hund läuft"], beam_size=2) == Translator(
        model, translator.src_tokenizer, translator.tgt_tokenizer, 2, 3, torch.device("cpu")
    ).translate(["ein hund läuft"], beam_size=2)


def test_a_checkpoint_from_before_attention_was_a_setting_loads_as_softmax(
    good: Path, tmp_path: Path
) -> None:
    changed = _rewrite(good, tmp_path, lambda c: c["hyper_parameters"]["model"].pop("attention"))
    assert Translator.from_checkpoint(changed, "cpu").model.cfg.attention.is_softmax


def test_joint_vocabulary_is_stored_once(tmp_path: Path, protos: dict[str, bytes]) -> None:
    joint = train_word_spm(SRC_TEXT + TGT_TEXT)
    model = model_for(joint, joint, share_embeddings=True)
    # The same bytes for the target are stored as None: "joint, use src_spm".
    fields = inference_fields(joint, joint, "de", "en")
    assert fields["tgt_spm"] is None
    path = write_checkpoint(tmp_path / "joint.ckpt", model, fields)
    translator = Translator.from_checkpoint(path)
    assert translator.tgt_tokenizer is translator.src_tokenizer
    assert translator.model.src_embed is translator.model.tgt_embed


def test_training_checkpoint_extras_are_ignored(good: Path, tmp_path: Path) -> None:
    # What Lightning adds (loop and optimizer state) and weights outside the model do not matter.
    checkpoint = torch.load(good, map_location="cpu", weights_only=True)
    checkpoint.update(
        epoch=3, global_step=1000, optimizer_states=[{"state": {0: {"exp_avg": torch.ones(2)}}}]
    )
    checkpoint["state_dict"]["criterion.weight"] = torch.ones(3)
    torch.save(checkpoint, tmp_path / "lightning.ckpt")
    with_extras = Translator.from_checkpoint(tmp_path / "lightning.ckpt", "cpu")
    plain = Translator.from_checkpoint(good, "cpu")
    assert with_extras.model.cfg == plain.model.cfg
    assert with_extras.model.state_dict().keys() == plain.model.state_dict().keys()  # no criterion.weight
    for key, value in with_extras.model.state_dict().items():
        assert torch.equal(value, plain.model.state_dict()[key]), key
    assert with_extras.translate(SENTENCES, beam_size=2) == plain.translate(SENTENCES, beam_size=2)


def _rewrite(good: Path, tmp_path: Path, change: Callable[[dict], None]) -> Path:
    checkpoint = torch.load(good, map_location="cpu", weights_only=True)
    change(checkpoint)
    torch.save(checkpoint, tmp_path / "changed.ckpt")
    return tmp_path / "changed.ckpt"


def _set(*keys_and_value: object) -> Callable[[dict], None]:
    """A change that sets ``checkpoint[k1][k2]... = value``."""
    *keys, last, value = keys_and_value

    def change(checkpoint: dict) -> None:
        for key in keys:
            checkpoint = checkpoint[key]
        checkpoint[last] = value

    return change


BROKEN: dict[str, tuple[Callable[[dict], None], str]] = {
    "no nmt entry": (lambda c: c.pop("nmt"), "not a checkpoint of this project (no 'nmt' entry)"),
    "no state_dict": (lambda c: c.pop("state_dict"), "no 'state_dict' entry"),
    "empty dict": (lambda c: c.clear(), "no 'state_dict' or 'nmt' entry"),
    "future format": (_set("nmt", "format_version", 2), "format_version 2 is not supported"),
    "no config": (lambda c: c.pop("hyper_parameters"), "no model configuration"),
    "bad config": (_set("hyper_parameters", "model", "n_heads", 5), "invalid model configuration"),
    "missing weight": (
        lambda c: c["state_dict"].pop("model.encoder.layers.0.ffn.linear1.weight"),
        "the weights do not fit the model configuration: 1 missing: encoder.layers.0.ffn.linear1.weight",
    ),
    "wrong shape": (
        _set("hyper_parameters", "model", "d_ff", 48),
        "the weights do not fit the model configuration: 12 of another shape",
    ),
    "vocabulary size": (_set("hyper_parameters", "model", "tgt_vocab_size", 99), "the target tokenizer has"),
    "tokenizer not bytes": (_set("nmt", "src_spm", "src.model"), "the source tokenizer is a str"),
    "bad tokenizer": (_set("nmt", "src_spm", b"garbage"), "source tokenizer: not a SentencePiece model"),
    "no special ids": (lambda c: c["nmt"].pop("eos_id"), "incomplete 'nmt' entry"),
    "bad search": (
        _set("hyper_parameters", "decoding", {"beam_size": 0, "valid_beam_size": 1}),
        "hyper_parameters['decoding']: beam_size must be at least 1",
    ),
    "search not a dict": (
        _set("hyper_parameters", "decoding", "beam"),
        "hyper_parameters['decoding'] is a str",
    ),
    "refused attention": (
        _set("hyper_parameters", "model", "attention", {"cross": "local"}),
        "invalid model configuration (attention.cross=local is not supported",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_checkpoints_raise_one_line_errors(case: str, good: Path, tmp_path: Path) -> None:
    change, phrase = BROKEN[case]
    path = _rewrite(good, tmp_path, change)
    with pytest.raises(CheckpointError) as error:
        Translator.from_checkpoint(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert phrase in message


def test_unreadable_files_raise_one_line_errors(good: Path, tmp_path: Path) -> None:
    data = good.read_bytes()
    (tmp_path / "half.ckpt").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.ckpt").write_bytes(b"")
    (tmp_path / "text.ckpt").write_text("hello\n")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    cases = {
        tmp_path / "missing.ckpt": "no such file",
        tmp_path: "not a file",
        tmp_path / "half.ckpt": "truncated or corrupted",
        tmp_path / "empty.ckpt": "not a PyTorch checkpoint",
        tmp_path / "text.ckpt": "not a PyTorch checkpoint",
        tmp_path / "list.pt": "holds a list, not a checkpoint dict",
    }
    for path, phrase in cases.items():
        with pytest.raises(CheckpointError) as error:
            read_checkpoint(path)
        message = str(error.value)
        assert message.startswith(f"{path}: {phrase}") and "\n" not in message
