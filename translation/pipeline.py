"""What ``translate.py`` does with a loaded translator: the input translated part by part.

:class:`TranslationRun` is the recipe: :meth:`~TranslationRun.start` (``--resume``'s cut and
skip, a shard's record), then each part of the input translated and its lines written and
flushed before the next part is read (:meth:`~TranslationRun.translate_part`; with
``--alignment-output``, its translations aligned, :meth:`~TranslationRun.align`), then what needs the
whole run: the shard's record finished, the speed logged, the line counts of ``--references``
and ``--prefix`` checked, attention plots drawn and the scores of ``--references`` printed. An
``--input`` of millions of lines is never held: only ``--references`` keeps the translations.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from translation.console import progress_bar
from translation.inputs import AlignedFile, Input, Parts, read_input
from translation.outputs import alignment_lines, best_lines, nbest_rows, open_output, printed, write_lines
from translation.parts import FILE_PART_LINES
from translation.results import Translation
from translation.resume import resume_point
from translation.shards import WHOLE, InputDigest, ShardRecord, check_resumable
from translation.terminology import report_unmet, split_constraints
from translation.translator import Translator
from translation.usage import UsageError
from translation.workers import WorkerPool

logger = logging.getLogger("translate")


@dataclass
class Tally:
    """What a run counted, and kept for the steps after it.

    Attributes:
        lines, real: output lines written; those of non-empty input lines.
        tokens: output tokens of the best translations, ``</s>`` included.
        unmet: lines whose constraints were not met (``--constraints``), their output lines empty.
        hypotheses: the output lines, kept for ``--references`` only.
        sources, results: the lines' source ids and translations, kept for ``--attention-dir``.
    """

    lines: int = 0
    real: int = 0
    tokens: int = 0
    unmet: int = 0
    hypotheses: list[str] = field(default_factory=list)
    sources: list[list[int]] = field(default_factory=list)
    results: list[list[Translation]] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)


class TranslationRun:
    """``translate.py`` translating (not scoring), from checked arguments (``translation/usage.py``).

    Args:
        args: the parsed command line; ``args.decoding`` holds the search settings.
        translator: the loaded model, its fast paths in use.
        pool: worker processes that search the batches, or None to search here.
    """

    def __init__(self, args: argparse.Namespace, translator: Translator, pool: WorkerPool | None) -> None:
        self.args, self.translator, self.pool = args, translator, pool
        self.references = AlignedFile.read("--references", args.references)
        self.prefixes = AlignedFile.read("--prefix", args.prefix)
        self.digest = InputDigest() if args.shard else None
        if args.alignment_output:  # a layer the model lacks, refused before translating
            try:
                translator.check_alignment_layer(args.alignment_layer)
            except ValueError as err:
                raise UsageError(str(err).replace("alignment layer", "--alignment-layer", 1)) from None
        self.tally = Tally()

    def run(self) -> None:
        """Reads the input, translates it part by part and writes every output asked for."""
        args = self.args
        skip, record = self.start()
        source = read_input(args.sentences, args.input, args.buffer_size, args.shard, skip, self.digest)
        for aligned in (self.references, self.prefixes):
            if aligned is not None and source.known is not None:  # before translating, where known
                aligned.check_count(source.known, source.name)
        parts = self._announce_resume(source, skip) if args.resume else source.parts
        self.tally.start = time.perf_counter()
        with (
            open_output(args.output, append=args.resume) as out,
            _optional_output(args.nbest_output, append=args.resume) as nbest_out,
            _optional_output(args.alignment_output, append=args.resume) as alignment_out,
            progress_bar("sent", "translate", args.quiet) as bar,
        ):
            for first, lines in parts:
                best, results = self.translate_part(first, lines, source.name, bar)
                write_lines(best, out)
                if alignment_out is not None:  # the n-best rows then carry them too
                    results = self.align(lines, results)
                    write_lines(alignment_lines(results, args.decoding.sampling), alignment_out)
                if nbest_out is not None:
                    write_lines(nbest_rows(results, first), nbest_out)
        if record is not None:
            assert self.digest is not None
            self._write_record(record.finish(self.digest, skip + self.tally.lines, args.input))
        self.finish(source.name)

    def start(self) -> tuple[int, ShardRecord | None]:
        """The lines of the input (of the shard) that ``--resume`` skips, its output files cut to
        them; and the record a shard's output keeps, written (unfinished) before the output is."""
        args = self.args
        part_lines = args.buffer_size or FILE_PART_LINES
        output = None if args.output is None else Path(args.output)
        holds_lines = output is not None and output.exists() and output.stat().st_size > 0
        skip = 0
        if args.resume:  # the lines complete in --output (and the other outputs), to which all are cut
            if holds_lines:
                check_resumable(output, args.shard, part_lines)
            skip = resume_point(
                output, args.nbest_output, args.shard or WHOLE, part_lines, args.alignment_output
            )
        if args.shard is None:
            return skip, None
        # A resumed shard keeps its record's fingerprint of the input, to check the input against.
        kept = ShardRecord.read(output) if args.resume and holds_lines else None
        record = kept.unfinished() if kept else ShardRecord(args.input, *args.shard, part_lines)
        self._write_record(record)
        return skip, record

    def _write_record(self, record: ShardRecord) -> None:
        """The shard's record beside ``--output``, and beside ``--alignment-output``, which holds
        the same lines, so that ``python3 -m translation.parts`` merges either."""
        for path in (self.args.output, self.args.alignment_output):
            if path is not None:
                record.write(path)

    def align(self, lines: list[str], results: list[list[Translation]]) -> list[list[Translation]]:
        """``results`` with word alignments: every hypothesis's where the n-best rows carry them,
        else only the output line's."""
        args = self.args
        chosen = results if args.nbest_output else printed(results, args.decoding.sampling)
        return self.translator.align(lines, chosen, args.alignment_layer, args.max_tokens)

    def _announce_resume(self, source: Input, skip: int) -> Parts:
        """``source``'s parts as they were, once it is logged where ``--resume`` continues."""
        first = next(source.parts, None)
        logger.info(
            "--resume: %s holds %d complete lines; %s",
            self.args.output,
            skip,
            "nothing left to translate" if first is None else f"translating from line {first[0]}",
        )
        return iter([]) if first is None else itertools.chain([first], source.parts)

    def translate_part(
        self, first: int, lines: list[str], name: str, bar: tqdm
    ) -> tuple[list[str], list[list[Translation]]]:
        """The output lines and the translations of input lines ``first, first + 1, ...``
        (``lines``) of the input ``name``, counted."""
        translator, tally = self.translator, self.tally
        if self.references is not None:
            self.references.lines_for(first, len(lines), name)
        forced = None if self.prefixes is None else self.prefixes.lines_for(first, len(lines), name)
        terms = None
        if self.args.constraints:  # source<TAB>constraint<TAB>...
            lines, terms = split_constraints(lines)
        sources = translator.encode_sources(lines, name, first)
        wanted = None if terms is None else translator.encode_constraints(terms)
        real = sum(1 for source in sources if source)
        bar.total = (bar.total or 0) + real
        bar.refresh()
        results = translator.translate_ids(
            sources,
            self.args.decoding,
            self.args.max_tokens,
            progress=bar.update,
            pool=self.pool,
            prefixes=None if forced is None else translator.encode_prefixes(forced, self.args.prefix, first),
            constraints=wanted,
        )
        if terms is not None and wanted is not None:
            tally.unmet += report_unmet(
                translator, sources, wanted, terms, results, self.args.decoding, name, first
            )
        best = best_lines(results, self.args.decoding.sampling)
        tally.lines += len(best)
        tally.real += real
        tally.tokens += sum(len(hyps[0].tokens) + 1 for hyps in results if hyps)
        if self.references is not None:
            tally.hypotheses.extend(best)
        if self.args.attention_dir:
            tally.sources.extend(sources)
            tally.results.extend(results)
        return best, results

    def finish(self, name: str) -> None:
        """What needs the whole run: the speed, the counts, the attention plots and the scores."""
        args, tally = self.args, self.tally
        seconds = time.perf_counter() - tally.start
        logger.info(
            "translated %d lines (%d non-empty) in %.1f s: %.1f sentences/s, %.0f output tokens/s",
            tally.lines,
            tally.real,
            seconds,
            tally.real / max(seconds, 1e-9),
            tally.tokens / max(seconds, 1e-9),
        )
        if tally.unmet:
            logger.warning(
                "constraints not met in %d of %d lines: their output lines are empty",
                tally.unmet,
                tally.lines,
            )
        if not (args.resume or args.shard):  # a shard, or the rest of a run, answers part of the input
            for aligned in (self.references, self.prefixes):
                if aligned is not None:
                    aligned.check_count(tally.lines, name)
        if args.attention_dir:
            self._plot_attention()
        if self.references is not None:
            self._print_scores(self.references)

    def _plot_attention(self) -> None:
        from translation.attention_plot import write_attention  # matplotlib only when asked for

        args = self.args
        if len(args.checkpoint) > 1:
            logger.info("the attention plots show the first checkpoint's model, %s", args.checkpoint[0])
        n_files = write_attention(
            self.translator,
            self.tally.sources,
            self.tally.results,
            args.attention_dir,
            args.attention_heads,
            args.attention_max_sentences,
        )
        logger.info("wrote %d attention plots to %s", n_files, args.attention_dir)

    def _print_scores(self, references: AlignedFile) -> None:
        from translation.metrics import corpus_scores  # sacrebleu only when asked for

        try:
            scores = corpus_scores(
                self.tally.hypotheses, references.lines, self.translator.tgt_lang, self.args.bleu_tokenize
            )
        except ValueError as err:  # a tokenizer that cannot be used here: the translations are written
            raise UsageError(f"--references: {err}") from None
        sys.stderr.write(scores.report() + "\n")
        sys.stderr.flush()


def _optional_output(path: str | None, append: bool) -> contextlib.AbstractContextManager[BinaryIO | None]:
    """:func:`open_output` of ``path``, or a context of None where it is not given."""
    return open_output(path, append) if path is not None else contextlib.nullcontext()
