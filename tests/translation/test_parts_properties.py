"""Properties of a file translated in parts (translation/parts.py, resume.py, shards.py), for any
input length, part size and shard count, through translate.py's own run (``TranslationRun``)
with an uppercasing stand-in for the model: the merged shards are the whole output, in input
order; an output cut at any byte and resumed is the uncut one."""

from __future__ import annotations

import io
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

import translate
from translation.parts import count_lines
from translation.pipeline import TranslationRun
from translation.results import Translation
from translation.shards import ShardRecord, merge_shards

PROPS = settings(max_examples=60, deadline=None, database=None)

# Lines as an input file may hold them: any text but a line break or a byte order mark (which
# data/lines.py takes out), whitespace-only and empty lines too.
line_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\ufeff"), max_size=12
)
inputs = st.lists(st.one_of(line_text, st.sampled_from(["", "  "])), max_size=40)


class Uppercase:
    """What TranslationRun needs of a Translator: each non-empty line's ``nbest`` "translations",
    its text uppercased (then with the rank), an empty one none."""

    def encode_sources(self, texts: list[str], name: str = "", first_line: int = 1) -> list[list[int]]:
        return [[ord(c) for c in text] if text.strip() else [] for text in texts]

    def translate_ids(  # noqa: ANN001, ANN201
        self,
        sources,
        options,
        max_tokens=None,
        progress=None,
        pool=None,
        prefixes=None,
        constraints=None,
    ):
        results = []
        for source in sources:
            text = "".join(map(chr, source)).upper()
            hyps = [f"{text} {rank}" if rank else text for rank in range(options.nbest)]
            results.append(
                [Translation(h, source, -1.0 - rank, -1.0) for rank, h in enumerate(hyps)] if source else []
            )
        if progress is not None:
            progress(len(sources))
        return results

    def check_alignment_layer(self, layer: int) -> None:
        pass

    def align(self, texts, results, layer, max_tokens=None):  # noqa: ANN001, ANN201
        """Output word j linked to source word j modulo the source's words."""
        return [
            [
                replace(h, alignment=[(j % len(t.split()), j) for j in range(len(h.text.split()))])
                for h in hyps
            ]
            for t, hyps in zip(texts, results, strict=True)
        ]


def run(directory: Path, *options: str) -> None:
    """``translate.py --input in.txt OPTIONS`` in ``directory``, the stand-in translating."""
    args = translate.parse_args(
        ["--checkpoint", "unused.ckpt", "--input", str(directory / "in.txt"), *options]
    )
    TranslationRun(args, Uppercase(), None).run()


def write_input(directory: Path, lines: list[str], final_newline: bool) -> list[str]:
    """The input file; returns the output lines the stand-in gives for it (a last empty line
    without its newline is no line)."""
    text = "\n".join(lines) + ("\n" if final_newline else "")
    (directory / "in.txt").write_bytes(text.encode("utf-8"))
    held = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
    return [line.upper() if line.strip() else "" for line in held if text]


@PROPS
@given(
    lines=inputs,
    final_newline=st.booleans(),
    part_lines=st.integers(1, 8),
    shards=st.integers(1, 4),
    order=st.randoms(use_true_random=False),
)
def test_merged_shards_are_the_whole_output_in_input_order(lines, final_newline, part_lines, shards, order):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        expected = write_input(directory, lines, final_newline)
        run(directory, "--output", str(directory / "whole"))
        assert (directory / "whole").read_text(encoding="utf-8").split("\n")[:-1] == expected
        outputs = [directory / f"shard{i}" for i in range(shards)]
        for i, output in enumerate(outputs):
            run(
                directory,
                "--output",
                str(output),
                "--buffer-size",
                str(part_lines),
                "--shard",
                f"{i}/{shards}",
            )
            assert ShardRecord.read(output).lines == count_lines(output)
        order.shuffle(outputs)  # the records say which shard each is
        merged = io.BytesIO()
        assert merge_shards(outputs, merged) == len(expected)
        assert merged.getvalue() == (directory / "whole").read_bytes()


@PROPS
@given(
    lines=inputs.filter(bool),
    part_lines=st.integers(1, 8),
    shard=st.none() | st.integers(1, 3).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))),
    cut=st.floats(0.0, 1.0),
    nbest_cut=st.floats(0.0, 1.0),
)
def test_an_output_cut_at_any_byte_and_resumed_is_the_uncut_one(lines, part_lines, shard, cut, nbest_cut):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_input(directory, lines, final_newline=True)
        output, nbest = directory / "out", directory / "nbest"
        options = ["--output", str(output), "--nbest", "2", "--nbest-output", str(nbest)]
        options += ["--buffer-size", str(part_lines)]
        options += [] if shard is None else ["--shard", f"{shard[0]}/{shard[1]}"]
        run(directory, *options)
        whole, whole_nbest, record = output.read_bytes(), nbest.read_bytes(), ShardRecord.read(output)
        output.write_bytes(whole[: round(cut * len(whole))])  # a run stopped anywhere
        nbest.write_bytes(whole_nbest[: round(nbest_cut * len(whole_nbest))])
        run(directory, *options, "--resume")
        assert output.read_bytes() == whole and nbest.read_bytes() == whole_nbest
        assert ShardRecord.read(output) == record


@PROPS
@given(
    lines=inputs.filter(bool),
    part_lines=st.integers(1, 8),
    shard=st.none() | st.integers(1, 3).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))),
    cuts=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
)
# Found by CI: the n-best file cut within a row's line number (the "1" of "10"), the output cut to
# nothing: resume kept the "1" as a row of line 1.
@example(
    lines=["", "", "", "00 \U00010000", "", "", "", "", "", "0\x0c0"],
    part_lines=1,
    shard=(1, 2),
    cuts=(0.0, 0.75, 0.0),
)
def test_alignments_cut_at_any_byte_and_resumed_are_the_uncut_ones(lines, part_lines, shard, cuts):
    """``--alignment-output`` beside ``--output`` and ``--nbest-output``, each cut anywhere: resumed,
    all three are the straight run's (one alignment line per input line)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_input(directory, lines, final_newline=True)
        files = [directory / "out", directory / "nbest", directory / "align"]
        options = ["--output", str(files[0]), "--nbest", "2", "--nbest-output", str(files[1])]
        options += ["--alignment-output", str(files[2]), "--buffer-size", str(part_lines)]
        options += [] if shard is None else ["--shard", f"{shard[0]}/{shard[1]}"]
        run(directory, *options)
        whole = [f.read_bytes() for f in files]
        assert count_lines(files[2]) == count_lines(files[0])
        for f, data, cut in zip(files, whole, cuts, strict=True):
            f.write_bytes(data[: round(cut * len(data))])  # a run stopped anywhere
        run(directory, *options, "--resume")
        assert [f.read_bytes() for f in files] == whole


@PROPS
@given(lines=inputs, part_lines=st.integers(1, 8), shards=st.integers(1, 4))
def test_merged_alignment_shards_are_the_whole_alignment_file(lines, part_lines, shards):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_input(directory, lines, final_newline=True)
        run(
            directory,
            "--output",
            str(directory / "whole"),
            "--alignment-output",
            str(directory / "whole.align"),
        )
        outputs = [directory / f"shard{i}.align" for i in range(shards)]
        for i, output in enumerate(outputs):
            shard = ["--output", str(directory / f"shard{i}"), "--alignment-output", str(output)]
            run(directory, *shard, "--buffer-size", str(part_lines), "--shard", f"{i}/{shards}")
        merged = io.BytesIO()
        merge_shards(outputs, merged)
        assert merged.getvalue() == (directory / "whole.align").read_bytes()
