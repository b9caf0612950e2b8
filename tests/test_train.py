"""train.py as a new user runs it: a checkout with no ../shared beside it, and no network; a tiny
run whose precision this CPU chooses, and whose output has no library's deprecation noise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastpaths import hardware
from tests.toy_text import tiny_run_overrides, write_toy_corpus

# train.py as a user starts it: a process each (the second tier, python3 -m pytest -m slow).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_no_local_corpus_and_no_hub_is_one_message_without_traceback(tmp_path: Path) -> None:
    # A copy of the program, so that its ../shared/data/multi30k truly does not exist (the path is
    # computed from the package location); HF_HUB_OFFLINE and an empty cache stand for no network.
    project = tmp_path / "checkout" / "nmt-transformer"
    for name in (
        "train.py",
        "conf",
        "data",
        "training",
        "transformer",
        "decoding",
        "fastpaths",
        "translation",
    ):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            project.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, project / name)
    shared = tmp_path / "checkout" / "shared" / "data" / "multi30k"
    assert not shared.exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MULTI30K"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), MULTI30K_DIR="")
    proc = subprocess.run(
        [sys.executable, "train.py", "experiment=smoke", "data.data_dir=null", f"paths.runs_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out, out
    error = proc.stderr[proc.stderr.index("train.py: error: ") :]
    assert "bentrevett/multi30k cannot be read (HF_HUB_OFFLINE is set)" in error
    for option in ("data.data_dir=PATH", "$MULTI30K_DIR=PATH", str(shared)):
        assert option in error, error
    # The log line said which source was tried, and why.
    assert "corpus: Hugging Face hub dataset bentrevett/multi30k" in out and f"{shared} absent" in out


def test_a_damaged_corpus_is_one_message_naming_file_and_line_without_traceback(tmp_path: Path) -> None:
    # Each defect's message is tests/data/test_prepared.py's; this is the way train.py prints them.
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 40, "val": 2, "test": 2})
    lines = (corpus / "train.de").read_bytes().split(b"\n")
    lines[6] = b"ein \xe4 hund"  # Latin-1, not UTF-8
    (corpus / "train.de").write_bytes(b"\n".join(lines))
    overrides = [*tiny_run_overrides(corpus, tmp_path / "cache"), f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(
        [sys.executable, "train.py", *overrides], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out, out[-3000:]
    error = proc.stderr[proc.stderr.index("train.py: error: ") :].strip()
    assert len(error.splitlines()) == 1, error
    assert f"{corpus / 'train.de'}: invalid UTF-8 at line 7, byte 4 of the line" in error
    assert "data.bad_lines=skip" in error


def test_a_setting_left_to_the_command_line_is_one_message_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "train.py", "experiment=multi30k_de_en_bt", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    error = proc.stderr[proc.stderr.index("train.py: error: ") :].strip()
    said = "bt_dir must be given (used by data.corpora[1].data_dir): add bt_dir=VALUE"
    assert error == f"train.py: error: {said}"


def test_a_tiny_auto_precision_run_says_its_precision_and_no_library_deprecation(tmp_path: Path) -> None:
    """python train.py trainer.precision=auto: two updates, a validation and a test, in bf16-mixed
    where this CPU computes bf16 natively, else 32-true; the log says why, and Lightning's treespec
    deprecation warning is not in the output (training/pipeline.py). The same run in-process is
    tests/training/test_pipeline.py's, which .ci/run also runs on an emulated AVX2-only CPU."""
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 40, "val": 2, "test": 2})
    run = tmp_path / "run"
    overrides = [*tiny_run_overrides(corpus, tmp_path / "cache"), f"hydra.run.dir={run}"]
    proc = subprocess.run(
        [sys.executable, "train.py", *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    results = json.loads((run / "results.json").read_text())
    native, capability = hardware.native_bf16(), torch.backends.cpu.get_cpu_capability()
    expected = "bf16-mixed" if native else "32-true"
    assert results["precision"] == expected and results["ending_update"] == 2
    assert f"CPU capability {capability} " in results["precision_reason"]
    assert f"precision: {expected} (trainer.precision=auto): {'' if native else 'no '}native bf16" in out
    assert {"train/loss", "val/bleu", "test/bleu"} <= set(results)
    assert "LeafSpec" not in out and "treespec" not in out


def test_init_from_beside_ckpt_path_is_one_message_naming_both_without_traceback(tmp_path: Path) -> None:
    """train.py prints a fine-tuning refusal (training/start/) as it prints a missing corpus:
    one line, before anything is trained or prepared."""
    ckpt = tmp_path / "a.ckpt"
    ckpt.write_bytes(b"")
    overrides = [
        "experiment=smoke",
        f"init_from={ckpt}",
        f"ckpt_path={ckpt}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(
        [sys.executable, "train.py", *overrides], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out, out
    error = proc.stderr[proc.stderr.index("train.py: error: ") :].strip()
    assert error == (
        f"train.py: error: init_from={ckpt} and ckpt_path={ckpt} are both given: init_from starts a new run "
        "from a checkpoint's weights (fresh optimizer, schedule and data order), ckpt_path resumes a run "
        "exactly; give one of them"
    )


@pytest.mark.parametrize(
    "override, said",
    [
        ("optimizer.lr=1e-3", "optimizer.lr is now lr.peak"),
        ("schedule.fit=none", "schedule.fit is now budget.fit"),
        ("+validation.max_share=0.2", "validation.max_share is now budget.validation_share"),
    ],
)
def test_a_key_that_moved_is_one_message_naming_its_new_name(
    tmp_path: Path, override: str, said: str
) -> None:
    """Refused before Hydra composes (which would say only that the key is not in the config)."""
    proc = subprocess.run(
        [sys.executable, "train.py", "experiment=smoke", override, f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        f"train.py: error: the override {override!r}: {said} (the learning rate is the lr group, a time "
        "budget's fit the budget group)"
    )
    assert not (tmp_path / "run").exists()
