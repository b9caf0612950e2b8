"""Suite-wide settings: tiny models run single-threaded and seeded; ``gpu`` tests need CUDA.

One thread is set at import time too, so that module- and session-scoped fixtures (which run
before function-scoped autouse fixtures) do not run with every core and oversubscribe the CPU.
Tests marked ``gpu`` are skipped, with the reason, where CUDA is absent, so the suite stays green
on CPU machines.

Tests marked ``cpu_dependent`` take the path the CPU's capability report chooses. ``.ci/run`` runs
them again under ``../shared/tools/emulate-cpu`` with ``NMT_EXPECT_CPU_CAPABILITY=AVX2``: that run
stops before its first test unless PyTorch, in this process, reports that capability and no
native bf16, so that its tests cannot pass on the host's CPU by mistake.

The export round trips (``tests/translation/export``) skip, saying what to install, where the
export packages are missing. ``.ci/run`` sets ``NMT_REQUIRE_EXPORT=1``: there, any skip of an export
test (a whole module's, when ``pytest.importorskip`` finds no package, or a single test's) is
reported as a failure instead, so that CI cannot pass without having run them.
"""

import os
from pathlib import Path

import pytest
import torch

from fastpaths import hardware

EXPECT_CAPABILITY = "NMT_EXPECT_CPU_CAPABILITY"
REQUIRE_EXPORT = "NMT_REQUIRE_EXPORT"
EXPORT_TESTS = Path(__file__).parent / "translation" / "export"
# Capabilities without bf16 arithmetic: where PyTorch reports one, bf16 can only be emulated.
_NO_BF16 = ("DEFAULT", "NO AVX", "AVX2")

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _single_thread_and_seed():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield


def pytest_report_header(config: pytest.Config) -> str:
    capability = torch.backends.cpu.get_cpu_capability()
    return f"cpu: capability {capability}, native bf16 {hardware.native_bf16()}"


def pytest_sessionstart(session: pytest.Session) -> None:
    expected = os.environ.get(EXPECT_CAPABILITY)
    if not expected:
        return
    capability, native = torch.backends.cpu.get_cpu_capability(), hardware.native_bf16()
    if capability != expected or (expected in _NO_BF16 and native):
        raise pytest.UsageError(
            f"{EXPECT_CAPABILITY}={expected}, but PyTorch reports CPU capability {capability} and "
            f"native bf16 {native}: this run is not on the CPU it is meant to test"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def _fail_a_required_skip(
    node: pytest.Item | pytest.Collector, report: pytest.TestReport | pytest.CollectReport
) -> None:
    """Makes ``report`` a failure where it is a skip of an export test and CI requires them."""
    if not (report.skipped and os.environ.get(REQUIRE_EXPORT)) or hasattr(report, "wasxfail"):
        return
    if EXPORT_TESTS not in Path(node.path).parents:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{REQUIRE_EXPORT} is set: the export tests must run, but this one skipped: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    _fail_a_required_skip(collector, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    _fail_a_required_skip(item, report)
    return report
