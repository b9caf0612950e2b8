"""train.py as a new user runs it: a checkout with no ../shared beside it, and no network."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_local_corpus_and_no_hub_is_one_message_without_traceback(tmp_path: Path) -> None:
    # A copy of the program, so that its ../shared/data/multi30k truly does not exist (the path is
    # computed from the package location); HF_HUB_OFFLINE and an empty cache stand for no network.
    project = tmp_path / "checkout" / "nmt-transformer"
    for name in ("train.py", "conf", "data", "training", "transformer", "translation"):
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
