"""``translate.py --score-references FILE``: given translations scored instead of searched.

For each input line and the line of FILE with its number, the translation's log-probability
under the model or the ensemble (``Translator.score_ids``, forced decoding), written as
``sum<TAB>tokens<TAB>mean`` (``translation/outputs.py``), a part of the input at a time.
"""

from __future__ import annotations

import argparse

from translation.console import progress_bar
from translation.inputs import AlignedFile, read_input
from translation.outputs import open_output, score_rows, write_lines
from translation.translator import DEFAULT_MAX_TOKENS, Translator


def score_input(args: argparse.Namespace, translator: Translator) -> None:
    """Writes, for each input line, the log-probability of its line of ``--score-references``."""
    targets = AlignedFile.read("--score-references", args.score_references)
    assert targets is not None
    source = read_input(args.sentences, args.input, args.buffer_size)
    if source.known is not None:
        targets.check_count(source.known, source.name)
    scored = 0
    with (
        open_output(args.output) as out,
        progress_bar("pair", "score", args.quiet) as bar,
    ):
        for first, lines in source.parts:
            given = targets.lines_for(first, len(lines), source.name)
            bar.total = (bar.total or 0) + len(lines)
            scores = translator.score_ids(
                translator.encode_sources(lines, source.name, first),
                translator.encode_targets(given, args.score_references, first),
                args.max_tokens or DEFAULT_MAX_TOKENS,
                progress=bar.update,
            )
            write_lines(score_rows(scores), out)
            scored += len(lines)
    targets.check_count(scored, source.name)
