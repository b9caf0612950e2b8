"""What the attention benchmarks share: a configuration measured in a child process of its own.

``bench/attention_scaling.py`` (our mechanisms against SDPA) and ``bench/attention_reference.py``
(ours against lucidrains' packages) run every configuration as ``<script> --child <spec as
JSON>`` (:func:`run_config`): a time limit, an address-space cap (so that the machine's OOM
killer is not involved), ``timeout`` and ``OOM`` reported, not dropped. In the child,
:func:`measure` times forward + backward passes and reads peak memory from /proc, and
:func:`measure_in_turn` times two implementations call by call. With ``--memory exact`` the peak
comes from a child run under ``EXACT_MEMORY_ENV``. Also their shared options and their plots of
time and memory against length (:func:`length_figure`, :func:`plot_line`, :func:`label_axes`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bench.harness import ROOT, add_json_option, median, peak_rss_mib, rss_mib

if TYPE_CHECKING:  # torch is imported where it is used (the parent stays small)
    from torch import Tensor, nn

ROLES = {"encoder": "encoder_self", "decoder": "decoder_self"}


# ------------------------------------------------------------------------------------- the child


def measure(module: nn.Module, inputs: list[Tensor], call: Callable[[], Tensor], spec: dict) -> dict:
    """Forward + backward of ``call()`` in this process (a child): the result's dict.

    A warm-up call, then ``spec["repeats"]`` or more timed calls (more while under 0.5 s, fewer
    past a third of ``spec["timeout"]``), each against the same random output gradient, under
    bf16 autocast where ``spec["precision"]`` says so. ``module``'s parameters and ``inputs``
    (the leaves) have their gradients reset before each call. Peak memory: VmHWM at the end
    minus VmRSS now (after imports, the module and the inputs). Running out of memory is
    reported as ``OOM``; an error naming a setting the mechanism refuses as ``refused``.
    """
    import torch

    module.train()
    grad = None
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["precision"] == "bf16")

    def step() -> float:
        nonlocal grad
        for t in [*inputs, *module.parameters()]:
            t.grad = None
        start = time.perf_counter()
        with autocast:
            out = call()
        if grad is None:
            grad = torch.randn_like(out)
        out.backward(grad)
        return time.perf_counter() - start

    times = []
    baseline = rss_mib()
    try:
        warmup = step()
        budget = spec["timeout"] / 3  # timed calls stop here, so that a slow one still finishes
        spent = warmup
        # At least --repeats calls (fewer where they would pass the budget), more while the timed
        # calls add up to under 0.5 s (not counting the warm-up, whose first touch of every buffer
        # can take ten times a call: with it counted, a 40 ms call got only --repeats calls, the
        # first of them still slowed by page faults).
        while len(times) < 50 and (len(times) < spec["repeats"] or sum(times) < 0.5):
            if times and spent + warmup > budget:
                break
            times.append(step())
            spent += times[-1]
    except (RuntimeError, MemoryError) as error:
        if "memory" in str(error).lower() or isinstance(error, MemoryError):
            return {"status": "OOM", "why": str(error).splitlines()[0][:200], "times": times}
        if "max_length" in str(error) or "cannot" in str(error):
            return {"status": "refused", "why": str(error).splitlines()[0][:200]}
        raise
    return {
        "status": "ok",
        "seconds": median(times),
        "times": times,
        "warmup_seconds": warmup,
        "peak_mib": peak_rss_mib() - baseline,
        "baseline_mib": baseline,
    }


def measure_in_turn(built: dict[str, tuple], spec: dict) -> dict:
    """Ours and theirs, forward + backward, one call of each in turn (the first of each pair
    alternating), after a warm-up call of each: ``spec["repeats"]`` pairs or more (more while
    under a second, at most 25, none past a third of ``spec["timeout"]``).

    Both see the same machine at the same moment, so a slow spell of the shared machine falls on
    both: ``speed`` is the median over the pairs of their time / ours (the figure the verdict
    uses), ``ours_seconds`` and ``theirs_seconds`` the medians of each.
    """
    import torch

    grads: dict[str, Tensor] = {}

    def step(impl: str) -> float:
        module, inputs, call = built[impl]
        for t in [*inputs, *module.parameters()]:
            t.grad = None
        start = time.perf_counter()
        out = call()
        if impl not in grads:
            grads[impl] = torch.randn_like(out)
        out.backward(grads[impl])
        return time.perf_counter() - start

    for impl in built:
        built[impl][0].train()
    spent = step("ours") + step("theirs")
    pairs: list[tuple[float, float]] = []
    while len(pairs) < 25 and (len(pairs) < spec["repeats"] or spent < 1.0):
        if pairs and spent + sum(pairs[-1]) > spec["timeout"] / 3:  # the next pair would pass it
            break
        order = ("ours", "theirs") if len(pairs) % 2 == 0 else ("theirs", "ours")
        times = {impl: step(impl) for impl in order}
        pairs.append((times["ours"], times["theirs"]))
        spent += sum(pairs[-1])
    return {
        "status": "ok",
        "speed": median(theirs / ours for ours, theirs in pairs),
        "ours_seconds": median(ours for ours, _ in pairs),
        "theirs_seconds": median(theirs for _, theirs in pairs),
        "pairs": len(pairs),
    }


# ------------------------------------------------------------------------------------ the parent


def add_child_options(parser: argparse.ArgumentParser, timeout: float) -> None:
    """The shapes every configuration runs at, and each child's threads and time."""
    parser.add_argument("--d-model", type=int, default=512, help="model width")
    parser.add_argument("--heads", type=int, default=8, help="attention heads")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of each child")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the warm-up (at most)")
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per configuration")


def add_memory_options(parser: argparse.ArgumentParser, memory_help: str) -> None:
    """``--memory`` (``memory_help`` says which child each mode reads) and ``--memory-limit``."""
    parser.add_argument("--memory", default="exact", choices=["exact", "rss"], help=memory_help)
    parser.add_argument("--memory-limit", type=float, default=16.0, help="GiB of address space per child")


def add_output_options(parser: argparse.ArgumentParser, name: str) -> None:
    """``--json`` and ``--from-json`` (after the script's own ``--plot``)."""
    add_json_option(parser, name)
    parser.add_argument("--from-json", nargs="+", help="only print the tables (and plot) of these results")


def timing_description(repeats: int) -> str:
    """How each child times its calls (:func:`measure`), for the printed config."""
    return (
        f"median of {repeats} or more forward + backward calls (more while under 0.5 s, fewer "
        "past a third of the timeout) after one warm-up"
    )


# Environment of a child whose peak RSS is to be its peak of live allocations: glibc maps every
# allocation over 64 KiB on its own and unmaps it when freed, and returns the heap's free top at
# once, instead of keeping freed memory resident for reuse (its default, whose thresholds move
# with the allocations seen, so that the same code's VmHWM varied by ±15% between runs). Slower:
# every large tensor's pages are faulted in afresh, so such a child's times are not comparable.
EXACT_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def memory_description(mode: str, exact_child: str, rss_child: str) -> str:
    """How peak memory was measured, for the printed config: ``mode`` exact or rss, and which
    child's figure each mode reports (``exact_child``, ``rss_child``)."""
    how = "child's /proc/self/status VmHWM at the end minus its VmRSS after imports and inputs (MiB)"
    if mode == "exact":
        settings = " ".join(f"{k}={v}" for k, v in EXACT_MEMORY_ENV.items())
        return f"{how}, {exact_child} with glibc returning freed memory at once ({settings})"
    return f"{how}, {rss_child}, under glibc's default caching"


def run_config(spec: dict, memory_limit_gib: float, script: Path, env: dict[str, str] | None = None) -> dict:
    """``spec`` in a child process, with the time limit and the address-space cap.

    The child is ``script --child <spec as JSON>``, which prints its result's dict as JSON on its
    last line starting with ``{``; ``env``: variables added to its environment (e.g.
    ``EXACT_MEMORY_ENV``).
    """
    limit = int(memory_limit_gib * 2**30)

    def cap() -> None:
        if limit > 0:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    command = [sys.executable, str(script.resolve()), "--child", json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(spec["threads"]), **(env or {})}
    # Files, not pipes: a child writing more than a pipe holds would block while it is polled.
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=stdout, stderr=stderr, preexec_fn=cap)
    status, usage = 0, None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > spec["timeout"]:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            return {"status": "timeout", "why": f"over {spec['timeout']} s", "ru_maxrss_mib": None}
        time.sleep(0.05)
    stdout.seek(0)
    stderr.seek(0)
    out, err = stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    maxrss = usage.ru_maxrss / 1024
    if code == -signal.SIGKILL:
        return {"status": "OOM", "why": "killed (SIGKILL)", "ru_maxrss_mib": maxrss}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        if "memory" in err.lower():
            return {"status": "OOM", "why": err.strip().splitlines()[-1][:200], "ru_maxrss_mib": maxrss}
        tail = err.strip().splitlines()[-1][:200] if err.strip() else f"exit {code}"
        return {"status": "error", "why": tail, "ru_maxrss_mib": maxrss}
    return {**json.loads(lines[-1]), "ru_maxrss_mib": maxrss}


def with_exact_memory(r: dict, spec: dict, memory_limit_gib: float, script: Path) -> dict:
    """Timing result ``r`` of ``spec`` with its peak memory from a second child run under
    ``EXACT_MEMORY_ENV`` (a warm-up and one call, or more while under 0.5 s); the timing child's
    own peak is kept as ``rss_peak_mib``. Where the second child fails (out of memory or time:
    its page faults make it slower), the timing child's peak stays, and ``memory`` says why."""
    exact = run_config({**spec, "repeats": 1}, memory_limit_gib, script, EXACT_MEMORY_ENV)
    if exact["status"] != "ok":
        return {**r, "memory": f"rss (the exact child: {exact['status']})"}
    return {**r, "peak_mib": exact["peak_mib"], "rss_peak_mib": r["peak_mib"]}


# ------------------------------------------------------------------------------------- the plots


def length_figure(rows: int, row_height: float) -> tuple:
    """A figure of ``rows`` rows of two axes (time, memory) ``row_height`` inches high: (fig, axes),
    axes[row][0 or 1]; and pyplot, for its colours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, 2, figsize=(12, row_height * rows), squeeze=False)
    return fig, axes, plt


def plot_line(row: Sequence, points: list[tuple[int, float, float]], style: str, **kwargs: object) -> None:
    """One line on each axis of ``row``: ``points`` of (length, seconds, peak MiB)."""
    xs = [n for n, _, _ in points]
    row[0].plot(xs, [seconds * 1e3 for _, seconds, _ in points], style, **kwargs)
    row[1].plot(xs, [max(mib, 0.1) for _, _, mib in points], style, **kwargs)


def label_axes(row: Sequence, lengths: Sequence[int], title: str | None = None) -> None:
    """Log-log scales, the lengths run as ticks, labels and a grid on both axes of ``row``."""
    for ax, label in zip(row, ("ms per forward + backward", "peak MiB above baseline"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(label)
        if title is not None:
            ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)


def save_figure(fig: object, path: Path, title: str) -> None:
    """``title`` above ``fig``, written to ``path`` (PNG)."""
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")
