"""translate.py's practitioner workflows: ensembles, sampling, scoring, prefixes, interactive input.

The toy checkpoint of ``test_translate.py`` (a tiny model that learned a word-for-word task) and an
untrained one (whose outputs are arbitrary, so that samples vary) run through ``translate.main``
in-process, and once as a child process fed line by line.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import translate
from tests.test_translate import ROOT, TEST_SOURCES, lines_of, toy_checkpoint, untrained_checkpoint
from translation.translator import SearchOptions, Translator

__all__ = ["toy_checkpoint"]  # a fixture, used by name

KNOWN = ["ein hund läuft", "der kleine mann sitzt", "kind", "frau springt schnell"]


def cli(capsysbinary: pytest.CaptureFixture, *args: str) -> list[str]:
    """stdout lines of ``translate.py ARGS --quiet``, which must succeed."""
    status = translate.main([*args, "--quiet"])
    captured = capsysbinary.readouterr()
    assert status == 0, captured.err.decode()
    return lines_of(captured.out)


@pytest.fixture(scope="module")
def untrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return untrained_checkpoint(tmp_path_factory.mktemp("untrained"))


def test_an_ensemble_of_a_checkpoint_with_itself_translates_as_the_checkpoint(
    toy_checkpoint: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    one, two = tmp_path / "one.tsv", tmp_path / "two.tsv"
    single = cli(
        capsysbinary,
        "--checkpoint",
        str(toy_checkpoint),
        "--nbest",
        "3",
        "--nbest-output",
        str(one),
        *TEST_SOURCES,
    )
    pair = cli(
        capsysbinary,
        "--checkpoint", str(toy_checkpoint), str(toy_checkpoint),
        "--weights", "1", "3",
        "--nbest", "3",
        "--nbest-output", str(two),
        *TEST_SOURCES,
    )  # fmt: skip
    assert pair == single and len(single) == len(TEST_SOURCES)
    # The same n-best lists, line numbers, ranks and texts; scores equal up to rounding.
    single_rows = [r.split("\t") for r in one.read_text().splitlines()]
    pair_rows = [r.split("\t") for r in two.read_text().splitlines()]
    assert [r[:2] + r[3:] for r in pair_rows] == [r[:2] + r[3:] for r in single_rows] and single_rows
    for a, b in zip(single_rows, pair_rows, strict=True):
        assert float(a[2]) == pytest.approx(float(b[2]), abs=1e-4)
    # Worker processes each load the whole ensemble.
    workers = ["--workers", "2", "--threads", "1", "--max-tokens", "8"]
    assert (
        cli(capsysbinary, "--checkpoint", str(toy_checkpoint), str(toy_checkpoint), *workers, *TEST_SOURCES)
        == single
    )
    greedy = ["--greedy", *TEST_SOURCES]
    assert cli(capsysbinary, "--checkpoint", str(toy_checkpoint), str(toy_checkpoint), *greedy) == cli(
        capsysbinary, "--checkpoint", str(toy_checkpoint), *greedy
    )


def test_checkpoints_of_other_sentencepiece_models_are_refused_naming_both(
    toy_checkpoint: Path, untrained: Path, capsys: pytest.CaptureFixture
) -> None:
    status = translate.main(["--checkpoint", str(toy_checkpoint), str(untrained), "ein hund"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert str(toy_checkpoint) in err and str(untrained) in err and "SentencePiece models differ" in err


def test_samples_depend_on_the_seed_and_the_line_only(
    untrained: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    lines = [*KNOWN, "", *KNOWN[:2]]
    (tmp_path / "in.de").write_text("".join(line + "\n" for line in lines))
    common = [
        "--checkpoint",
        str(untrained),
        "--input",
        str(tmp_path / "in.de"),
        "--sampling",
        "--topp",
        "0.9",
    ]
    common += ["--nbest", "2", "--seed", "4"]
    runs = []
    for extra in ([], ["--max-tokens", "6"], ["--workers", "2", "--max-tokens", "6"]):
        nbest = tmp_path / f"nbest{len(runs)}.tsv"
        runs.append((cli(capsysbinary, *common, *extra, "--nbest-output", str(nbest)), nbest.read_text()))
    assert runs[0] == runs[1] == runs[2]
    out, nbest = runs[0]
    assert len(out) == len(lines) and out[4] == "" and out[5:] == out[:2]  # a line is its own
    assert len(nbest.splitlines()) == 2 * (len(lines) - 1)
    other_seed = cli(capsysbinary, *common[:-1], "5")
    assert other_seed != out


def test_topk_one_is_greedy(untrained: Path, capsysbinary: pytest.CaptureFixture) -> None:
    greedy = cli(capsysbinary, "--checkpoint", str(untrained), "--greedy", *KNOWN)
    assert cli(capsysbinary, "--checkpoint", str(untrained), "--sampling", "--topk", "1", *KNOWN) == greedy


def test_score_references_writes_sum_count_and_mean_per_line(
    toy_checkpoint: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    sources = [*KNOWN, ""]
    targets = ["a dog runs", "the small man sits", "a woman", "woman jumps fast", ""]
    (tmp_path / "src").write_text("".join(s + "\n" for s in sources))
    (tmp_path / "ref").write_text("".join(t + "\n" for t in targets))
    args = ["--checkpoint", str(toy_checkpoint), "--input", str(tmp_path / "src")]
    rows = [
        line.split("\t") for line in cli(capsysbinary, *args, "--score-references", str(tmp_path / "ref"))
    ]
    assert len(rows) == len(sources) and all(len(r) == 3 for r in rows)
    total, count, mean = (float(r[0]) for r in rows), (int(r[1]) for r in rows), (float(r[2]) for r in rows)
    scores = Translator.from_checkpoint(toy_checkpoint).score(sources, targets)
    for s, t, c, m in zip(scores, total, count, mean, strict=True):
        assert (
            t == pytest.approx(s.log_prob, abs=1e-5) and c == s.tokens and m == pytest.approx(t / c, abs=1e-5)
        )
    # The right translations are likelier than the wrong one ("a woman" for "kind").
    assert min(float(rows[i][2]) for i in (0, 1, 3)) > float(rows[2][2])
    (tmp_path / "short").write_text("a dog\n")
    status = translate.main([*args, "--score-references", str(tmp_path / "short")])
    assert status == 2 and "has 1 lines but the input" in capsysbinary.readouterr().err.decode()


def test_a_prefix_starts_the_translation(
    toy_checkpoint: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    (tmp_path / "src").write_text("".join(s + "\n" for s in KNOWN))
    (tmp_path / "prefix").write_text("the dog\n\nchild child\nman\n")
    args = ["--checkpoint", str(toy_checkpoint), "--input", str(tmp_path / "src")]
    free = cli(capsysbinary, *args)
    forced = cli(capsysbinary, *args, "--prefix", str(tmp_path / "prefix"))
    assert (
        forced[0].startswith("the dog")
        and forced[2].startswith("child child")
        and forced[3].startswith("man")
    )
    assert forced[1] == free[1]


def test_search_settings_reach_the_search_options() -> None:
    args = translate.parse_args(
        ["--checkpoint", "x", "--min-length", "3", "--no-repeat-ngram", "2", "--sampling", "--topk", "5"]
        + ["--topp", "0.5", "--temperature", "0.7", "--seed", "9", "--nbest", "8"]
    )
    assert translate.search_options(args) == SearchOptions(
        min_len=3, no_repeat_ngram=2, sampling=True, topk=5, topp=0.5, temperature=0.7, seed=9, nbest=8
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--greedy", "--sampling"], "exclude each other"),
        (["--topp", "0"], "--topp must be in (0, 1]"),
        (["--temperature", "0"], "--temperature must be positive"),
        (["--weights", "1", "2"], "2 weights for 1 checkpoints"),
        (["--score-references", "r", "--references", "r"], "drop --references"),
        (["--score-references", "r", "--workers", "2"], "drop --workers"),
        (["--buffer-size", "0"], "--buffer-size must be at least 1"),
        (["--no-repeat-ngram", "-1"], "--no-repeat-ngram must be at least 0"),
    ],
)
def test_bad_options_are_argparse_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--checkpoint", "unused.ckpt", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def read_line(stream, timeout: float) -> bytes:  # noqa: ANN001
    """One line of a child's stdout, or a failure after ``timeout`` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no output line within {timeout} s"
    return stream.readline()


def test_standard_input_is_answered_line_by_line(toy_checkpoint: Path) -> None:
    """A child writes a line, reads its translation, then writes the next: it never waits for
    the end of the input. Closing the pipe ends translate.py with status 0."""
    child = subprocess.Popen(
        [
            sys.executable,
            "translate.py",
            "--threads",
            "1",
            "--checkpoint",
            str(toy_checkpoint),
            "--quiet",
            "--greedy",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        for source in ("ein hund läuft", "", "kind frau"):
            child.stdin.write(source.encode() + b"\n")
            child.stdin.flush()
            expected = {"ein hund läuft": b"a dog runs\n", "": b"\n", "kind frau": b"child woman\n"}[source]
            assert read_line(child.stdout, 120) == expected
        child.stdin.close()
        assert child.wait(timeout=60) == 0, child.stderr.read().decode()
        assert child.stdout.read() == b""
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_scores_of_an_ensemble_are_the_weighted_mean(toy_checkpoint: Path) -> None:
    single = Translator.from_checkpoint(toy_checkpoint)
    pair = Translator.from_checkpoints([toy_checkpoint, toy_checkpoint], weights=[1, 2])
    targets = ["a dog runs", "the small man sits", "child", "woman jumps fast"]
    expected = torch.tensor([s.log_prob for s in single.score(KNOWN, targets)])
    torch.testing.assert_close(torch.tensor([s.log_prob for s in pair.score(KNOWN, targets)]), expected)


@pytest.mark.parametrize(
    ("argv", "checkpoints", "sentences"),
    [
        (["--checkpoint", "a.ckpt", "Ein Hund.", "--quiet"], ["a.ckpt"], ["Ein Hund."]),
        (
            ["--checkpoint", "a.ckpt", "b.pt", "Ein Hund.", "--quiet", "Eine Katze."],
            ["a.ckpt", "b.pt"],
            ["Ein Hund.", "Eine Katze."],
        ),
        (["Ein Hund.", "--checkpoint", "a.ckpt", "Eine Katze."], ["a.ckpt"], ["Ein Hund.", "Eine Katze."]),
        (["--checkpoint", "a", "b.ckpt"], ["a", "b.ckpt"], []),
    ],
)
def test_checkpoint_lists_end_where_the_sentences_begin(
    argv: list[str], checkpoints: list[str], sentences: list[str]
) -> None:
    args = translate.parse_args(argv)
    assert (args.checkpoint, args.sentences) == (checkpoints, sentences)


def test_the_python_api_takes_prefixes_and_sampling(toy_checkpoint: Path) -> None:
    translator = Translator.from_checkpoint(toy_checkpoint)
    forced = translator.translate(KNOWN, prefixes=["the dog", "", "", ""], greedy=True)
    assert forced[0].startswith("the dog") and forced[1:] == translator.translate(KNOWN[1:], greedy=True)
    assert translator.translate(KNOWN, sampling=True, topk=1) == translator.translate(KNOWN, greedy=True)


def test_scores_do_not_depend_on_the_token_budget(toy_checkpoint: Path) -> None:
    translator = Translator.from_checkpoint(toy_checkpoint)
    targets = ["a dog runs", "the small man sits", "child", "woman jumps fast"]
    big = [s.log_prob for s in translator.score(KNOWN, targets)]
    small = [s.log_prob for s in translator.score(KNOWN, targets, max_tokens=6)]  # one pair a batch
    torch.testing.assert_close(torch.tensor(small), torch.tensor(big), rtol=1e-5, atol=1e-5)


def test_a_named_pipe_is_a_file_to_read(
    toy_checkpoint: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    """As bash's ``--prefix <(...)`` gives it: a FIFO, not a regular file."""
    fifo = tmp_path / "prefix"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("the dog\n"))
    writer.start()
    try:
        out = cli(capsysbinary, "--checkpoint", str(toy_checkpoint), "--prefix", str(fifo), "ein hund läuft")
    finally:
        writer.join(timeout=60)
    assert len(out) == 1 and out[0].startswith("the dog")
    assert translate.main(["--checkpoint", str(toy_checkpoint), "--input", str(tmp_path)]) == 2
    assert "a directory, not a file" in capsysbinary.readouterr().err.decode()
