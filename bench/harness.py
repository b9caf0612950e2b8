"""The benchmark harness: threads, timing, memory, the machine's description, matmul peak, tables, JSON.

Benchmarks are scripts, not tests: each prints the exact configuration and machine it ran on
(:func:`environment`) and a small table (:func:`print_table`), and writes the same figures as JSON
under ``bench/results/`` (:func:`write_json`, gitignored). A call is timed with :func:`timed`, a
whole child process with :func:`run_measured` (wall time and peak resident memory), and this
process's memory read with :func:`peak_rss_mib` and :func:`rss_mib`, so that a figure means the
same thing in every script. A span that is not one call keeps a clock of its own: a GPU
synchronised around it, a child polled against a time limit, a warm-up that may fail, a whole run.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import gzip
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: bench/translate_memory.py's parent stays small
    import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

RESULTS_DIR = ROOT / "bench" / "results"
MULTI30K_DIR = Path(os.environ.get("MULTI30K_DIR") or ROOT.parent / "shared" / "data" / "multi30k")


def set_threads(n: int) -> None:
    """Intra-op threads for torch (and the OpenMP pool behind it)."""
    import torch

    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_id() -> str:
    """x86 family, model and stepping (AMD family 25 is Zen 3 or Zen 4 by model, 26 is Zen 5): the
    model name of a cloud VM is often only "AMD EPYC", and these tell the generation apart."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model", "stepping") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if line.strip() == "":  # the first processor's block is enough
                break
    except OSError:
        pass
    return " ".join(f"{k.replace('cpu ', '')} {v}" for k, v in fields.items()) or "unknown"


def _cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(("avx512", "amx")))
    except OSError:
        pass
    return []


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(threads: int) -> dict:
    """The machine and software a figure was measured on."""
    import torch

    from fastpaths.hardware import native_bf16

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_id": _cpu_id(),
        "cpu_flags": " ".join(_cpu_flags()),
        "logical_cpus": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_native_bf16": native_bf16(),  # transformer/hardware.py: where False, bf16 is emulated
        "threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "ctranslate2": version("ctranslate2"),
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def print_config(title: str, config: dict) -> None:
    print(f"== {title}")
    for key, value in config.items():
        print(f"  {key}: {value}")
    print(flush=True)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A markdown table (pastes into BENCHMARKS.md as it is)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print(flush=True)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def add_json_option(parser: argparse.ArgumentParser, name: str) -> None:
    """``--json``: where :func:`write_json` writes the results (``name`` by default)."""
    parser.add_argument("--json", default=name, help="results file: bench/results/<name>.json")


def write_json(name: str, data: dict) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / (name if name.endswith(".json") else f"{name}.json")  # a name or a path
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"results written to {path}")
    return path


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """Seconds taken by ``fn()`` and its result."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run_measured(command: Sequence[str], **popen: object) -> tuple[subprocess.Popen, float, float]:
    """Runs ``command`` to its end: the finished process, its wall seconds and its peak resident
    memory in MiB (the child's ``ru_maxrss``, as ``/usr/bin/time -v`` reports it). ``popen`` goes
    to :class:`subprocess.Popen` (a piped stream is left for the caller to read)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, **popen)  # type: ignore[call-overload]
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc, seconds, usage.ru_maxrss / 1024  # KiB on Linux


def matmul_peak(dtype: torch.dtype, n: int = 2048, repeats: int = 8) -> float:
    """Best achieved FLOP/s of an [n, n] @ [n, n] matmul in ``dtype`` at the current thread count."""
    import torch

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # warm-up (oneDNN/MKL pick their kernels)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def read_gz_lines(path: Path) -> list[str]:
    """A gzip text file split on ``\\n`` only (no final empty line)."""
    with gzip.open(path, "rb") as f:
        text = f.read().decode("utf-8")
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


def find_spm_model() -> Path | None:
    """A SentencePiece model of the Multi30k runs, or the data cache's, if any exists."""
    for pattern in (
        str(ROOT / "runs" / "multi30k_*" / "*" / "tokenizer" / "joint.model"),
        str(Path.home() / ".cache" / "nmt-transformer" / "spm" / "*.model"),
    ):
        found = sorted(glob.glob(pattern), key=os.path.getmtime)
        if found:
            return Path(found[-1])
    return None


def find_checkpoint(name: str, which: str = "averaged") -> Path | None:
    """The newest ``runs/<name>/*/checkpoints/<which>.ckpt`` (``best`` matches ``best-*.ckpt``)."""
    pattern = "best-*.ckpt" if which == "best" else f"{which}.ckpt"
    found = sorted(glob.glob(str(ROOT / "runs" / name / "*" / "checkpoints" / pattern)), key=os.path.getmtime)
    return Path(found[-1]) if found else None


def peak_rss_mib(pid: int | str = "self") -> float:
    """Peak resident memory so far (VmHWM) of this process or of process ``pid``, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    """This process's resident memory now (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs); False if not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
