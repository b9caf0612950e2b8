"""translate.py end to end: a checkpoint trained here on a toy task, run through the command line.

The toy task maps each word of a small "German" lexicon to its "English" word, in order; a tiny
Transformer learns it in a few seconds. Each subprocess run costs ~2 s of imports, so the runs
are few and each checks several things; error paths run in-process through ``main``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
import torch.nn.functional as F

import translate
from bench.uncached import Recomputing
from common.checkpoint_fields import inference_fields
from decoding.budget import ACCELERATOR_TOKENS
from fastpaths import hardware
from fastpaths.packed import PackedLinear
from tests.toy_text import LEXICON, toy_pairs, train_word_spm, translate_words
from transformer import Transformer, TransformerConfig
from translation.checkpoint import write_checkpoint
from translation.options import CHECKPOINT_SEARCH
from translation.translator import DEFAULT_MAX_TOKENS, SearchOptions, Translator

ROOT = Path(__file__).resolve().parents[1]
PAD, BOS, EOS = 0, 2, 3
MAX_POSITIONS = 32  # small, so that an over-long line is easy to write
# Held-out sentences (lengths 1-5, inside the training range) and their translations.
TEST_SOURCES = [
    "ein hund läuft",
    "die katze",  # "die" is unknown: whatever comes out, one line
    "der kleine mann sitzt",
    "kind",
    "eine",
    "große blaue wiese über straße",
    "frau springt schnell",
]


def pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


@pytest.fixture(scope="module")
def toy_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Transformer trained on the toy task (~4 s), saved with ``write_checkpoint``."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    pairs = toy_pairs(2000, seed=0)
    src_proto = train_word_spm([s for s, _ in pairs])
    tgt_proto = train_word_spm([t for _, t in pairs])
    src_sp = spm.SentencePieceProcessor(model_proto=src_proto)
    tgt_sp = spm.SentencePieceProcessor(model_proto=tgt_proto)
    src_ids = [ids + [EOS] for ids in src_sp.encode([s for s, _ in pairs])]
    tgt_ids = tgt_sp.encode([t for _, t in pairs])
    cfg = TransformerConfig(
        src_vocab_size=src_sp.get_piece_size(),
        tgt_vocab_size=tgt_sp.get_piece_size(),
        d_model=64,
        n_heads=4,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=128,
        dropout=0.0,
        max_positions=MAX_POSITIONS,
    )
    model = Transformer(cfg)
    steps, peak_lr = 300, 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=peak_lr)
    rng = random.Random(1)
    for step in range(steps):
        batch = rng.sample(range(len(pairs)), 64)
        src = pad([src_ids[i] for i in batch])
        tgt_in = pad([[BOS] + tgt_ids[i] for i in batch])
        tgt_out = pad([tgt_ids[i] + [EOS] for i in batch])
        loss = F.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt_out, ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for group in optimizer.param_groups:  # linear decay over the second half
            group["lr"] = peak_lr * min(1.0, 2.0 * (1 - (step + 1) / steps))
    path = tmp_path_factory.mktemp("toy") / "toy.ckpt"
    write_checkpoint(path, model.eval(), inference_fields(src_proto, tgt_proto, "de", "en"))
    return path


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """``python translate.py ARGS`` from the repository root, one thread."""
    return subprocess.run(
        [sys.executable, "translate.py", "--threads", "1", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        timeout=300,
    )


def lines_of(output: bytes) -> list[str]:
    """Output split on ``\\n`` only; every line must end with ``\\n``."""
    assert output == b"" or output.endswith(b"\n")
    return output.decode("utf-8").split("\n")[:-1]


def test_toy_model_learned_the_task(toy_checkpoint: Path) -> None:
    translator = Translator.from_checkpoint(toy_checkpoint)
    known = [s for s in TEST_SOURCES if all(w in LEXICON for w in s.split())]
    assert translator.translate(known, SearchOptions(greedy=True)) == [translate_words(s) for s in known]


@pytest.fixture(scope="module")
def toy_run(toy_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One CLI run on TEST_SOURCES with references, n-best output and attention plots."""
    tmp = tmp_path_factory.mktemp("toy_run")
    (tmp / "test.de").write_text("".join(s + "\n" for s in TEST_SOURCES), encoding="utf-8")
    (tmp / "test.en").write_text("".join(translate_words(s) + "\n" for s in TEST_SOURCES), encoding="utf-8")
    result = run_cli(
        "--checkpoint", str(toy_checkpoint),
        "--input", str(tmp / "test.de"),
        "--references", str(tmp / "test.en"),
        "--nbest", "3",
        "--nbest-output", str(tmp / "nbest.tsv"),
        "--attention-dir", str(tmp / "attention"),
        "--attention-heads",
        "--attention-max-sentences", "2",
    )  # fmt: skip
    return {"result": result, "dir": tmp}


def test_cli_translates_the_toy_task(toy_run: dict) -> None:
    result = toy_run["result"]
    assert result.returncode == 0, result.stderr.decode()
    out = lines_of(result.stdout)
    assert len(out) == len(TEST_SOURCES)
    for source, hyp in zip(TEST_SOURCES, out, strict=True):
        if all(w in LEXICON for w in source.split()):
            assert hyp == translate_words(source), source
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr
    # Scores with their signatures on stderr; stdout holds only the translations.
    assert "BLEU" in stderr and "chrF" in stderr and "nrefs:1" in stderr
    assert b"BLEU" not in result.stdout


def test_cli_nbest_output_is_sorted_and_matches_stdout(toy_run: dict) -> None:
    best = lines_of(toy_run["result"].stdout)
    rows = [line.split("\t") for line in (toy_run["dir"] / "nbest.tsv").read_text("utf-8").splitlines()]
    by_line: dict[int, list[tuple[int, float, str]]] = {}
    for number, rank, score, text in rows:
        by_line.setdefault(int(number), []).append((int(rank), float(score), text))
    assert sorted(by_line) == list(range(1, len(TEST_SOURCES) + 1))
    for number, hyps in by_line.items():
        assert [rank for rank, _, _ in hyps] == [1, 2, 3]
        scores = [score for _, score, _ in hyps]
        assert scores == sorted(scores, reverse=True)
        assert hyps[0][2] == best[number - 1]


def test_cli_writes_attention_plots(toy_run: dict) -> None:
    names = sorted(p.name for p in (toy_run["dir"] / "attention").iterdir())
    assert names == [
        "line1.layer1.heads.png",
        "line1.layer1.png",
        "line2.layer1.heads.png",
        "line2.layer1.png",
    ]
    for name in names:
        assert (toy_run["dir"] / "attention" / name).read_bytes().startswith(b"\x89PNG")


def test_cli_stdin_and_tiny_token_budget_give_the_same_output(toy_checkpoint: Path, toy_run: dict) -> None:
    # --max-tokens 5 is below the longest line (5 words + </s>): one line per batch, and that
    # line alone; the default budget puts every line in one batch. Same output, same order.
    stdin = "".join(s + "\n" for s in TEST_SOURCES).encode("utf-8")
    result = run_cli("--checkpoint", str(toy_checkpoint), "--max-tokens", "5", stdin=stdin)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == toy_run["result"].stdout


# (input line, expected output or None for "any single line")
HOSTILE_CASES: list[tuple[bytes, str | None]] = [
    (b"ein hund l\xc3\xa4uft", "a dog runs"),
    (b"", ""),
    (b"   ", ""),
    (b"\t \t", ""),
    (b"\r", ""),
    (b"\x0c", ""),
    ("\u2028".encode(), ""),
    (b"der kleine mann sitzt\r", "the small man sits"),  # CRLF line end
    (b"kind\rfrau", "child woman"),  # \r inside a line
    ("kind\u2028frau".encode(), "child woman"),
    ("kind\x85frau".encode(), "child woman"),
    (b"kind\x0cfrau", "child woman"),
    (b"ein \xff\xfe hund", "a dog"),  # invalid UTF-8
    (b"\xc3", None),  # invalid UTF-8 only
    (b"hund " * 100, None),  # longer than max_positions
    (b"ein\x00hund", None),
]


def hostile_input(n: int = 1000) -> tuple[bytes, list[str | None]]:
    """``n`` lines cycling through HOSTILE_CASES, no final newline; and the expected outputs."""
    cases = [HOSTILE_CASES[i % len(HOSTILE_CASES)] for i in range(n)]
    return b"\n".join(raw for raw, _ in cases), [expected for _, expected in cases]


def test_cli_hostile_input_keeps_every_line(toy_checkpoint: Path, tmp_path: Path) -> None:
    raw, expected = hostile_input()
    assert raw.count(b"\n") == 999 and not raw.endswith(b"\n")
    (tmp_path / "hostile.txt").write_bytes(raw)
    beam1 = run_cli("--checkpoint", str(toy_checkpoint), "--beam-size", "1", "--max-tokens", "64", stdin=raw)
    greedy = run_cli(
        "--checkpoint", str(toy_checkpoint),
        "--greedy",
        "--input", str(tmp_path / "hostile.txt"),
        "--output", str(tmp_path / "hostile.out"),
    )  # fmt: skip
    for result in (beam1, greedy):
        assert result.returncode == 0, result.stderr.decode()
        assert "Traceback" not in result.stderr.decode()
    assert greedy.stdout == b""
    out_bytes = (tmp_path / "hostile.out").read_bytes()
    # Beam size 1 is greedy search, through the whole command line.
    assert beam1.stdout == out_bytes
    for bad in (b"\r", "\u2028".encode(), "\x85".encode(), b"\x0c"):
        assert bad not in out_bytes
    out = lines_of(out_bytes)
    assert len(out) == 1000
    for number, (hyp, want) in enumerate(zip(out, expected, strict=True), start=1):
        if want is not None:
            assert hyp == want, f"line {number}"
    # Warnings name the lines: invalid UTF-8 (cases 13 and 14) and the over-long line (case 15).
    stderr = beam1.stderr.decode()
    assert "<stdin> line 13: invalid UTF-8" in stderr
    assert "<stdin> line 14: invalid UTF-8" in stderr
    assert "<stdin> line 15: 100 subword tokens, cropped to the first 31" in stderr
    assert f"{tmp_path / 'hostile.txt'} line 31: 100 subword tokens" in greedy.stderr.decode()


def test_cli_target_lang_the_model_was_not_trained_for_is_a_one_line_error(toy_checkpoint: Path) -> None:
    result = run_cli("--checkpoint", str(toy_checkpoint), "--target-lang", "fr", stdin=b"ein hund\n")
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode() == "translate.py: error: this model translates into en only, not fr\n"


def test_cli_truncated_checkpoint_is_a_one_line_error(toy_checkpoint: Path, tmp_path: Path) -> None:
    data = toy_checkpoint.read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    result = run_cli("--checkpoint", str(truncated), stdin=b"ein hund\n")
    assert result.returncode == 2
    assert result.stdout == b""
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr
    assert stderr.count("\n") == 1 and stderr.startswith("translate.py: error: ")
    assert str(truncated) in stderr and "truncated" in stderr


def test_translate_imports_neither_lightning_nor_hydra() -> None:
    # matplotlib and sacrebleu: only when asked; torch's compiler (sympy among its ~800 modules,
    # ~70 MiB of the 400): training's loss only, not the fast paths translate.py applies.
    heavy = ("lightning", "hydra", "datasets", "matplotlib", "sacrebleu", "torch._dynamo", "sympy")
    code = (
        "import sys, torch, translate\n"
        "from fastpaths.optimize import optimize\n"
        "optimize(torch.nn.Linear(2, 2), 'cpu', 'inference')\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "[]"


# ---------------------------------------------------------------- in-process, through main()


def test_sentences_as_arguments(toy_checkpoint: Path, capsysbinary: pytest.CaptureFixture) -> None:
    status = translate.main(
        ["--checkpoint", str(toy_checkpoint), "--quiet", "ein hund läuft", "kind\nfrau", " "]
    )
    captured = capsysbinary.readouterr()
    assert status == 0, captured.err
    assert captured.out == b"a dog runs\nchild woman\n\n"


def test_two_workers_give_the_same_lines(toy_checkpoint: Path, capsysbinary: pytest.CaptureFixture) -> None:
    # --max-tokens 8: several batches, so both worker processes translate some.
    common = [
        "--checkpoint",
        str(toy_checkpoint),
        "--quiet",
        "--max-tokens",
        "8",
        "--nbest",
        "2",
        *TEST_SOURCES,
    ]
    assert translate.main(common) == 0
    one = capsysbinary.readouterr().out
    assert translate.main([*common, "--workers", "2", "--threads", "1"]) == 0
    two = capsysbinary.readouterr().out
    assert two == one and len(lines_of(two)) == len(TEST_SOURCES)


def test_bfloat16_weights_translate_the_toy_task(
    toy_checkpoint: Path, capsysbinary: pytest.CaptureFixture
) -> None:
    args = [
        "--checkpoint",
        str(toy_checkpoint),
        "--quiet",
        "--dtype",
        "bfloat16",
        "ein hund läuft",
        "kind frau",
    ]
    assert translate.main(args) == 0
    assert capsysbinary.readouterr().out == b"a dog runs\nchild woman\n"
    assert (
        next(Translator.from_checkpoint(toy_checkpoint, dtype=torch.bfloat16).model.parameters()).dtype
        == torch.bfloat16
    )


def test_bfloat16_on_a_cpu_without_native_bf16_translates_and_says_it_is_slow(
    toy_checkpoint: Path, capsysbinary: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AVX2-only CPU, as PyTorch would report it: the packed bf16 weights go through fp32
    packing (oneDNN refuses bf16 there), the outputs are the native path's, and one warning says why."""
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    args = ["--checkpoint", str(toy_checkpoint), "--dtype", "bfloat16", "ein hund läuft", "kind frau"]
    assert translate.main(args) == 0
    out = capsysbinary.readouterr()
    assert out.out == b"a dog runs\nchild woman\n"
    warnings = [line for line in out.err.decode().splitlines() if "emulated" in line]
    assert len(warnings) == 1 and "native bf16 is False" in warnings[0]


def untrained_checkpoint(directory: Path) -> Path:
    """A checkpoint of an untrained Transformer of width 16 on word vocabularies: cheap enough for
    an emulated CPU (its outputs are arbitrary, the same ones however they are computed)."""
    pairs = toy_pairs(50, seed=0)
    src_proto, tgt_proto = train_word_spm([s for s, _ in pairs]), train_word_spm([t for _, t in pairs])
    vocab = [spm.SentencePieceProcessor(model_proto=p).get_piece_size() for p in (src_proto, tgt_proto)]
    torch.manual_seed(0)
    cfg = TransformerConfig(*vocab, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32)
    path = directory / "untrained.ckpt"
    write_checkpoint(path, Transformer(cfg).eval(), inference_fields(src_proto, tgt_proto, "de", "en"))
    return path


def cpu_report(model: Transformer, _: object) -> tuple[int, str, bool, frozenset[torch.dtype]]:
    """A worker's job: its pid, the CPU capability and native bf16 it sees, its packs' dtypes."""
    packs = frozenset(
        key[-1]
        for module in model.modules()
        if isinstance(module, PackedLinear)
        for key, _, _ in module._packs.values()
    )
    return os.getpid(), torch.backends.cpu.get_cpu_capability(), hardware.native_bf16(), packs


@pytest.mark.cpu_dependent
def test_bfloat16_in_two_workers_packs_as_the_workers_own_cpu_says(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """translate.py --dtype bfloat16 --workers 2, two lines: the spawned workers, which no
    monkeypatch reaches, see this CPU's capability and pack bf16 as it computes it (in fp32 on an
    AVX2-only CPU, as in .ci/run's emulated run); they translate as one process does."""
    reports = []
    real_pool = translate.worker_pool

    @contextmanager
    def reporting_pool(*args: object) -> Iterator[object]:
        with real_pool(*args) as pool:
            yield pool
            if pool is not None:  # None: one process, no workers
                reports.extend(report for _, report in pool.imap_unordered(cpu_report, range(4)))

    monkeypatch.setattr(translate, "worker_pool", reporting_pool)
    args = ["--checkpoint", str(untrained_checkpoint(tmp_path)), "--dtype", "bfloat16", "--max-tokens", "8"]
    args += ["ein hund läuft", "kind frau"]
    assert translate.main(args) == 0
    one = capsysbinary.readouterr()
    assert translate.main([*args, "--workers", "2", "--threads", "1"]) == 0
    two = capsysbinary.readouterr()
    assert two.out == one.out and len(lines_of(two.out)) == 2, two.err.decode()
    native, capability = hardware.native_bf16(), torch.backends.cpu.get_cpu_capability()
    assert ("bfloat16 is emulated" in two.err.decode()) is not native
    packed_in = frozenset({torch.bfloat16 if native else torch.float32})
    assert reports and {report[1:] for report in reports} == {(capability, native, packed_in)}
    assert os.getpid() not in {report[0] for report in reports}


def test_cached_equals_recomputed_through_the_translator(
    toy_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    translator = Translator.from_checkpoint(toy_checkpoint)
    sources = translator.encode_sources(TEST_SOURCES)
    for options in (SearchOptions(greedy=True), SearchOptions(beam_size=4, nbest=4)):
        cached = translator.translate_ids(sources, options)
        with monkeypatch.context() as patch:  # the same translator, its model searched without caches
            patch.setattr(translator, "model", Recomputing(translator.model))
            recomputed = translator.translate_ids(sources, options)
        assert [[h.tokens for h in hyps] for hyps in cached] == [
            [h.tokens for h in hyps] for hyps in recomputed
        ]


def _foreign_files(tmp_path: Path, toy_checkpoint: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, a phrase its error message must contain)."""
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    torch.save({"opaque": random.Random(0)}, tmp_path / "pickled.pt")
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    return {
        "missing": (tmp_path / "missing.ckpt", "no such file"),
        "directory": (tmp_path, "not a file"),
        "text": (tmp_path / "notes.txt", "not a PyTorch checkpoint"),
        "other torch file": (tmp_path / "other.pt", "not a checkpoint of this project"),
        "arbitrary pickle": (tmp_path / "pickled.pt", "weights_only=True refuses"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "text", "other torch file", "arbitrary pickle"])
def test_bad_checkpoints_are_one_line_errors(
    case: str, toy_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path, phrase = _foreign_files(tmp_path, toy_checkpoint)[case]
    status = translate.main(["--checkpoint", str(path), "ein hund"])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err.startswith("translate.py: error: ") and captured.err.count("\n") == 1
    assert str(path) in captured.err and phrase in captured.err


def test_reference_count_mismatch_is_an_error(
    toy_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "ref.en").write_text("a dog\nthe cat\nchild\n")
    status = translate.main(
        ["--checkpoint", str(toy_checkpoint), "--quiet", "--references", str(tmp_path / "ref.en"), "ein hund"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert "has 3 lines" in err and "has 1" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--beam-size", "2", "--nbest", "3"],
            "--nbest 3 must be between 1 and the beam size (--beam-size 2)",
        ),
        (["--greedy", "--nbest-output", "x.tsv"], "--nbest-output needs beam search"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--input", "a.txt", "ein hund"], "not both"),
    ],
)
def test_bad_options_are_argparse_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--checkpoint", "unused.ckpt", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_search_defaults_are_the_search_options_and_help_shows_them(capsys: pytest.CaptureFixture) -> None:
    args = translate.parse_args(["--checkpoint", "unused.ckpt"])
    defaults = SearchOptions()
    # Not given: None, which the checkpoint's settings fill once it is read; the project's before.
    assert all(getattr(args, option) is None for option in CHECKPOINT_SEARCH.values())
    assert translate.search_options(args) == defaults == args.decoding
    assert args.max_tokens is None  # the device's budget (decoding.budget)
    with pytest.raises(SystemExit):
        translate.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    assert f"(default: {DEFAULT_MAX_TOKENS} on the CPU, {ACCELERATOR_TOKENS} on a GPU)" in shown
    assert f"(default: {defaults.nbest})" in shown
    for field in CHECKPOINT_SEARCH:
        value = getattr(defaults, field)
        assert (
            f"default: the checkpoint's, as its test stage searched; {value} where it does not say" in shown
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_unavailable_device_is_a_one_line_error(toy_checkpoint: Path, capsys: pytest.CaptureFixture) -> None:
    status = translate.main(["--checkpoint", str(toy_checkpoint), "--device", "cuda", "ein hund"])
    err = capsys.readouterr().err
    assert status == 2
    assert "CUDA is not available" in err and err.count("\n") == 1
