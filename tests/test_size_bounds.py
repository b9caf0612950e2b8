"""The product stays readable in its parts: no file over 450 lines, no function over 80 (issue #70).

Tests and benchmarks are not the product and are not bounded here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("transformer", "decoding", "fastpaths", "data", "common", "training", "translation")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 450, 80


def _product_files() -> list[Path]:
    files = [ROOT / "train.py", ROOT / "translate.py"]
    for package in PACKAGES:
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def test_no_product_file_is_over_450_lines():
    long = {
        f.relative_to(ROOT).as_posix(): n
        for f in _product_files()
        if (n := len(f.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"over {MAX_FILE_LINES} lines: {long}"


def test_no_product_function_is_over_80_lines():
    long = {}
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = lines
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {long}"
