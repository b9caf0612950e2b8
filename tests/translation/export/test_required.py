"""CI's guard (.ci/run sets NMT_REQUIRE_EXPORT): there an export test that skips fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.parametrize("required", [False, True], ids=["default", "NMT_REQUIRE_EXPORT=1"])
def test_a_missing_export_package_skips_except_where_ci_requires_it(tmp_path, required):
    # A ctranslate2 that cannot be imported, found before any installed one.
    (tmp_path / "ctranslate2.py").write_text('raise ModuleNotFoundError("hidden", name="ctranslate2")\n')
    env = {k: v for k, v in os.environ.items() if k != "NMT_REQUIRE_EXPORT"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    if required:
        env["NMT_REQUIRE_EXPORT"] = "1"
    test_file = ROOT / "tests" / "translation" / "export" / "test_ctranslate2.py"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    if required:  # a collection error: the run stops before any test, saying why
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, proc.stdout[-2000:]
        assert "NMT_REQUIRE_EXPORT is set: the export tests must run" in proc.stdout
    else:  # the module skips, saying what to install: nothing ran, nothing failed
        assert proc.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, proc.stdout[-2000:]
        assert "1 skipped" in proc.stdout and "needs the export extra" in proc.stdout
