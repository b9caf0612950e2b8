"""The model package is the paper's model and its attention mechanisms only: it imports neither
the decoding package nor the device fast paths nor either program's packages, and asks nothing
about the device it runs on."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("decoding", "fastpaths", "data", "training", "translation", "common", "lightning", "hydra")
# What asking about the device looks like: a device name, a backend's report.
DEVICE_WORDS = ("cuda", "mkldnn", "get_cpu_capability", "_is_avx512", "_is_amx", '"cpu"', "'cpu'")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_no_module_of_the_model_imports_decoding_fast_paths_or_the_programs():
    found = {
        path.name: name
        for path in sorted((ROOT / "transformer").glob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in FORBIDDEN
    }
    assert not found, found


def test_no_module_of_the_model_asks_about_the_device():
    found = [
        (path.name, word)
        for path in sorted((ROOT / "transformer").glob("*.py"))
        for word in DEVICE_WORDS
        if word in path.read_text()
    ]
    assert not found, found


def test_importing_the_model_loads_none_of_them():
    code = (
        "import sys, transformer, transformer.model, transformer.mechanisms\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
