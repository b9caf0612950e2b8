"""The Translator, on a random tiny model (properties, not goldens); its batches: test_batching.py."""

from __future__ import annotations

import logging

import pytest
import torch

import decoding.service as service_module
from bench.uncached import Recomputing
from common.checkpoint_fields import inference_fields
from data.lines import LINE_BREAKS
from data.tokenizer import SubwordTokenizer
from tests.toy_text import LEXICON, toy_pairs, train_word_spm
from tests.transformer.helpers import tiny_model
from translation.checkpoint import write_checkpoint
from translation.translator import SearchOptions, Translator, resolve_device

CPU = torch.device("cpu")

# ------------------------------------------------------------------------------- Translator


@pytest.fixture(scope="module")
def tokenizers() -> tuple[SubwordTokenizer, SubwordTokenizer]:
    pairs = toy_pairs(50, seed=0)
    src = SubwordTokenizer(train_word_spm([s for s, _ in pairs]))
    tgt = SubwordTokenizer(train_word_spm([t for _, t in pairs]))
    return src, tgt


def make_translator(tokenizers, **overrides) -> Translator:
    src, tgt = tokenizers
    torch.manual_seed(0)
    model = tiny_model(
        src_vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size, max_positions=16, **overrides
    )
    return Translator(model, src, tgt, bos_id=2, eos_id=3, device=torch.device("cpu"))


TEXTS = [s for s, _ in toy_pairs(12, seed=3)] + ["", "   ", "hund"]


def tokens(results) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in results]


def test_batching_does_not_change_translations(tokenizers) -> None:
    translator = make_translator(tokenizers)
    sources = translator.encode_sources(TEXTS)
    options = SearchOptions(beam_size=3, nbest=3)
    one_by_one = translator.translate_ids(sources, options, max_tokens=1)
    all_at_once = translator.translate_ids(sources, options, max_tokens=10_000)
    assert tokens(one_by_one) == tokens(all_at_once)
    for a, b in zip(one_by_one, all_at_once, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_cached_equals_recomputed_and_beam1_equals_greedy(
    tokenizers, monkeypatch: pytest.MonkeyPatch
) -> None:
    translator = make_translator(tokenizers, norm_first=True)
    sources = translator.encode_sources(TEXTS)
    for options in (SearchOptions(beam_size=3, nbest=2), SearchOptions(greedy=True)):
        cached = translator.translate_ids(sources, options)
        with monkeypatch.context() as patch:  # the same translator, its model searched without caches
            patch.setattr(translator, "model", Recomputing(translator.model))
            assert tokens(cached) == tokens(translator.translate_ids(sources, options))
    beam1 = translator.translate_ids(sources, SearchOptions(beam_size=1), max_tokens=20)
    greedy = translator.translate_ids(sources, SearchOptions(greedy=True), max_tokens=50)
    assert tokens(beam1) == tokens(greedy)


def test_nbest_is_sorted_and_in_input_order(tokenizers) -> None:
    translator = make_translator(tokenizers)
    sources = translator.encode_sources(TEXTS)
    results = translator.translate_ids(sources, SearchOptions(beam_size=4, nbest=3), max_tokens=8)
    for source, hyps in zip(sources, results, strict=True):
        if not source:
            assert hyps == []
            continue
        assert 1 <= len(hyps) <= 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        # In input order: the sentence alone gives the same best output.
        alone = translator.translate_ids([source], SearchOptions(beam_size=4, nbest=3))
        assert alone[0][0].tokens == hyps[0].tokens


@pytest.mark.parametrize("options", [SearchOptions(beam_size=4), SearchOptions(greedy=True)])
def test_batches_keep_the_budget_of_hypothesis_tokens(
    tokenizers, options: SearchOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sentences x hypotheses per sentence x padded width <= max_tokens: the decoder's rows are bounded."""
    translator = make_translator(tokenizers)
    shapes: list[tuple[int, int]] = []
    search = service_module.search_batch

    def recording(model: torch.nn.Module, job: tuple):
        shapes.append(tuple(job[0].shape))
        return search(model, job)

    monkeypatch.setattr(service_module, "search_batch", recording)
    sources = translator.encode_sources(TEXTS)
    hypotheses = 1 if options.greedy else options.beam_size
    budget = 4 * 8 * hypotheses  # about four sentences of the toy's widths per batch
    translator.translate_ids(sources, options, max_tokens=budget)
    assert sum(n for n, _ in shapes) == sum(1 for s in sources if s)
    assert len(shapes) > 1
    for n, width in shapes:
        assert n == 1 or n * hypotheses * width <= budget


def test_empty_lines_never_reach_the_model(tokenizers, monkeypatch: pytest.MonkeyPatch) -> None:
    translator = make_translator(tokenizers)
    seen: list[int] = []
    search = service_module.search_batch

    def counting(model: torch.nn.Module, job: tuple):
        seen.append(job[0].size(0))
        return search(model, job)

    monkeypatch.setattr(service_module, "search_batch", counting)
    assert translator.translate(["", " \t ", "\x0c\u2028"], SearchOptions(greedy=True)) == ["", "", ""]
    assert seen == []
    out = translator.translate(["", "hund", "  "], SearchOptions(greedy=True))
    assert out[0] == out[2] == "" and seen == [1]


def test_long_lines_are_cropped_with_a_warning(tokenizers, caplog: pytest.LogCaptureFixture) -> None:
    translator = make_translator(tokenizers)
    assert translator.max_source_tokens == 15
    long_line = " ".join(["hund"] * 40)
    with caplog.at_level(logging.WARNING):
        sources = translator.encode_sources(["hund", long_line], name="in.txt")
    assert [len(s) for s in sources] == [1, 15]
    assert "in.txt line 2: 40 subword tokens, cropped to the first 15" in caplog.text
    results = translator.translate_ids(sources, SearchOptions(beam_size=2))
    assert all(len(hyps) == 1 for hyps in results)


class LineBreakingTokenizer:
    """A target tokenizer whose detokenized text holds every kind of line break."""

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[4] for _ in texts]

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [" x" + "y".join(LINE_BREAKS) + "z " for _ in ids]

    def id_to_piece(self, ids: list[int]) -> list[str]:
        return ["x" for _ in ids]


def test_output_is_always_one_line(tokenizers) -> None:
    src, _ = tokenizers
    model = tiny_model(src_vocab_size=src.vocab_size, tgt_vocab_size=30)
    translator = Translator(
        model, src, LineBreakingTokenizer(), bos_id=2, eos_id=3, device=torch.device("cpu")
    )
    (text,) = translator.translate(["hund"], SearchOptions(greedy=True, max_len_b=2))
    assert text.splitlines() == [text] and "\n" not in text and "\r" not in text
    assert text.startswith("x") and text.endswith("z")


def test_cross_attention_shapes(tokenizers) -> None:
    translator = make_translator(tokenizers)
    (source,) = translator.encode_sources(["ein hund läuft"])
    (hyps,) = translator.translate_ids([source], SearchOptions(greedy=True, max_len_b=3))
    weights = translator.cross_attention(source, hyps[0].tokens)
    assert len(weights) == 2  # decoder layers
    for w in weights:
        assert w.shape == (4, len(hyps[0].tokens) + 1, len(source) + 1)
        torch.testing.assert_close(w.sum(dim=-1), torch.ones(w.shape[:2]))


def test_python_api_from_checkpoint_in_three_lines(tokenizers, tmp_path) -> None:
    """README's Python API: one output per input, in order, search settings as keywords."""
    src, tgt = tokenizers
    model = make_translator(tokenizers).model
    path = write_checkpoint(
        tmp_path / "toy.ckpt", model, inference_fields(src.model_proto, tgt.model_proto, "de", "en")
    )

    translator = Translator.from_checkpoint(path, device="cpu")
    outputs = translator.translate(TEXTS, beam_size=3)

    assert outputs == translator.translate(TEXTS, SearchOptions(beam_size=3))
    assert len(outputs) == len(TEXTS) and outputs[TEXTS.index("")] == outputs[TEXTS.index("   ")] == ""
    assert outputs[::-1] == translator.translate(TEXTS[::-1], beam_size=3)  # in input order
    # Keywords override the options they are given with.
    greedy = translator.translate(TEXTS, SearchOptions(greedy=True))
    assert translator.translate(TEXTS, SearchOptions(beam_size=3), greedy=True) == greedy
    with pytest.raises(TypeError, match="beam"):
        translator.translate(TEXTS, beam=3)
    with pytest.raises(ValueError, match="beam_size"):
        translator.translate(TEXTS, beam_size=0)


def test_search_options_are_checked() -> None:
    with pytest.raises(ValueError, match="nbest=3"):
        SearchOptions(beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="beam_size"):
        SearchOptions(beam_size=0)
    with pytest.raises(ValueError, match="nbest"):
        SearchOptions(greedy=True, nbest=2)


def test_tokenizer_refuses_other_special_ids() -> None:
    with pytest.raises(ValueError, match="pad/unk/bos/eos ids"):
        SubwordTokenizer(train_word_spm(list(LEXICON), project_ids=False))
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        SubwordTokenizer(b"\x00garbage")


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a device"):
        resolve_device("gpu-please")
    with pytest.raises(ValueError, match="only cpu, cuda and mps"):
        resolve_device("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_a_model_of_several_target_languages_is_asked_for_one_and_tags_each_line(tmp_path) -> None:
    pairs = toy_pairs(50, seed=0)
    src = SubwordTokenizer(train_word_spm([s for s, _ in pairs] + ["<2de> <2fr>"]))  # tags: one word each
    tgt = SubwordTokenizer(train_word_spm([t for _, t in pairs]))
    model = make_translator((src, tgt)).model
    tags = {"de": "<2de>", "fr": "<2fr>"}
    path = write_checkpoint(
        tmp_path / "multi.ckpt", model, inference_fields(src.model_proto, tgt.model_proto, "en", "de", tags)
    )
    with pytest.raises(ValueError, match=r"this model translates into de, fr: say which \(--target-lang"):
        Translator.from_checkpoint(path)
    with pytest.raises(ValueError, match="not trained to translate into es, only into de, fr"):
        Translator.from_checkpoint(path, target_lang="es")
    translator = Translator.from_checkpoint(path, target_lang="fr")
    assert translator.tgt_lang == "fr"
    ids = translator.encode_sources(["hund", "", "  "])
    assert ids == [src.encode(["<2fr> hund"])[0], [], []]  # an empty line stays empty: no output
    assert src.id_to_piece(ids[0][:1]) == ["\u2581<2fr>"]
    assert len(translator.translate(["hund", ""], beam_size=2)) == 2
    # A model of one language takes that language and refuses another.
    one = write_checkpoint(
        tmp_path / "one.ckpt", model, inference_fields(src.model_proto, tgt.model_proto, "en", "de")
    )
    assert Translator.from_checkpoint(one, target_lang="de").encode_sources(["hund"]) == src.encode(["hund"])
    with pytest.raises(ValueError, match="this model translates into de only, not fr"):
        Translator.from_checkpoint(one, target_lang="fr")
