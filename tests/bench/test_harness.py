"""bench/harness.py: the timing and memory readers every benchmark script uses."""

from __future__ import annotations

import subprocess
import sys

from bench.harness import environment, median, peak_rss_mib, rss_mib, run_measured, timed


def test_timed_returns_the_seconds_and_the_result():
    seconds, out = timed(lambda: sum(range(1000)))
    assert out == 499500 and 0 <= seconds < 1


def test_run_measured_reports_the_childs_status_time_and_peak_memory():
    code = "x = bytearray(64 * 2**20); x[::4096] = b'1' * len(x[::4096]); raise SystemExit(3)"
    proc, seconds, peak = run_measured([sys.executable, "-c", code], stderr=subprocess.PIPE)
    assert proc.returncode == 3 and seconds > 0
    assert peak >= 64  # the child's ru_maxrss, not this process's


def test_memory_readers_and_environment_describe_this_process():
    assert 0 < rss_mib() <= peak_rss_mib()
    env = environment(threads=1)
    assert {"cpu", "cpu_id", "torch", "threads", "load_average"} <= env.keys()
    assert median([3.0, 1.0, 2.0]) == 2.0
