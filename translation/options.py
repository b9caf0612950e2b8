"""``translate.py``'s options: each one, its default and its help, written once.

:func:`build_parser` is argparse's parser of every option, in the groups ``--help`` shows; the
search's defaults are :class:`decoding.DecodingConfig`'s (``SearchOptions``), which also checks
their values (``translation/usage.py`` turns its refusals into usage errors naming the option).
The options of :class:`decoding.SearchSettings` (beam size, length penalty, length limits) parse
to None where not given: the first checkpoint's settings, those its test stage searched with, fill
them once it is loaded (:data:`CHECKPOINT_SEARCH` names them).
"""

from __future__ import annotations

import argparse

import torch

from decoding.alignment import DEFAULT_LAYER
from decoding.budget import ACCELERATOR_TOKENS
from decoding.config import CONSTRAINT_ORDERS
from translation.parts import FILE_PART_LINES
from translation.translator import DEFAULT_MAX_TOKENS, SearchOptions

PROG = "translate.py"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

DEFAULTS = SearchOptions()  # the search options' defaults, shown in --help

# The option of each SearchSettings field: None where not given, then the checkpoint's value.
CHECKPOINT_SEARCH = {
    "beam_size": "beam_size",
    "alpha": "length_penalty",
    "max_len_a": "max_len_a",
    "max_len_b": "max_len_b",
    "min_len": "min_length",
    "no_repeat_ngram": "no_repeat_ngram",
}


def _checkpoint_default(value: object) -> str:
    """The help's default of a :data:`CHECKPOINT_SEARCH` option."""
    return f"default: the checkpoint's, as its test stage searched; {value} where it does not say"


DESCRIPTION = """\
Translate sentences with a checkpoint of this project.

Lines come from SENTENCE arguments, --input FILE or stdin, split on '\\n' only;
each gives exactly one output line, in input order. Empty and whitespace-only
lines give empty lines; invalid UTF-8 is replaced and lines longer than the
model allows are cropped, each with a warning that names the line. Only
translations go to stdout; progress, warnings and scores go to stderr. A bad
checkpoint or option gives a one-line error and exit status 2.

Standard input is translated as it arrives: each line (or each --buffer-size
lines that have come) is answered and flushed before more is read, so a person
or a process can type a line and read its translation.
"""

EXAMPLES = """\
examples:
  python translate.py --checkpoint best.ckpt < test.de > test.en
  python translate.py --checkpoint best.ckpt --input test.de --references test.en --beam-size 5
  python translate.py --checkpoint best.ckpt "Ein Hund rennt." --attention-dir attn/ --attention-heads
  python translate.py --checkpoint a.ckpt b.ckpt --weights 0.6 0.4 --input test.de
  python translate.py --checkpoint best.ckpt --sampling --topp 0.9 --seed 1 --input mono.de
  python translate.py --checkpoint best.ckpt --input test.de --score-references test.en
  python translate.py --checkpoint best.ckpt --input test.de --prefix prefixes.en
  python translate.py --checkpoint best.ckpt --input test.de --alignment-output test.align
  python translate.py --checkpoint best.ckpt --input terms.de --constraints   # source<TAB>term<TAB>...
"""


def build_parser() -> argparse.ArgumentParser:
    """Every option of ``translate.py``, in the groups ``--help`` lists."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_models(parser)
    io = parser.add_argument_group("input and output")
    _add_input_output(io)
    search = parser.add_argument_group("search")
    _add_search(search)
    _add_sampling(parser.add_argument_group("sampling (back-translation)"))
    # Added after the sampling options, as they always were: the usage line keeps its order.
    _add_lengths_and_batches(search)
    _add_target_lang(io)
    _add_running(parser.add_argument_group("running"))
    _add_attention(parser.add_argument_group("attention plots"))
    _add_alignment(parser.add_argument_group("word alignment"))
    return parser


def _add_models(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("sentences", nargs="*", metavar="SENTENCE", help="sentences to translate, one line each")
    add(
        "--checkpoint",
        required=True,
        nargs="+",
        metavar="PATH",
        help="checkpoint written by training; several: an ensemble, searched with the weighted mean of "
        "their log-probabilities at every step (their SentencePiece models must be the same); after "
        "the first, the values that end in .ckpt or .pt or name a file are checkpoints, the rest sentences",
    )
    add(
        "--weights",
        type=float,
        nargs="+",
        metavar="W",
        help="one weight per --checkpoint, normalised to sum to 1 (default: equal)",
    )


def _add_input_output(io: argparse._ArgumentGroup) -> None:
    io.add_argument("--input", metavar="FILE", help="read lines from FILE ('-': stdin; default: stdin)")
    io.add_argument("--output", metavar="FILE", help="write translations to FILE (default: stdout)")
    io.add_argument(
        "--nbest-output",
        metavar="FILE",
        help="write the n-best lists to FILE, tab-separated 'line_number rank score translation' "
        "(line numbers and ranks from 1, best first; score: log-probability / GNMT length penalty; "
        "empty input lines have no rows); stdout still gets one line per input line, the best",
    )
    io.add_argument(
        "--references",
        metavar="FILE",
        help="reference translations, one per input line: after translating, print sacreBLEU, chrF "
        "and TER with their signatures to stderr",
    )
    io.add_argument(
        "--bleu-tokenize",
        metavar="NAME",
        help="sacreBLEU's tokenizer for --references' BLEU (13a, intl, char, zh, ja-mecab, ...; "
        "default: sacreBLEU's choice for the target language: zh, ja-mecab, ko-mecab, else 13a)",
    )
    io.add_argument(
        "--score-references",
        metavar="FILE",
        help="score instead of translating: for each input line and the line of FILE with its number "
        "(a translation of it), write the translation's log-probability under the model (or the "
        "ensemble): 'sum<TAB>tokens<TAB>mean', tokens counting </s>; mean is minus the training NLL "
        "without label smoothing",
    )
    io.add_argument(
        "--buffer-size",
        type=int,
        metavar="N",
        help="translate at most N lines at a time, writing each part's lines before reading the next. "
        f"--input FILE: parts of N lines (default: {FILE_PART_LINES}); stdin: never wait for more "
        "once the lines that have arrived are taken (default: 1 on a terminal, else no limit: input "
        "that is all there is batched as a whole)",
    )
    io.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted --output file: keep its complete lines, skip the input lines "
        "they answer, append the rest (--nbest-output too)",
    )
    io.add_argument(
        "--shard",
        metavar="I/N",
        help="translate the I-th of N shards of --input FILE (I from 0): its parts of --buffer-size "
        "lines I, I+N, I+2N, ..., into --output OUT, beside which OUT.shard.json records what it holds; "
        "python3 -m translation.parts merges the N outputs into one",
    )


def _add_target_lang(io: argparse._ArgumentGroup) -> None:
    io.add_argument(
        "--target-lang",
        metavar="LANG",
        help="the language to translate into, for a model trained on several (data.target_lang_tags): "
        "its tag, e.g. <2fr>, goes before each input line",
    )


def _add_search(search: argparse._ArgumentGroup) -> None:
    search.add_argument(
        "--beam-size",
        type=int,
        default=None,
        metavar="K",
        help=f"beam width ({_checkpoint_default(DEFAULTS.beam_size)}; 1 is greedy with scores)",
    )
    search.add_argument(
        "--nbest",
        type=int,
        default=DEFAULTS.nbest,
        metavar="N",
        help="hypotheses per line for --nbest-output (default: %(default)s)",
    )
    search.add_argument(
        "--greedy", action="store_true", help="greedy search: fastest, no scores, ignores --beam-size"
    )
    search.add_argument(
        "--min-length",
        type=int,
        default=None,
        metavar="N",
        help="no output shorter than N subwords (</s> forbidden before; the length limit still wins) "
        f"({_checkpoint_default(DEFAULTS.min_len)})",
    )
    search.add_argument(
        "--no-repeat-ngram",
        type=int,
        default=None,
        metavar="N",
        help="no n-gram of N subwords occurs twice in an output "
        f"({_checkpoint_default(DEFAULTS.no_repeat_ngram)}: allowed)",
    )
    search.add_argument(
        "--prefix",
        metavar="FILE",
        help="one line per input line: its translation starts with that text, at the model's "
        "log-probabilities (an empty line forces nothing)",
    )
    search.add_argument(
        "--constraints",
        action="store_true",
        help="read each input line as 'source<TAB>constraint<TAB>constraint...': every translation "
        "(every n-best entry) contains each constraint, segmented by the target SentencePiece model as "
        "a line of its own (lexically constrained beam search with dynamic beam allocation; not with "
        "--greedy or --sampling); a line whose constraints are not met within its length limit "
        "(--max-len-a, --max-len-b) gets an empty output line and an error naming it",
    )
    search.add_argument(
        "--constraints-order",
        choices=CONSTRAINT_ORDERS,
        default=DEFAULTS.constraints_order,
        help="with --constraints: unordered, each somewhere (occurrences may overlap), or ordered, "
        "one after the other in the order given (default: %(default)s)",
    )


def _add_lengths_and_batches(search: argparse._ArgumentGroup) -> None:
    search.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        metavar="ALPHA",
        help="GNMT length penalty: score = log P / ((5 + length) / 6) ** ALPHA "
        f"({_checkpoint_default(DEFAULTS.alpha)}; 0: none)",
    )
    search.add_argument(
        "--max-len-a",
        type=float,
        default=None,
        metavar="A",
        help=f"at most A * source_length + B output tokens ({_checkpoint_default(DEFAULTS.max_len_a)})",
    )
    search.add_argument(
        "--max-len-b",
        type=int,
        default=None,
        metavar="B",
        help=f"see --max-len-a ({_checkpoint_default(DEFAULTS.max_len_b)})",
    )
    search.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="batch lines sorted by length so that each batch has at most N padded tokens, counting "
        "each source once per hypothesis (sentences x beam size x longest source; greedy counts 1): "
        "larger is faster and needs more memory; output order is the input order (default: "
        f"{DEFAULT_MAX_TOKENS} on the CPU, {ACCELERATOR_TOKENS} on a GPU)",
    )


def _add_sampling(sampling: argparse._ArgumentGroup) -> None:
    sampling.add_argument(
        "--sampling",
        action="store_true",
        help="draw each translation from the model's distribution instead of searching; --nbest N: N "
        "samples per line; a line's samples depend on --seed and the line only, never on the batch",
    )
    sampling.add_argument(
        "--topk",
        type=int,
        default=DEFAULTS.topk,
        metavar="K",
        help="draw from the K most likely subwords only (default: %(default)s: all; 1 is greedy)",
    )
    sampling.add_argument(
        "--topp",
        type=float,
        default=DEFAULTS.topp,
        metavar="P",
        help="draw from the fewest most likely subwords whose probability reaches P (default: %(default)s)",
    )
    sampling.add_argument(
        "--temperature",
        type=float,
        default=DEFAULTS.temperature,
        metavar="T",
        help="sharpen (T < 1) or flatten (T > 1) the distribution drawn from (default: %(default)s)",
    )
    sampling.add_argument("--seed", type=int, default=DEFAULTS.seed, help="(default: %(default)s)")


def _add_running(run: argparse._ArgumentGroup) -> None:
    run.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    run.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="weights' type: bfloat16 halves their memory and is faster on CPUs with native bf16 "
        "(AVX512-BF16, AMX) and on recent GPUs, slower where it is emulated (AVX2-only CPUs: a "
        "warning says so); a few outputs differ (speed and BLEU: BENCHMARKS.md, 'Decoding speed') "
        "(default: float32)",
    )
    run.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads for torch, in each worker with --workers (default: torch's choice; 1 per worker)",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="CPU only: search the batches in N processes of --threads threads each, a copy of the "
        "model in each; pays with small batches (--max-tokens), while big ones keep one process's "
        "threads busy and start-up takes a few seconds (BENCHMARKS.md, 'Decoding speed') "
        "(default: 1, this process)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar, no info messages; warnings stay")


def _add_attention(attention: argparse._ArgumentGroup) -> None:
    attention.add_argument(
        "--attention-dir",
        metavar="DIR",
        help="write PNG heatmaps of the best translation's cross-attention to DIR: line{N}.layer{L}.png "
        "per decoder layer, heads averaged, source subwords across, output subwords down; with an "
        "encoder whose attention is not softmax, also its self-attention: line{N}.encoder.layer{L}.png",
    )
    attention.add_argument(
        "--attention-heads",
        action="store_true",
        help="also write line{N}.layer{L}.heads.png with one panel per head",
    )
    attention.add_argument(
        "--attention-max-sentences",
        type=int,
        default=20,
        metavar="N",
        help="plot the first N non-empty lines (default: 20)",
    )


def _add_alignment(alignment: argparse._ArgumentGroup) -> None:
    alignment.add_argument(
        "--alignment-output",
        metavar="FILE",
        help="write each line's word alignment to FILE, one line per input line: 'i-j' links, 0-based, i a "
        "word of the source line, j a word of its output line (both split on whitespace), each output "
        "word linked to the source word it attends to most; with --nbest-output, every row gets its "
        "alignment as a fifth column. Read from a forced pass over the translations: they stay the same",
    )
    alignment.add_argument(
        "--alignment-layer",
        type=int,
        metavar="N",
        help="the decoder layer whose cross-attention (heads averaged) aligns, from 1; negative from the "
        f"end (default: {DEFAULT_LAYER}, the last: it aligned best, BENCHMARKS.md 'Word alignment')",
    )
