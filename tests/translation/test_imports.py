"""The translation side stands alone: importing it loads neither Lightning nor Hydra, and the export
command loads CTranslate2 and transformers only when it runs (they are an optional extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_translation_path_imports_no_training_framework() -> None:
    # A fresh interpreter: this test process has imported Lightning through other tests.
    code = (
        "import sys, translate, translation, translation.attention_plot, translation.metrics, "
        "translation.workers, translation.export.__main__\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(loaded & {'lightning', 'hydra', 'omegaconf', 'training', 'ctranslate2', "
        "'transformers'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
