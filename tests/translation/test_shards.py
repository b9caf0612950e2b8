"""Shards merged as their records say (translation/shards.py), with the toy model through
translate.py: the merge needs no setting, and every merge that cannot be right is refused,
naming the file at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

import translate
from tests.test_translate import toy_checkpoint  # noqa: F401 (a fixture)
from tests.toy_text import toy_pairs
from translation import parts

PART_LINES = 10  # not the merge's default (10,000): a merge that guessed it would interleave wrongly


def translate_file(checkpoint: Path, source: Path, output: Path, *options: str) -> None:
    args = ["--checkpoint", str(checkpoint), "--input", str(source), "--output", str(output), "--quiet"]
    assert translate.main([*args, *options]) == 0


@pytest.fixture(scope="module")
def shards(toy_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: F811
    """40 lines translated whole and in shards of parts of 10 lines; and shards that do not fit."""
    tmp = tmp_path_factory.mktemp("shards")
    sources = [s for s, _ in toy_pairs(40, seed=5)]
    (tmp / "a.de").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (tmp / "b.de").write_text("".join(s + "\n" for s in sources[::-1]), encoding="utf-8")
    files = {name: tmp / name for name in ("whole", "a0", "a1", "b1", "a1_of_3")}
    translate_file(toy_checkpoint, tmp / "a.de", files["whole"])
    for name, source, shard in (("a0", "a.de", "0/2"), ("a1", "a.de", "1/2"), ("b1", "b.de", "1/2")):
        translate_file(
            toy_checkpoint, tmp / source, files[name], "--buffer-size", str(PART_LINES), "--shard", shard
        )
    translate_file(
        toy_checkpoint, tmp / "a.de", files["a1_of_3"], "--buffer-size", str(PART_LINES), "--shard", "1/3"
    )
    return files


def copy_record(output: Path, to: Path) -> None:
    """The record beside ``output`` (if any) beside ``to`` too."""
    record = Path(f"{output}.shard.json")
    if record.exists():
        Path(f"{to}.shard.json").write_bytes(record.read_bytes())


def merge(capsysbinary: pytest.CaptureFixture, *argv: str | Path) -> tuple[int, bytes, str]:
    """``python3 -m translation.parts ARGV``: its exit status, stdout and stderr."""
    status = parts.main([str(a) for a in argv])
    captured = capsysbinary.readouterr()
    return status, captured.out, captured.err.decode()


def test_shards_merge_into_the_unsharded_output_with_no_setting_given(shards, capsysbinary):
    status, out, err = merge(capsysbinary, shards["a0"], shards["a1"])
    assert status == 0, err
    assert out == shards["whole"].read_bytes() and out.count(b"\n") == 40
    assert merge(capsysbinary, shards["a1"], shards["a0"])[1] == out  # in any order


def test_a_missing_shard_is_refused_naming_the_input_and_the_shard(shards, capsysbinary):
    status, out, err = merge(capsysbinary, shards["a0"], "--buffer-size", str(PART_LINES))
    assert (status, out) == (1, b"")
    assert "shard 1/2 of" in err and "a.de missing" in err and err.count("\n") == 1


@pytest.mark.parametrize("cut", ["a line", "half a line"])
def test_a_truncated_shard_is_refused_naming_it(shards, tmp_path, capsysbinary, cut):
    truncated = tmp_path / "a1"
    data = shards["a1"].read_bytes()
    truncated.write_bytes(data[: data.rstrip(b"\n").rindex(b"\n") + 1] if cut == "a line" else data[:-5])
    copy_record(shards["a1"], truncated)
    for part_size in (["--buffer-size", str(PART_LINES)], []):
        status, out, err = merge(capsysbinary, shards["a0"], truncated, *part_size)
        assert (status, out) == (1, b"") and err.startswith(f"translation.parts: {truncated}: ")


@pytest.mark.parametrize(
    ("other", "phrase"),
    [("b1", "of another input"), ("a1_of_3", "one of 3 shards, but"), ("whole", "no whole.shard.json")],
)
def test_shards_that_do_not_belong_together_are_refused_naming_the_file(shards, capsysbinary, other, phrase):
    status, out, err = merge(capsysbinary, shards["a0"], shards[other], "--buffer-size", str(PART_LINES))
    assert (status, out) == (1, b"")
    assert err.startswith(f"translation.parts: {shards[other]}: ") and phrase in err, err


def test_a_merge_told_another_part_size_is_refused(shards, capsysbinary):
    status, out, err = merge(capsysbinary, shards["a0"], shards["a1"], "--buffer-size", "5")
    assert (status, out) == (1, b"") and str(shards["a0"]) in err and "in parts of 10" in err


def test_a_shard_is_resumed_only_as_it_was_made(toy_checkpoint, shards, tmp_path, capsysbinary):  # noqa: F811
    source = shards["whole"].parent / "a.de"
    output = tmp_path / "a1"
    data = shards["a1"].read_bytes()
    output.write_bytes(data[: len(data) // 2])
    copy_record(shards["a1"], output)
    common = [
        "--checkpoint",
        str(toy_checkpoint),
        "--input",
        str(source),
        "--output",
        str(output),
        "--resume",
    ]
    for wrong in (["--buffer-size", "5", "--shard", "1/2"], ["--buffer-size", str(PART_LINES)]):
        assert translate.main([*common, "--quiet", *wrong]) == 2
        assert "resume it with --shard 1/2 --buffer-size 10" in capsysbinary.readouterr().err.decode()
    assert output.read_bytes() == data[: len(data) // 2]  # refused before anything was cut
    translate_file(
        toy_checkpoint, source, output, "--buffer-size", str(PART_LINES), "--shard", "1/2", "--resume"
    )
    assert output.read_bytes() == data
    assert merge(capsysbinary, shards["a0"], output)[1] == shards["whole"].read_bytes()


def test_a_shard_needs_an_output_file(capsys):
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--checkpoint", "unused.ckpt", "--input", "in.de", "--shard", "0/2"])
    assert exit_info.value.code == 2 and "--shard records what it holds" in capsys.readouterr().err
