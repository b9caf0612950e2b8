"""The training side never imports the translation side: what both need is in ``common``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_training_imports_no_translation_package() -> None:
    # A fresh interpreter: this test process has imported translation through other tests.
    code = (
        "import sys, pkgutil, importlib, training\n"
        "for m in pkgutil.iter_modules(training.__path__):\n"
        "    importlib.import_module('training.' + m.name)\n"
        "print(sorted({m for m in sys.modules if m.split('.')[0] == 'translation'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
