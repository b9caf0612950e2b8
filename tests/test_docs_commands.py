"""Every command in README.md, docs/*.md and BENCHMARKS.md is one the project accepts.

Checked as far as it can be without running it: a ``train.py`` command's overrides compose with
Hydra as ``train.py`` composes them (a misspelled key or group option fails), and its attention
settings pass ``AttentionConfig``'s checks, which ``train.py`` makes when it reads the config; a
script's options parse with the script's own parser (``translate.py``'s, ``python3 -m
translation.export``'s, each ``bench/`` script's, stopped right after parsing); ``pip install``'s
extras exist in pyproject.toml; ``pytest -m`` names declared markers; ``bash`` scripts exist.
Placeholders (``CKPT``, ``<run>``, ``$SLURM_JOB_ID``) stand for values a reader fills in and are
given dummy ones. The README's Layout table names every module of the five packages.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from transformer.mechanisms import AttentionConfig

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("transformer", "decoding", "fastpaths", "data", "common", "training", "translation")
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}


def _fenced_lines(text: str) -> list[str]:
    """Lines of shell code blocks, backslash continuations joined."""
    lines, inside, shell = [], False, False
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            inside, shell = (not inside, fence.group(1) in SHELL_FENCES) if not inside else (False, False)
            continue
        if inside and shell:
            if lines and lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1].rstrip() + " " + line.strip()
            else:
                lines.append(line.strip())
    return lines


def commands(text: str) -> list[str]:
    """The commands of a Markdown text: its shell code blocks' lines and its inline code spans
    that start with ``python``, ``python3`` or ``bash`` and give at least one argument."""
    found = [line for line in _fenced_lines(text) if line and not line.startswith("#")]
    flat = re.sub(r"\n\s*", " ", text)  # inline spans wrapped across lines
    for span in re.findall(r"(?<!`)`((?:python3?|bash) [^`]+)`(?!`)", flat):
        words = span.split()
        program = 3 if words[1] == "-m" else 2  # `python3 -m translation.export` names a program
        if len(words) > program and "..." not in span:
            found.append(span)
    return list(dict.fromkeys(found))


def _dummy(word: str) -> str:
    """A placeholder given a value: CKPT, <run>, <c1a1586>, $SLURM_JOB_ID, PATH."""
    word = re.sub(r"<([^<>]*)>", lambda m: re.sub(r"\W", "_", m.group(1)) or "x", word)
    word = re.sub(r"\$\{?(\w+)\}?", r"\1", word)
    return "dummy.ckpt" if word == "CKPT" else word


def argv(command: str) -> list[str]:
    """The words of a command, its comment, redirections and placeholders taken care of."""
    words = [_dummy(word) for word in shlex.split(command, comments=True)]
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("<", ">", ">>", "2>", "|"):
            skip = True  # the file of a redirection
        elif not re.match(r"^[0-9]?[<>]", word):  # else a redirection with its file in one word
            kept.append(word)
    return kept


# -- the checkers, one per program ---------------------------------------------------------------


def check_train(args: list[str]) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=args, return_hydra_config=True)
    attention = AttentionConfig.from_dict(dict(cfg.model.get("attention") or {}))
    attention.check_dropout(float(cfg.model.get("attention_dropout", 0.0)))


def _pyproject_extras() -> set[str]:
    """The extras of pyproject.toml (read by pattern: tomllib is not in Python 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, flags=re.M))


def _pyproject_markers() -> set[str]:
    """The pytest markers declared in pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("markers = [", 1)[1].split("]", 1)[0]
    return set(re.findall(r"^\s*\"([\w-]+):", section, flags=re.M))


class _ParsedError(Exception):
    """Raised by the patched parse_args: the options parsed, the program goes no further."""


def _parse_only(monkeypatch: pytest.MonkeyPatch, script: Path, args: list[str]) -> None:
    """Runs a script's main() until its argument parser has parsed ``args``."""
    if "ArgumentParser" not in script.read_text():
        assert not args, f"{script.name} takes no options: {args}"
        return
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):  # noqa: ANN001, ANN202
        original(self, args, namespace)
        raise _ParsedError

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    monkeypatch.syspath_prepend(str(script.parent))  # scripts that import their neighbours
    spec = importlib.util.spec_from_file_location(f"_docs_check_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as err:  # an optional extra the script imports at the top
        pytest.skip(f"{script.name} needs {err.name}, not installed")
    with pytest.raises(_ParsedError):
        module.main()


def check_python(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    if args[:2] == ["-m", "pip"]:
        extras = _pyproject_extras()
        for word in args:
            for extra in re.findall(r"^[.\w-]*\[([\w,-]+)\]$", word.strip("\"'")):
                assert set(extra.split(",")) <= set(extras), f"no such extra in pyproject.toml: {word}"
        return
    if args[:2] == ["-m", "pytest"]:
        declared = _pyproject_markers()
        for flag, value in zip(args, args[1:], strict=False):
            if flag == "-m" and value != "pytest":
                used = set(re.findall(r"\w+", value)) - {"and", "or", "not"}
                assert used <= declared, f"undeclared pytest marker(s): {used - declared}"
        return
    if args[:2] == ["-m", "venv"] or args[:1] == ["-c"]:
        return
    if args[:2] == ["-m", "translation.export"]:
        from translation.export.__main__ import build_parser

        build_parser().parse_args(args[2:])
        return
    if args[0] == "-m":  # a module of ours run as a program: its file's parser
        module_path = ROOT / args[1].replace(".", "/")
        script = module_path / "__main__.py" if module_path.is_dir() else module_path.with_suffix(".py")
        assert script.is_file(), f"no such module: {args[1]}"
        _parse_only(monkeypatch, script, args[2:])
        return
    script, rest = ROOT / args[0], args[1:]
    assert script.is_file(), f"no such script: {args[0]}"
    if script.name == "train.py" and script.parent == ROOT:
        check_train(rest)
    elif script.name == "translate.py" and script.parent == ROOT:
        import translate

        translate.parse_args(rest)  # the parser and translate.py's own checks of the options
    else:
        _parse_only(monkeypatch, script, rest)


def check(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Raises (or fails) where ``command`` is not one the project accepts."""
    words = argv(command)
    # A launcher (srun, torchrun and its options, an environment assignment) may come first.
    ours = [i for i, w in enumerate(words) if re.fullmatch(r"python3?(\.\d+)?|bash|\S*train\.py", w)]
    if not ours:
        return  # other programs (tensorboard, mlflow, huggingface-cli, mkdir) are not ours
    words = words[ours[0] :]
    program = words[0]
    if program.endswith("train.py"):  # torchrun's script, without python in front
        check_train(words[1:])
    elif re.fullmatch(r"python3?(\.\d+)?", program):
        try:
            check_python(monkeypatch, words[1:])
        except SystemExit as err:  # argparse's error(): it printed the reason
            if err.code not in (0, None):
                raise AssertionError(f"options refused by the script's parser: {command}") from err
    elif program == "bash":
        assert (ROOT / words[1]).is_file(), f"no such script: {words[1]}"


ALL = [(doc.relative_to(ROOT).as_posix(), c) for doc in DOCUMENTS for c in commands(doc.read_text())]


@pytest.mark.parametrize(("document", "command"), ALL, ids=[f"{d}: {c[:70]}" for d, c in ALL])
def test_every_documented_command_is_accepted(document, command, monkeypatch):
    check(command, monkeypatch)


def test_the_commands_are_found():
    programs = [argv(c)[0] for _, c in ALL]
    assert sum("train.py" in c for _, c in ALL) >= 20
    assert {"python3", "bash"} <= set(programs)
    readme = commands((ROOT / "README.md").read_text())
    # .ci/run sets up and tests exactly as README.md says.
    for needed in ('python3 -m pip install -e ".[dev]"', "python3 -m pytest -q"):
        assert needed in readme
    assert "python3 train.py experiment=multi30k_de_en" in readme
    # One example command for each of the mechanisms.
    mechanisms = {m for c in readme for m in re.findall(r"model\.attention\.\w+=(\w+)", c)}
    eight = {"softmax", "local", "sparse", "atrous", "lsh", "linear", "performer", "linformer", "nystrom"}
    assert mechanisms >= eight  # sparse and atrous are one family


def test_the_extraction_reads_blocks_spans_and_continuations():
    text = (
        "Run `python3 translate.py --checkpoint CKPT --beam-size 5` or\n"
        "```bash\n# a comment\npython3 train.py \\\n    model=tiny  # why\ntensorboard --logdir runs/\n```\n"
        "```python\nprint('not a command')\n```\n"
    )
    assert commands(text) == [
        "python3 train.py model=tiny  # why",
        "tensorboard --logdir runs/",
        "python3 translate.py --checkpoint CKPT --beam-size 5",
    ]
    assert argv("python3 translate.py --checkpoint <run>/x.ckpt < in.de > out.en") == [
        "python3",
        "translate.py",
        "--checkpoint",
        "run/x.ckpt",
    ]


@pytest.mark.parametrize(
    "command",
    [
        "python3 train.py model.attention.encoder_sel=performer",  # a misspelled key
        "python3 train.py experiment=multi30k_de_e",  # a group option that does not exist
        "python3 train.py model.attention.decoder_self=nystrom",  # a role the mechanism refuses
        "python3 translate.py --checkpoint CKPT --beam-sise 5",  # a misspelled option
        "python3 translate.py --checkpoint CKPT --greedy --nbest 2",  # refused by translate.py's checks
        "python3 -m translation.export --checkpoint CKPT --format onnx --output x",
        "python3 bench/train_speed.py --runds 12",
        "python3 bench/no_such_script.py",
        'python3 -m pip install -e ".[no_such_extra]"',
        'python3 -m pytest -m "not no_such_marker"',
        "srun python3 train.py trainer=ddp trainer.devics=4",
    ],
)
def test_a_wrong_command_fails(command, monkeypatch):
    # Hydra's exception, argparse's error (an AssertionError here) or an assert: any of them.
    with pytest.raises(Exception):  # noqa: B017
        check(command, monkeypatch)


def test_the_layout_table_names_every_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    rows = {row.split("|")[1].strip(" `"): row for row in layout.splitlines() if row.startswith("| `")}
    missing = []
    for package in PACKAGES:
        row = rows.get(f"{package}/", "")
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py" and f"`{path.name}`" not in row:
                missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, f"README.md's Layout table does not name: {missing}"


def _headings(path: Path) -> list[str]:
    return re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)


def test_pointers_to_readme_and_docs_sections_exist():
    """`README "Set up"`, `(docs/long_runs.md, "Where the corpus comes from")`: a heading starts so."""
    sources = [
        *DOCUMENTS,
        ROOT / "pyproject.toml",
        ROOT / ".ci" / "run",
        *sorted((ROOT / "conf").rglob("*.yaml")),
    ]
    sources += sorted(p for p in ROOT.glob("*/**/*.py") if ".venv" not in p.parts and "runs" not in p.parts)
    missing, found = [], 0
    for source in (p for p in sources if p.is_file()):
        flat = re.sub(r"\n\s*#?\s*", " ", source.read_text())
        pattern = r"\b(README(?:\.md)?|docs/\w+\.md)\W{0,4}\"([A-Z][^\"]{2,80})\""
        for target, name in re.findall(pattern, flat):
            document = ROOT / ("README.md" if target.startswith("README") else target)
            found += 1
            if not any(h.startswith(name) for h in _headings(document)):
                missing.append(f"{source.relative_to(ROOT)}: {target}, {name!r}")
    assert found >= 5
    assert not missing, f"no such section: {missing}"
