"""Word alignments (translation/alignment.py, ``Translator.align``, ``translate.py --alignment-output``).

A tiny model overfit on a copy task (each sentence of distinct words copied, half of them after a
target-language tag, ~5 s) must align each word with itself; the words and links of any output
are checked as properties over random subwords; the command line writes what the API returns.
"""

from __future__ import annotations

import io
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import translate
from common.checkpoint_fields import inference_fields
from data.lines import one_line
from data.tokenizer import SubwordTokenizer
from decoding.ensemble import Ensemble
from tests.toy_text import train_word_spm
from transformer import Transformer, TransformerConfig
from translation.alignment import encoded_words, format_alignment, hard_alignment, output_words, word_spans
from translation.checkpoint import write_checkpoint
from translation.translator import SearchOptions, Translator

ROOT = Path(__file__).resolve().parents[2]
GOLD = Path(__file__).parent / "data" / "alignment" / "de_en"
PAD, BOS, EOS = 0, 2, 3
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa"
WORDS = WORDS.split()
TAG = "<2en>"
STEPS = 500  # 300 left one word of 33 sentences linked to its neighbour
PROPS = settings(max_examples=80, deadline=None, database=None)


def sentence(rng: random.Random) -> str:
    """1 to 6 distinct words: a copy of it is aligned one way only."""
    return " ".join(rng.sample(WORDS, rng.randint(1, 6)))


def pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


@pytest.fixture(scope="module")
def copy_task() -> tuple[Transformer, SubwordTokenizer]:
    """A one-layer model trained to copy its source (every other one after the tag), ~5 s alone."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(0)
    lines = [sentence(rng) for _ in range(2000)]
    sources = [f"{TAG} {line}" if i % 2 else line for i, line in enumerate(lines)]
    tokenizer = SubwordTokenizer(train_word_spm(sources + lines))
    src_ids = [ids + [EOS] for ids in tokenizer.encode(sources)]
    tgt_ids = tokenizer.encode(lines)
    cfg = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=64,
        n_heads=4,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=128,
        dropout=0.0,
        max_positions=32,
    )
    model = Transformer(cfg)
    steps, peak_lr = STEPS, 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=peak_lr)
    for step in range(steps):
        batch = rng.sample(range(len(lines)), 64)
        src = pad([src_ids[i] for i in batch])
        tgt_in = pad([[BOS] + tgt_ids[i] for i in batch])
        tgt_out = pad([tgt_ids[i] + [EOS] for i in batch])
        loss = F.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt_out, ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for group in optimizer.param_groups:  # linear decay over the second half
            group["lr"] = peak_lr * min(1.0, 2.0 * (1 - (step + 1) / steps))
    return model.eval(), tokenizer


def translator_of(copy_task, tagged: bool = False, ensemble: bool = False) -> Translator:
    model, tokenizer = copy_task
    return Translator(
        Ensemble([model, model]) if ensemble else model,
        tokenizer,
        tokenizer,
        BOS,
        EOS,
        torch.device("cpu"),
        target_tags={"en": TAG, "fr": "<2fr>"} if tagged else None,
        target_lang="en" if tagged else None,
    )


HELD_OUT = [sentence(random.Random(i)) for i in range(7, 40)]
OPTIONS = [SearchOptions(greedy=True), SearchOptions(beam_size=3, nbest=2)]


@pytest.mark.parametrize("tagged", [False, True], ids=["plain", "target tag"])
@pytest.mark.parametrize("options", OPTIONS, ids=["greedy", "beam"])
def test_the_copy_task_aligns_each_word_with_itself(copy_task, tagged: bool, options: SearchOptions) -> None:
    """i-i; with a target-language tag before the source, too: the tag is no source word."""
    translator = translator_of(copy_task, tagged)
    results = translator.translate_ids(translator.encode_sources(HELD_OUT), options)
    aligned = translator.align(HELD_OUT, results)
    for text, hyps in zip(HELD_OUT, aligned, strict=True):
        assert hyps[0].text == text
        assert hyps[0].alignment == [(i, i) for i in range(len(text.split()))]


def test_aligning_changes_no_translation_and_empty_lines_have_none(copy_task) -> None:
    translator = translator_of(copy_task)
    texts = ["", *HELD_OUT[:5], "   ", "alpha bravo"]
    options = SearchOptions(beam_size=3, nbest=3)
    results = translator.translate_ids(translator.encode_sources(texts), options)
    aligned = translator.align(texts, results, layer=1, max_tokens=8)  # small batches
    assert [[(h.text, h.tokens, h.score, h.log_prob) for h in hyps] for hyps in aligned] == [
        [(h.text, h.tokens, h.score, h.log_prob) for h in hyps] for hyps in results
    ]
    assert aligned[0] == [] and aligned[-2] == []
    assert all(h.alignment is None for hyps in results for h in hyps)  # opt-in: untouched
    assert all(h.alignment is not None for hyps in aligned for h in hyps)
    with pytest.raises(ValueError, match="has 1 layer,"):
        translator.align(texts, results, layer=2)


def test_an_ensemble_of_the_model_with_itself_aligns_as_the_model(copy_task) -> None:
    alone, ensemble = translator_of(copy_task), translator_of(copy_task, ensemble=True)
    results = alone.translate_ids(alone.encode_sources(HELD_OUT), OPTIONS[1])
    assert ensemble.align(HELD_OUT, results) == alone.align(HELD_OUT, results)


# ------------------------------------------------------------------------- words, as properties


@pytest.fixture(scope="module")
def subwords() -> SubwordTokenizer:
    """A small unigram model whose pieces split words; characters outside it come out as <unk>."""
    rng = random.Random(0)
    texts = [
        " ".join(rng.choice(WORDS) + rng.choice(["", ",", "s", "."]) for _ in range(8)) for _ in range(300)
    ]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts + [TAG]),
        model_writer=model,
        model_type="unigram",
        vocab_size=60,
        user_defined_symbols=[TAG],
        num_threads=1,
        minloglevel=2,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
    )
    return SubwordTokenizer(model.getvalue())


# Source lines as input files hold them: the alphabet, digits, punctuation, other scripts and every
# kind of whitespace a line may hold (tabs, no-break spaces, U+2028 inside the line).
line_chars = st.sampled_from(
    list(string.ascii_lowercase + "., ") + ["\t", "\xa0", "\u2028", "é", "ß", "€", "ﬁ", "日"]
)
lines = st.text(alphabet=line_chars, max_size=40)


@PROPS
@given(text=lines)
def test_word_spans_are_the_whitespace_split_words(text: str) -> None:
    assert [text[a:b] for a, b in word_spans(text)] == text.split()


@PROPS
@given(line=lines.filter(str.strip), tagged=st.booleans(), limit=st.integers(1, 64))
def test_a_source_line_s_words_are_its_whitespace_split_words(
    subwords: SubwordTokenizer, line: str, tagged: bool, limit: int
) -> None:
    """The ids are the translator's; a tag before the line belongs to no word; every subword of
    the line belongs to a word, and every word has its subwords (but those cropped away)."""
    prefix = f"{TAG} " if tagged else ""
    text = prefix + one_line(line)
    ids, words = encoded_words(subwords, text, len(prefix), limit)
    assert ids == subwords.encode([text])[0][:limit]
    assert len(words) == len(line.split())
    owned = sorted(p for pieces in words.pieces for p in pieces)
    assert len(owned) == len(set(owned)) and all(0 <= p < len(ids) for p in owned)
    pieces = subwords.id_to_piece(ids)
    assert set(owned) == {p for p in range(len(ids)) if pieces[p] != TAG}
    if len(ids) == len(subwords.encode([text])[0]):  # nothing cropped
        assert all(words.pieces)


@PROPS
@given(data=st.data(), n_tokens=st.integers(0, 24), source=lines)
def test_any_output_s_words_and_links(
    subwords: SubwordTokenizer, data: st.DataObject, n_tokens: int, source: str
) -> None:
    """For random outputs (any subwords, <unk> and the special ids among them) and random
    attention: the words are those of the output line, each made of some of its subwords; each
    output word has exactly one link, to a source word, sorted by output word."""
    tokens = data.draw(
        st.lists(st.integers(0, subwords.vocab_size - 1), min_size=n_tokens, max_size=n_tokens)
    )
    skipped = frozenset({PAD, BOS, EOS})
    words = output_words(subwords, tokens, skipped)
    text = one_line(subwords.decode([tokens])[0]).strip()  # Translation.text
    assert len(words) == len(text.split())
    assert all(words.pieces) and all(
        0 <= p < len(tokens) and tokens[p] not in skipped for w in words.pieces for p in w
    )
    _, source_words = encoded_words(subwords, source, 0, 64)
    seed = data.draw(st.integers(0, 2**31))
    attention = torch.rand(len(tokens), 65, generator=torch.Generator().manual_seed(seed)).softmax(dim=-1)
    links = hard_alignment(attention, source_words, words)
    if any(source_words.pieces):
        assert [j for _, j in links] == list(range(len(words)))
        assert all(0 <= i < len(source.split()) and source_words.pieces[i] for i, _ in links)
    else:
        assert links == []


def test_format_is_fast_align_s() -> None:
    assert format_alignment([(0, 0), (2, 1), (1, 2)]) == "0-0 2-1 1-2"
    assert format_alignment([]) == ""


def test_the_gold_sample_is_well_formed() -> None:
    """bench/alignment_error.py's sample: 50 pairs, links inside their lines, each once, every
    English word linked."""
    sources = GOLD.with_suffix(".de").read_text(encoding="utf-8").splitlines()
    references = GOLD.with_suffix(".en").read_text(encoding="utf-8").splitlines()
    gold = GOLD.with_suffix(".align").read_text(encoding="utf-8").splitlines()
    assert len(sources) == len(references) == len(gold) == 50
    for source, reference, line in zip(sources, references, gold, strict=True):
        links = [tuple(map(int, link.split("-"))) for link in line.split()]
        assert len(set(links)) == len(links)
        assert all(0 <= i < len(source.split()) and 0 <= j < len(reference.split()) for i, j in links)
        assert {j for _, j in links} == set(range(len(reference.split())))


# ------------------------------------------------------------------------------ the command line


@pytest.fixture(scope="module")
def copy_checkpoint(copy_task, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = copy_task
    path = tmp_path_factory.mktemp("copy") / "copy.ckpt"
    proto = tokenizer.model_proto
    write_checkpoint(path, model, inference_fields(proto, proto, "xx", "xx"))
    return path


INPUT = ["", *HELD_OUT[:9], "  ", "kilo lima", "zulu alpha", ""]  # "zulu" is no word of the task


def main(checkpoint: Path, *args: str) -> int:
    return translate.main(["--checkpoint", str(checkpoint), "--quiet", "--threads", "1", *args])


def test_cli_alignments_agree_with_the_api_and_leave_the_translations_alone(
    copy_task, copy_checkpoint: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in INPUT), encoding="utf-8")
    for search in (["--beam-size", "3"], ["--greedy"]):
        assert main(copy_checkpoint, "--input", str(source), *search) == 0
        plain = capsysbinary.readouterr().out
        nbest = (
            ["--nbest", "2", "--nbest-output", str(tmp_path / "nbest.tsv")] if search[0] != "--greedy" else []
        )
        assert (
            main(
                copy_checkpoint,
                "--input",
                str(source),
                *search,
                "--alignment-output",
                str(tmp_path / "al"),
                *nbest,
            )
            == 0
        )
        assert capsysbinary.readouterr().out == plain  # the same translations, byte for byte
        written = (tmp_path / "al").read_text(encoding="utf-8").split("\n")
        assert written[-1] == "" and len(written[:-1]) == len(INPUT)  # one line per input line
        translator = translator_of(copy_task)
        options = (
            SearchOptions(greedy=True) if search[0] == "--greedy" else SearchOptions(beam_size=3, nbest=2)
        )
        api = translator.align(INPUT, translator.translate_ids(translator.encode_sources(INPUT), options))
        assert written[:-1] == [format_alignment(hyps[0].alignment) if hyps else "" for hyps in api]
        if nbest:
            rows = (tmp_path / "nbest.tsv").read_text(encoding="utf-8").splitlines()
            assert [row.split("\t")[4] for row in rows] == [
                format_alignment(h.alignment) for hyps in api for h in hyps
            ]


def test_cli_alignment_files_resume_and_merge_as_outputs_do(copy_checkpoint: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in INPUT), encoding="utf-8")
    run = ["--input", str(source), "--buffer-size", "3"]
    assert (
        main(
            copy_checkpoint,
            *run,
            "--output",
            str(tmp_path / "out"),
            "--alignment-output",
            str(tmp_path / "al"),
        )
        == 0
    )
    whole, whole_alignments = (tmp_path / "out").read_bytes(), (tmp_path / "al").read_bytes()
    # Interrupted: the alignments behind the translations, their last line cut short.
    (tmp_path / "out").write_bytes(b"".join(line + b"\n" for line in whole.split(b"\n")[:9]))
    (tmp_path / "al").write_bytes(
        b"".join(line + b"\n" for line in whole_alignments.split(b"\n")[:5]) + b"0-"
    )
    assert (
        main(
            copy_checkpoint,
            *run,
            "--output",
            str(tmp_path / "out"),
            "--alignment-output",
            str(tmp_path / "al"),
            "--resume",
        )
        == 0
    )
    assert (tmp_path / "out").read_bytes() == whole and (tmp_path / "al").read_bytes() == whole_alignments
    for i in range(2):
        shard = [
            "--output",
            str(tmp_path / f"out{i}"),
            "--alignment-output",
            str(tmp_path / f"al{i}"),
            "--shard",
            f"{i}/2",
        ]
        assert main(copy_checkpoint, *run, *shard) == 0
    merged = subprocess.run(
        [sys.executable, "-m", "translation.parts", str(tmp_path / "al1"), str(tmp_path / "al0")],
        cwd=ROOT, capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    assert merged.stdout == whole_alignments


def test_cli_alignment_options_that_cannot_work_are_one_line_errors(
    copy_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert (
        main(copy_checkpoint, "--alignment-output", str(tmp_path / "al"), "--alignment-layer", "2", "a") == 2
    )
    assert "error: --alignment-layer 2: the decoder has 1 layer, counted from 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(copy_checkpoint, "--alignment-layer", "1", "a")
    assert (
        exit_info.value.code == 2 and "--alignment-layer needs --alignment-output" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(copy_checkpoint, "--score-references", "x", "--alignment-output", str(tmp_path / "al"), "a")
    assert "drop --alignment-output" in capsys.readouterr().err
