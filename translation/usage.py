"""``translate.py``'s command line read and checked: what argparse cannot check, checked once.

:func:`parse_args` parses (``translation/options.py``), gives the sentences that ``--checkpoint``
swallowed back, and refuses what cannot work with argparse's usage error (exit status 2): values
of the options the program itself reads, and options that exclude or need each other. The search
settings are checked by :class:`decoding.DecodingConfig` alone, which the command line builds here
(``args.decoding``); its refusal becomes the usage error, its settings named by their options
(``beam_size`` -> ``--beam-size``). A search option not given takes the checkpoint's setting, the
one its test stage searched with (:func:`checkpoint_search`, once it is loaded; the project's
default before). Problems found later, once files are read, are :class:`UsageError`.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from decoding import SearchSettings
from decoding.alignment import DEFAULT_LAYER
from translation.options import CHECKPOINT_SEARCH, build_parser
from translation.shards import parse_shard
from translation.translator import SearchOptions

logger = logging.getLogger("translate")


class UsageError(Exception):
    """A problem with the inputs or options found after parsing; reported in one line."""


# The option that sets each DecodingConfig field, for its refusals.
SEARCH_OPTIONS = {
    "beam_size": "--beam-size",
    "nbest": "--nbest",
    "alpha": "--length-penalty",
    "max_len_a": "--max-len-a",
    "max_len_b": "--max-len-b",
    "min_len": "--min-length",
    "no_repeat_ngram": "--no-repeat-ngram",
    "greedy": "--greedy",
    "sampling": "--sampling",
    "topk": "--topk",
    "topp": "--topp",
    "temperature": "--temperature",
    "seed": "--seed",
    "constraints_order": "--constraints-order",
}


def search_options(args: argparse.Namespace, settings: SearchSettings | None = None) -> SearchOptions:
    """The search settings of the command line; an option of :data:`CHECKPOINT_SEARCH` not given
    takes ``settings``' value (a checkpoint's; None: the project's defaults).

    Raises:
        ValueError: settings :class:`SearchOptions` refuses.
    """
    base = settings or SearchSettings()
    chosen = {
        field: getattr(base, field) if getattr(args, option) is None else getattr(args, option)
        for field, option in CHECKPOINT_SEARCH.items()
    }
    return SearchOptions(
        **{**chosen, "beam_size": 1 if args.greedy else chosen["beam_size"]},
        nbest=args.nbest,
        greedy=args.greedy,
        sampling=args.sampling,
        topk=args.topk,
        topp=args.topp,
        temperature=args.temperature,
        seed=args.seed,
        constraints_order=args.constraints_order,
    )


def checkpoint_search(args: argparse.Namespace, settings: SearchSettings) -> SearchOptions:
    """``args.decoding`` again, now that the checkpoint is loaded: its search ``settings`` (those
    its test stage ran) fill the options not given; those that differ from the project's
    defaults are logged.

    Raises:
        UsageError: an option given that does not fit the checkpoint's settings (``--nbest 5``
            over its beam of 4, say), naming both.
    """
    try:
        options = search_options(args, settings)
    except ValueError as err:
        raise UsageError(f"{search_refusal(err, args, settings.beam_size)}") from None
    taken = [
        f"{SEARCH_OPTIONS[field]} {getattr(settings, field)}"
        for field, option in CHECKPOINT_SEARCH.items()
        if getattr(args, option) is None and getattr(settings, field) != getattr(SearchSettings(), field)
    ]
    if taken:
        logger.info("search: %s, the checkpoint's (its test stage's; an option overrides)", ", ".join(taken))
    return options


def search_refusal(err: ValueError, args: argparse.Namespace, beam_size: int | None = None) -> str:
    """:class:`SearchOptions`' message with the options for its fields: ``nbest=3 must be ...
    the beam size`` -> ``--nbest 3 must be ... the beam size (--beam-size 2)``; ``beam_size``: the
    checkpoint's, where ``--beam-size`` was not given."""

    def option(word: re.Match) -> str:
        name, equals = word[1], word[2]
        return SEARCH_OPTIONS[name] + (" " if equals else "") if name in SEARCH_OPTIONS else word[0]

    text = re.sub(r"(?<![\w-])([a-z_]+)\b(=?)", option, str(err))
    if args.greedy:
        beam = "1: --greedy"
    elif args.beam_size is not None:
        beam = f"--beam-size {args.beam_size}"
    elif beam_size is not None:
        beam = f"the checkpoint's {beam_size}: --beam-size changes it"
    else:
        beam = f"--beam-size {SearchSettings().beam_size}"
    return text.replace("the beam size", f"the beam size ({beam})")


def split_checkpoints(args: argparse.Namespace, argv: list[str]) -> None:
    """Moves the sentences that ``--checkpoint``'s list swallowed back to the sentences.

    ``--checkpoint a.ckpt "Ein Hund."`` must stay one checkpoint and one sentence: after the first
    value, the checkpoints are the values that end in ``.ckpt`` or ``.pt`` or name a file; the
    values from the first other one on are sentences, in their place among the others.
    """
    paths = args.checkpoint
    n = 1
    while n < len(paths) and (paths[n].endswith((".ckpt", ".pt")) or Path(paths[n]).is_file()):
        n += 1
    if n == len(paths):
        return
    args.checkpoint, moved = paths[:n], paths[n:]
    try:  # the sentences argparse kept are all before --checkpoint or all after its values
        before = bool(args.sentences) and argv.index(args.sentences[0]) < argv.index("--checkpoint")
    except ValueError:
        before = False
    args.sentences = [*args.sentences, *moved] if before else [*moved, *args.sentences]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line parsed and checked; ``args.decoding`` holds its search settings and
    ``args.shard`` its :class:`~translation.shards.Shard` (or None). Exits with status 2 and
    argparse's usage error on a wrong one."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    split_checkpoints(args, argv)
    try:
        _check_values(args)
        args.decoding = search_options(args)
        _check_input_output(args)
        _check_constraints(args)
        _check_score_references(args)
    except UsageError as err:
        parser.error(str(err))
    except ValueError as err:  # DecodingConfig's
        parser.error(search_refusal(err, args))
    return args


def _check_values(args: argparse.Namespace) -> None:
    """The values the program reads itself (the search's are DecodingConfig's to check)."""
    for name in ("max_tokens", "attention_max_sentences", "buffer_size", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.weights is not None:
        if len(args.weights) != len(args.checkpoint):
            raise UsageError(
                f"--weights gives {len(args.weights)} weights for {len(args.checkpoint)} checkpoints"
            )
        if any(w < 0 for w in args.weights) or sum(args.weights) <= 0:
            raise UsageError("--weights must be non-negative with a positive sum")
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if args.shard is not None:
        try:
            args.shard = parse_shard(args.shard)
        except ValueError as err:
            raise UsageError(str(err)) from None


def _check_input_output(args: argparse.Namespace) -> None:
    """Options that exclude or need each other."""
    if args.greedy and args.nbest_output:
        raise UsageError(
            "--nbest-output needs beam search scores: drop --greedy (--beam-size 1 is greedy with scores)"
        )
    if args.sentences and args.input is not None:
        raise UsageError("give sentences as arguments or --input, not both")
    if args.shard is not None and args.input in (None, "-"):
        raise UsageError("--shard splits an --input FILE: give one")
    if args.shard is not None and not args.output:
        raise UsageError("--shard records what it holds beside an --output FILE: give one")
    if args.resume and not args.output:
        raise UsageError("--resume continues an --output FILE: give one")
    if args.resume and (args.input in (None, "-") or args.sentences):
        raise UsageError("--resume skips the lines an --output FILE answers in an --input FILE: give one")
    for option, value in (("--resume", args.resume), ("--shard", args.shard)):
        if value and args.references:
            raise UsageError(f"--references scores the whole output: drop {option}, then score the file")
        if value and args.attention_dir:
            raise UsageError(f"--attention-dir draws the lines translated in one run: drop {option}")
    if args.attention_heads and not args.attention_dir:
        raise UsageError("--attention-heads needs --attention-dir")
    if args.alignment_layer is not None and not args.alignment_output:
        raise UsageError("--alignment-layer needs --alignment-output")
    args.alignment_layer = DEFAULT_LAYER if args.alignment_layer is None else args.alignment_layer


def _check_constraints(args: argparse.Namespace) -> None:
    """Lexical constraints are met by beam search only (``decoding/constrained_search.py``)."""
    for option, value in (("--greedy", args.greedy), ("--sampling", args.sampling)):
        if args.constraints and value:
            raise UsageError(f"--constraints needs beam search: drop {option} (--beam-size 1 is allowed)")


def _check_score_references(args: argparse.Namespace) -> None:
    if not args.score_references:
        return
    given = [
        option
        for option, value in (
            ("--references", args.references),
            ("--nbest-output", args.nbest_output),
            ("--attention-dir", args.attention_dir),
            ("--alignment-output", args.alignment_output),
            ("--prefix", args.prefix),
            ("--constraints", args.constraints),
            ("--sampling", args.sampling),
            ("--workers", args.workers > 1),  # scores are made in this process
            ("--shard", args.shard),  # a shard's scores would fail the count check at the end
        )
        if value
    ]
    if given:
        raise UsageError(f"--score-references scores given translations: drop {', '.join(given)}")
