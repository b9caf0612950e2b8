"""SentencePiece: special ids, train / save / load round trip, content-keyed caches."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
import sentencepiece as spm

from data import spm_training
from data.spm_training import train_or_load_sentencepiece, train_sentencepiece
from data.subword_models import TokenizerSettings, train_or_load_tokenizers
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordTokenizer, load_run_tokenizers
from tests.data.conftest import VOCAB


def _forbid_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("SentencePiece was trained although a cached model exists")

    monkeypatch.setattr(spm_training, "train_sentencepiece", fail)


def test_special_ids_agree_with_model(joint: SubwordTokenizer) -> None:
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    sp = joint.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert joint.vocab_size == VOCAB


def test_encode_decode_pieces(joint: SubwordTokenizer, pairs: list[tuple[str, str]]) -> None:
    texts = [s for s, _ in pairs[:20]]
    ids = joint.encode(texts)
    assert all(i not in (PAD_ID, BOS_ID, EOS_ID) for seq in ids for i in seq)
    assert joint.decode(ids) == texts
    # PAD, BOS and EOS are skipped wherever they are.
    noisy = [[BOS_ID, *seq, EOS_ID, PAD_ID, PAD_ID] for seq in ids]
    assert joint.decode(noisy) == texts
    pieces = joint.pieces(texts[0])
    assert "".join(pieces).replace("\u2581", " ").strip() == texts[0]
    assert len(pieces) == len(ids[0])


def test_save_load_and_pickle_round_trip(joint: SubwordTokenizer, tmp_path: Path) -> None:
    path = joint.save(tmp_path / "m" / "joint.model")
    assert path.is_file() and path.with_suffix(".vocab").is_file()
    loaded = SubwordTokenizer.load(path)
    text = ["der hund springt über die straße ."]
    assert loaded.encode(text) == joint.encode(text)
    assert loaded.fingerprint == joint.fingerprint
    clone = pickle.loads(pickle.dumps(joint))
    assert clone.encode(text) == joint.encode(text)


def test_model_with_other_special_ids_is_refused(pairs: list[tuple[str, str]]) -> None:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([s for s, _ in pairs]), model_writer=model, vocab_size=40
    )  # SentencePiece's own defaults: unk=0, bos=1, eos=2, no pad
    with pytest.raises(ValueError, match="pad/unk/bos/eos ids"):
        SubwordTokenizer(model.getvalue())


def test_too_small_text_for_vocab_gives_a_hint(pairs: list[tuple[str, str]]) -> None:
    with pytest.raises(RuntimeError, match="lower vocab_size"):
        train_sentencepiece([s for s, _ in pairs[:10]], vocab_size=5000)


def test_cache_is_keyed_by_content_and_settings(
    pairs: list[tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = [s for s, _ in pairs]
    first = train_or_load_sentencepiece([src], tmp_path, VOCAB)
    assert len(list((tmp_path / "spm").glob("*.model"))) == 1

    with monkeypatch.context() as m:
        _forbid_training(m)
        # Same content from another object (as from another path): reused, not retrained.
        again = train_or_load_sentencepiece([list(src)], tmp_path, VOCAB)
        assert again.fingerprint == first.fingerprint
        # The same sentences arriving in two parts (source + target for a joint model).
        again = train_or_load_sentencepiece([src[:100], src[100:]], tmp_path, VOCAB)
        assert again.fingerprint == first.fingerprint

    train_or_load_sentencepiece([src], tmp_path, VOCAB, model_type="bpe")
    train_or_load_sentencepiece([src[:-1]], tmp_path, VOCAB)
    assert len(list((tmp_path / "spm").glob("*.model"))) == 3


def test_joint_and_separate_models_copied_to_run_dir(
    pairs: list[tuple[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    cache = tmp_path / "cache"
    one_model, per_side = (
        TokenizerSettings(vocab_size=VOCAB),
        TokenizerSettings(joint_vocab=False, vocab_size=VOCAB),
    )
    s_tok, t_tok = train_or_load_tokenizers(src, tgt, one_model, cache, tmp_path / "run1")
    assert s_tok is t_tok
    assert (tmp_path / "run1" / "tokenizer" / "joint.model").is_file()
    s_run, t_run = load_run_tokenizers(tmp_path / "run1")
    assert s_run is t_run and s_run.fingerprint == s_tok.fingerprint

    s_tok, t_tok = train_or_load_tokenizers(src, tgt, per_side, cache, tmp_path / "run2")
    assert s_tok.fingerprint != t_tok.fingerprint
    s_run, t_run = load_run_tokenizers(tmp_path / "run2")
    assert (s_run.fingerprint, t_run.fingerprint) == (s_tok.fingerprint, t_tok.fingerprint)

    with monkeypatch.context() as m:  # a second run with the same corpus reuses all models
        _forbid_training(m)
        train_or_load_tokenizers(src, tgt, one_model, cache, tmp_path / "run3")
        train_or_load_tokenizers(src, tgt, per_side, cache, tmp_path / "run4")
    with pytest.raises(FileNotFoundError):
        load_run_tokenizers(tmp_path / "nothing")


def test_sentencepiece_sample_is_all_in_order_or_a_seeded_uniform_subset() -> None:
    import pyarrow as pa

    from data.spm_training import sample_sentences

    src = [f"quelle {i}" for i in range(500)]
    tgt = [f"target {i}" for i in range(300)]
    # Arrow columns in several chunks (as memory-mapped record batches), taken chunk by chunk.
    arrow = [pa.chunked_array([part[i : i + 64] for i in range(0, len(part), 64)]) for part in (src, tgt)]
    assert sample_sentences([src, tgt], 800) == sample_sentences(arrow, 800) == [src, tgt]  # all, in order
    picked = sample_sentences(arrow, 100, seed=3)
    assert picked == sample_sentences([src, tgt], 100, seed=3)  # lists and Arrow: the same sample
    assert picked == sample_sentences(arrow, 100, seed=3)  # reproducible
    assert sum(map(len, picked)) == 100 and picked != sample_sentences(arrow, 100, seed=4)
    for part, chosen in zip([src, tgt], picked, strict=True):
        positions = [part.index(t) for t in chosen]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)  # corpus order
