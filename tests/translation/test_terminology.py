"""``translate.py --constraints`` and ``Translator.translate(constraints=...)``: the lines read, the
constraints segmented as inside a sentence, every output holding them, unmeetable lines reported.

The toy checkpoint of ``test_translate.py`` (a tiny model that learned a word-for-word task) runs
through ``translate.main`` in-process.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

import translate
from tests.test_translate import lines_of, toy_checkpoint
from tests.toy_text import LEXICON, make_pairs
from translation.terminology import split_constraints, unmet_message
from translation.translator import Translator

__all__ = ["toy_checkpoint"]  # a fixture, used by name

ENGLISH = sorted(LEXICON.values())


def test_a_line_is_its_source_then_its_constraints_after_tabs() -> None:
    lines = ["ein hund\tdog\t big cat \t\t ", "kind", "\tdog", "frau\t"]
    assert split_constraints(lines) == (
        ["ein hund", "kind", "", "frau"],
        [["dog", "big cat"], [], ["dog"], []],
    )


def test_an_unmeetable_message_names_the_constraint_too_long_or_all_of_them() -> None:
    assert unmet_message(["dog", "a b c"], [1, 3], 2) == (
        "constraint 'a b c' (3 subwords) is longer than its length limit of 2 subwords"
    )
    assert unmet_message(["dog", "cat"], [1, 1], 1) == (
        "constraints 'dog' (1 subword), 'cat' (1 subword) could not all be met within its length limit "
        "of 1 subword"
    )


@pytest.fixture(scope="module")
def unigram() -> spm.SentencePieceProcessor:
    """A unigram model small enough to split most words into several pieces."""
    model = io.BytesIO()
    text = [t for _, t in make_pairs(300, seed=5)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text),
        model_writer=model,
        model_type="unigram",
        vocab_size=36,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    assert sum(len(processor.encode(w)) > 1 for w in ENGLISH) > len(ENGLISH) // 2  # most words split
    return processor


@settings(max_examples=100, deadline=None, database=None)
@given(st.lists(st.sampled_from(ENGLISH), min_size=1, max_size=8), st.data())
def test_a_constraint_encoded_alone_is_how_its_words_are_encoded_inside_a_sentence(
    unigram: spm.SentencePieceProcessor, words: list[str], data: st.DataObject
) -> None:
    """What ``Translator.encode_constraints`` relies on: SentencePiece marks every word's start with
    ``▁`` (the first one's too) and never joins pieces across spaces."""
    start = data.draw(st.integers(0, len(words) - 1))
    span = " ".join(words[start : start + data.draw(st.integers(1, 3))])
    sentence, alone = unigram.encode(" ".join(words) + " ."), unigram.encode(span)
    assert any(sentence[i : i + len(alone)] == alone for i in range(len(sentence))), (span, sentence, alone)


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str], str]:
    """Exit status, stdout lines and stderr of ``translate.py ARGS --quiet`` in this process."""
    status = translate.main([*args, "--quiet"])
    captured = capsys.readouterr()
    return status, lines_of(captured.out.encode()), captured.err


def test_every_output_and_nbest_entry_holds_the_constraints_and_an_unmeetable_line_is_named(
    toy_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    lines = [
        "ein hund läuft\tcat",
        "der kleine mann sitzt\tquickly\tred",
        "kind",  # no constraints: as without the option
        "frau\t" + " ".join(["dog"] * 14),  # 14 subwords, its limit 1.5 * 2 + 10 = 13
        "",
        "große katze\tover street",
    ]
    (tmp_path / "in.tsv").write_text("".join(line + "\n" for line in lines))
    common = ["--checkpoint", str(toy_checkpoint), "--input", str(tmp_path / "in.tsv"), "--beam-size", "4"]
    status, out, err = cli(
        capsys, *common, "--constraints", "--nbest", "3", "--nbest-output", str(tmp_path / "n")
    )
    assert status == 0 and len(out) == len(lines)
    words = [line.split() for line in out]
    assert "cat" in words[0] and {"quickly", "red"} <= set(words[1])
    assert out[2] == cli(capsys, "--checkpoint", str(toy_checkpoint), "kind")[1][0] == "child"
    assert out[3] == "" and out[4] == ""
    assert "over street" in out[5]
    for row in (tmp_path / "n").read_text().splitlines():
        number, _, _, text = row.split("\t")
        wanted = lines[int(number) - 1].split("\t")[1:]
        assert all(f" {w} " in f" {text} " for w in wanted), row
    assert f"ERROR: {tmp_path / 'in.tsv'} line 4: constraint '{' '.join(['dog'] * 14)}' (14 subwords)" in err
    assert "is longer than its length limit of 13 subwords (--max-len-a 1.5 x 2 source tokens" in err
    assert err.count("ERROR") == 1
    assert "constraints not met in 1 of 6 lines" in err
    workers = cli(capsys, *common, "--constraints", "--workers", "2", "--threads", "1", "--max-tokens", "8")
    assert workers[1] == out  # the constraints travel with each batch to the worker processes

    ordered = cli(capsys, *common[:2], "--constraints", "--constraints-order", "ordered", "kind\tdog\tcat")[1]
    reverse = cli(capsys, *common[:2], "--constraints", "--constraints-order", "ordered", "kind\tcat\tdog")[1]
    assert ordered[0].index("dog") < ordered[0].index("cat") and reverse[0].index("cat") < reverse[0].index(
        "dog"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--constraints", "--greedy"], "--constraints needs beam search: drop --greedy"),
        (["--constraints", "--sampling"], "--constraints needs beam search: drop --sampling"),
        (
            ["--constraints", "--score-references", "x.en"],
            "--score-references scores given translations: drop",
        ),
        (["--constraints-order", "sideways"], "invalid choice: 'sideways'"),
    ],
)
def test_constraints_without_beam_search_are_refused(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--checkpoint", "unused.ckpt", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_python_api_takes_constraints_per_line(
    toy_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    translator = Translator.from_checkpoint(toy_checkpoint)
    texts = ["ein hund läuft", "kind", "frau springt"]
    with caplog.at_level(logging.ERROR):
        out = translator.translate(
            texts, constraints=[["big", "meadow"], [" ".join(["cat"] * 20)], []], constraints_order="ordered"
        )
    assert out[0].index("big") < out[0].index("meadow")
    assert out[1] == "" and out[2] == translator.translate(texts[2:])[0]
    assert "<input> line 2: constraint" in caplog.text and "its output line is empty" in caplog.text
    with pytest.raises(ValueError, match="lexical constraints need beam search: drop greedy"):
        translator.translate(texts, constraints=[["dog"], [], []], greedy=True)
