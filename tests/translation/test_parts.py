"""A large input in parts (translation/parts.py): streamed, resumed after a kill, split in shards."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import translate
from tests.test_translate import ROOT, toy_checkpoint  # noqa: F401 (a fixture)
from tests.toy_text import toy_pairs
from translation.parts import count_lines, file_parts
from translation.resume import resume_lines, resume_nbest, resume_point
from translation.shards import input_line, interleave, merge_shards, parse_shard, shard_position

SOURCES = [s for s, _ in toy_pairs(120, seed=11)] + ["", "  "]


def _input(tmp_path: Path, n: int | None = None) -> Path:
    path = tmp_path / "in.de"
    lines = SOURCES if n is None else (SOURCES * (n // len(SOURCES) + 1))[:n]
    path.write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    return path


def test_a_file_comes_in_parts_and_every_shard_cuts_the_same_parts(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(1, 24)) + b"last without newline")
    assert count_lines(path) == 24
    parts = list(file_parts(path, 5))
    assert [first for first, _ in parts] == [1, 6, 11, 16, 21] and parts[-1][1][-1] == "last without newline"
    shards = [list(file_parts(path, 5, (i, 2))) for i in range(2)]
    assert [f for f, _ in shards[0]] == [1, 11, 21] and [f for f, _ in shards[1]] == [6, 16]
    assert list(file_parts(path, 5, (1, 2), skip=7)) == [(18, [f"line {i}" for i in range(18, 21)])]
    out = io.BytesIO()
    outputs = []
    for i, shard in enumerate(shards):
        outputs.append(tmp_path / f"out{i}")
        outputs[-1].write_bytes(b"".join(line.encode() + b"\n" for _, lines in shard for line in lines))
    assert interleave(outputs, 5, out) == 24
    assert out.getvalue().decode().splitlines() == [line for _, lines in parts for line in lines]
    with pytest.raises(ValueError, match="I must be from 0 to N-1"):
        parse_shard("2/2")


def test_an_interrupted_output_is_cut_to_its_complete_lines(tmp_path):
    out = tmp_path / "out.txt"
    out.write_bytes(b"a\nb\nhalf a li")
    assert resume_lines(out) == 2 and out.read_bytes() == b"a\nb\n"
    assert resume_lines(tmp_path / "missing") == 0
    nbest = tmp_path / "nbest.tsv"
    nbest.write_bytes(b"1\t1\t-0.1\ta\n1\t2\t-0.2\tb\n3\t1\t-0.3\tc\n4\t1\t-0.4\td")
    resume_nbest(nbest, 4)
    assert nbest.read_bytes() == b"1\t1\t-0.1\ta\n1\t2\t-0.2\tb\n3\t1\t-0.3\tc\n"
    # A row cut within its line number (the "1" of "10") is no row of line 1.
    nbest.write_bytes(b"4\t1\t-1.0\ta\n4\t2\t-2.0\tb\n1")
    resume_nbest(nbest, 2)
    assert nbest.read_bytes() == b""


def test_a_resumed_output_ends_as_an_uninterrupted_one(toy_checkpoint, tmp_path):  # noqa: F811
    source = _input(tmp_path)
    whole, resumed = tmp_path / "whole.en", tmp_path / "resumed.en"
    common = ["--checkpoint", str(toy_checkpoint), "--input", str(source), "--quiet", "--buffer-size", "16"]
    assert (
        translate.main(
            [*common, "--output", str(whole), "--nbest", "2", "--nbest-output", str(tmp_path / "a")]
        )
        == 0
    )
    done = whole.read_bytes().split(b"\n")
    resumed.write_bytes(b"\n".join(done[:37]) + b"\nhalf a lin")  # 37 lines, then a write cut short
    (tmp_path / "b").write_bytes(b"".join(r + b"\n" for r in (tmp_path / "a").read_bytes().split(b"\n")[:5]))
    args = [
        *common,
        "--output",
        str(resumed),
        "--nbest",
        "2",
        "--nbest-output",
        str(tmp_path / "b"),
        "--resume",
    ]
    assert translate.main(args) == 0
    assert resumed.read_bytes() == whole.read_bytes() and count_lines(whole) == len(SOURCES)
    assert (tmp_path / "b").read_bytes() == (tmp_path / "a").read_bytes()


def test_shards_merged_give_the_whole_output(toy_checkpoint, tmp_path):  # noqa: F811
    source = _input(tmp_path)
    common = ["--checkpoint", str(toy_checkpoint), "--input", str(source), "--quiet", "--buffer-size", "7"]
    assert translate.main([*common, "--output", str(tmp_path / "whole")]) == 0
    for i in range(3):
        assert translate.main([*common, "--output", str(tmp_path / f"shard{i}"), "--shard", f"{i}/3"]) == 0
    merged = io.BytesIO()
    merge_shards([tmp_path / f"shard{i}" for i in range(3)], merged)  # the records give the part size
    assert merged.getvalue() == (tmp_path / "whole").read_bytes()


def test_stdout_of_sampling_is_each_lines_first_sample(toy_checkpoint, tmp_path, capsysbinary):  # noqa: F811
    source = _input(tmp_path)
    common = [
        "--checkpoint",
        str(toy_checkpoint),
        "--input",
        str(source),
        "--quiet",
        "--sampling",
        "--seed",
        "3",
    ]
    assert translate.main([*common, "--nbest", "1"]) == 0
    one = capsysbinary.readouterr().out
    assert translate.main([*common, "--nbest", "4", "--nbest-output", str(tmp_path / "n.tsv")]) == 0
    assert capsysbinary.readouterr().out == one  # sample 0 is the same draw whatever --nbest
    assert count_lines(tmp_path / "n.tsv") == 4 * sum(1 for s in SOURCES if s.strip())


@pytest.mark.slow  # a translate.py process, killed
def test_a_run_killed_mid_file_and_resumed_gives_the_uninterrupted_file(toy_checkpoint, tmp_path):  # noqa: F811
    source = _input(tmp_path, n=6000)
    command = [sys.executable, "translate.py", "--threads", "1", "--checkpoint", str(toy_checkpoint)]
    command += ["--input", str(source), "--quiet", "--buffer-size", "200", "--greedy"]
    whole, killed = tmp_path / "whole.en", tmp_path / "killed.en"
    subprocess.run([*command, "--output", str(whole)], cwd=ROOT, check=True, timeout=600)
    proc = subprocess.Popen([*command, "--output", str(killed)], cwd=ROOT)
    deadline = time.monotonic() + 300
    while (not killed.exists() or count_lines(killed) < 1000) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert count_lines(killed) < 6000  # killed before it finished
    subprocess.run([*command, "--output", str(killed), "--resume"], cwd=ROOT, check=True, timeout=600)
    assert killed.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("shard", [(0, 1), (1, 3)])
def test_the_resume_point_is_the_earlier_of_the_output_and_the_nbest_file(tmp_path, shard):
    part = 4
    lines = [input_line(k, shard, part) for k in range(12)]  # this shard's input lines (from 0)
    output, nbest = tmp_path / "out", tmp_path / "nbest"
    output.write_bytes(b"".join(b"t%d\n" % k for k in range(9)) + b"cut")  # 9 complete lines
    rows = [b"%d\t%d\t-1.0\tt%d\n" % (lines[k] + 1, r, k) for k in range(7) for r in (1, 2)]
    nbest.write_bytes(b"".join(rows) + b"%d\t1\t-1" % (lines[7] + 1))  # line 8 (k=7) cut short
    # The n-best file is behind: lines k=0..6 complete there (its last named line, k=7, may not be).
    assert resume_point(output, nbest, shard, part) == 7
    assert output.read_bytes() == b"".join(b"t%d\n" % k for k in range(7))
    assert nbest.read_bytes() == b"".join(rows[:14])
    # The output behind: it wins.
    output.write_bytes(b"t0\nt1\n")
    assert resume_point(output, nbest, shard, part) == 2 and nbest.read_bytes() == b"".join(rows[:4])
    assert [shard_position(line, shard, part) for line in lines] == list(range(12))


def test_resume_needs_an_input_file():
    with pytest.raises(SystemExit):
        translate.parse_args(["--checkpoint", "x.ckpt", "--output", "o", "--resume"])
