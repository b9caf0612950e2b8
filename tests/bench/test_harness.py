"""bench/harness.py: the timing and memory readers every benchmark script uses."""

from __future__ import annotations

import subprocess
import sys

from bench.harness import environment, median, peak_rss_mib, rss_mib, run_measured, timed


def test_timed_returns_the_seconds_and_the_result():
    seconds, out = timed(lambda: sum(range(1000)))
    assert out == 499500 and 0 <= seconds < 1


TOUCH_64_MIB = "x = bytearray(64 * 2**20); x[::4096] = b'1' * len(x[::4096])"


def test_run_measured_reports_the_childs_status_time_and_peak_memory():
    code = TOUCH_64_MIB + "; raise SystemExit(3)"
    proc, seconds, peak = run_measured([sys.executable, "-c", code], stderr=subprocess.PIPE)
    assert proc.returncode == 3 and seconds > 0
    assert peak >= 64  # at least the child's block
    # The child's peak, not the measuring process's: from a small process, a child that touches
    # 64 MiB peaks about 64 MiB above one that touches nothing. (A child starts with its parent's
    # peak, which Linux keeps across exec: this process's would hide both; so the measuring
    # process is started by a shell that forks it.)
    measure = f"""
import sys
from bench.harness import run_measured
idle = run_measured([sys.executable, "-c", "pass"])[2]
block = run_measured([sys.executable, "-c", {TOUCH_64_MIB!r}])[2]
print(idle, block)
"""
    done = subprocess.run(
        ["sh", "-c", '"$0" -c "$1"; exit $?', sys.executable, measure],
        capture_output=True, text=True, check=True, timeout=99,
    )  # fmt: skip
    idle, block = (float(x) for x in done.stdout.split())
    assert 64 <= block < 64 + 32, done.stdout  # the block and an interpreter
    assert 48 < block - idle < 72, done.stdout


def test_memory_readers_and_environment_describe_this_process():
    assert 0 < rss_mib() <= peak_rss_mib()
    env = environment(threads=1)
    assert {"cpu", "cpu_id", "torch", "threads", "load_average"} <= env.keys()
    assert median([3.0, 1.0, 2.0]) == 2.0
