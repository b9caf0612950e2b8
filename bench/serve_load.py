"""The translation server under load against translate.py: lines per second on the same input.

    python bench/serve_load.py --checkpoint runs/multi30k_de_en/<run>/checkpoints/averaged.ckpt
    python bench/serve_load.py --checkpoint CKPT --clients 32 --lines 1000 --request-lines 8 --beam-size 5

The first ``--lines`` lines of test_2016_flickr (``--input``) are translated twice, with the same
beam and ``--threads`` threads:

* by ``translate.py --input FILE --output FILE --quiet`` in a fresh process, as a user runs it:
  its wall time, and that time less its start-up (the same command on an empty input: Python,
  torch and the checkpoint; run before and after, the faster taken, as the first pays for cold
  file caches), which is what its decoding took. Where the decoding is too short to outlast the
  start-up's noise (a tiny model, a few lines) it says so and gives no decoding rate or ratio;
* by ``python3 -m translation.serve`` (``--port 0``), started and warmed up with one request
  first, then sent the lines by ``--clients`` threads of this process, each taking the next
  ``--request-lines`` lines until none are left and POSTing them to ``/translate``: the time
  from the first request to the last answer. The server's own decoding thread gathers what is
  waiting into its searches (``translation/serve/batcher.py``).

It prints both rates and their ratio (the server's over translate.py's decoding), the server's
searches and requests, and whether the server's translations equal translate.py's line for
line (they should: a line's translation does not depend on its batch). The clients run in
this process, on the same cores: their HTTP and JSON are part of what the server's rate costs.

Run it on a quiet machine. Where other processes keep the cores busy, translate.py's OpenMP
threads, which spin while they wait (libgomp's default), lose their cores and its decoding slows
down several times (seen: 73 s for 100 lines against 9 s with one thread), while the server's
decoding thread, a second OpenMP team in its process, is throttled by libgomp and barely spins;
the ratio then measures that, not batching. ``--omp-wait-policy passive`` removes the spinning
from both.

Not a test: the figures depend on the machine, its load and the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    add_json_option,
    environment,
    print_config,
    print_table,
    read_gz_lines,
    run_measured,
    write_json,
)


def child_env(threads: int, wait_policy: str | None) -> dict[str, str]:
    """The environment of both programs: the project on the path, OpenMP's threads and wait policy."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    return env


def translate_py(checkpoint: str, source: Path, out: Path, beam: int, env: dict[str, str]) -> float:
    """``translate.py`` on ``source``, as a user runs it: its wall seconds."""
    command = [sys.executable, str(ROOT / "translate.py"), "--checkpoint", checkpoint, "--input", str(source)]
    threads = env["OMP_NUM_THREADS"]
    command += ["--output", str(out), "--beam-size", str(beam), "--threads", threads, "--quiet"]
    proc, wall, _ = run_measured(command, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(f"translate.py failed:\n{proc.stderr.read().decode(errors='replace')[-3000:]}")
    return wall


class ServerProcess:
    """``python3 -m translation.serve --port 0`` in a subprocess; :meth:`start` returns its URL."""

    def __init__(self, checkpoint: str, beam: int, env: dict[str, str], log: Path) -> None:
        self.command = [sys.executable, "-m", "translation.serve", "--checkpoint", checkpoint, "--port", "0"]
        self.command += ["--beam-size", str(beam), "--threads", env["OMP_NUM_THREADS"]]
        self.env = env
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> str:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"listening on (http://\S+)", self.log.read_text(errors="replace"))
            if found:
                return found.group(1).rstrip("/")
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"the server did not listen within {timeout} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + "/translate", json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def load(url: str, lines: list[str], clients: int, per_request: int) -> tuple[float, list[str], int]:
    """``clients`` threads send ``lines`` in requests of ``per_request``: (seconds, the
    translations in input order, the requests sent)."""
    out: list[str | None] = [None] * len(lines)
    taken, requests, lock, errors = 0, 0, threading.Lock(), []

    def client() -> None:
        nonlocal taken, requests
        try:
            while True:
                with lock:
                    first = taken
                    taken = min(len(lines), taken + per_request)
                    if first < taken:
                        requests += 1
                if first >= len(lines):
                    return
                answer = post(url, {"lines": lines[first : first + per_request]})["translations"]
                out[first : first + len(answer)] = answer
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if errors or any(t is None for t in out):
        raise SystemExit(f"the load lost lines: {errors[:3]}")
    return seconds, [t for t in out if t is not None], requests


def rate_rows(wall: float, decoding: float, server: float, clients: int, lines: int) -> list[list[str]]:
    """The table's rows: translate.py's wall time, its decoding (wall less start-up) and the server's
    time, each with lines a second and its ratio to the decoding; ``-`` where the decoding is not
    positive (shorter than the start-up's noise)."""
    measured = decoding > 0
    rows = [
        [
            "translate.py (wall)",
            f"{wall:.2f}",
            f"{lines / wall:.1f}",
            f"{decoding / wall:.2f}" if measured else "-",
        ],
        [
            "translate.py (less start-up)",
            f"{decoding:.2f}",
            f"{lines / decoding:.1f}" if measured else "-",
            "1.00",
        ],
    ]
    ratio = f"{decoding / server:.2f}" if measured else "-"
    return rows + [[f"server, {clients} clients", f"{server:.2f}", f"{lines / server:.1f}", ratio]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the .ckpt both translate with")
    parser.add_argument("--input", default=str(MULTI30K_DIR / "test_2016_flickr.de.gz"), help="source file")
    parser.add_argument("--lines", type=int, default=1000, help="its first N lines (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default: %(default)s)")
    parser.add_argument(
        "--request-lines", type=int, default=8, help="lines per request (default: %(default)s)"
    )
    parser.add_argument("--beam-size", type=int, default=5, help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each (default: %(default)s)")
    parser.add_argument(
        "--omp-wait-policy",
        choices=["active", "passive"],
        help="OMP_WAIT_POLICY of both programs (default: unset, as a user runs them; the docstring says "
        "when passive is fairer)",
    )
    add_json_option(parser, "serve_load")
    args = parser.parse_args()

    source = Path(args.input)
    read = read_gz_lines(source) if source.suffix == ".gz" else source.read_text().split("\n")[:-1]
    lines = read[: args.lines]
    config = {
        **environment(args.threads),
        "checkpoint": args.checkpoint,
        "input": f"{args.input}, its first {len(lines)} lines",
        "beam": args.beam_size,
        "clients": f"{args.clients}, {args.request_lines} lines a request",
        "OMP_WAIT_POLICY": args.omp_wait_policy or "unset",
    }
    env = child_env(args.threads, args.omp_wait_policy)
    print_config("the server under load against translate.py", config)
    with tempfile.TemporaryDirectory() as tmp:
        plain, empty = Path(tmp) / "input.txt", Path(tmp) / "empty.txt"
        plain.write_text("".join(line + "\n" for line in lines))
        empty.write_text("")
        cold = translate_py(args.checkpoint, empty, Path(tmp) / "empty.out", args.beam_size, env)
        wall = translate_py(args.checkpoint, plain, Path(tmp) / "out.txt", args.beam_size, env)
        start_up = min(
            cold, translate_py(args.checkpoint, empty, Path(tmp) / "empty.out", args.beam_size, env)
        )
        expected = (Path(tmp) / "out.txt").read_text().split("\n")[:-1]
        print(f"  translate.py: {wall:.2f} s, of which {start_up:.2f} s start-up", flush=True)

        server = ServerProcess(args.checkpoint, args.beam_size, env, Path(tmp) / "server.log")
        try:
            url = server.start()
            post(url, {"lines": lines[:8]})  # warm-up: the first search's kernels chosen
            before = json.loads(urllib.request.urlopen(url + "/health").read())
            seconds, served, requests = load(url, lines, args.clients, args.request_lines)
            after = json.loads(urllib.request.urlopen(url + "/health").read())
        finally:
            server.stop()
    searches = after["searches"] - before["searches"]
    decoding = wall - start_up
    same = sum(a == b for a, b in zip(served, expected, strict=True))
    print()
    print_table(
        ["system", "seconds", "lines/s", "x translate.py decoding"],
        rate_rows(wall, decoding, seconds, args.clients, len(lines)),
    )
    if decoding <= 0:
        print(
            f"translate.py's decoding did not outlast its start-up's noise ({wall:.2f} s against "
            f"{start_up:.2f} s on an empty input): no decoding rate or ratio; give it more --lines"
        )
    print(
        f"server: {requests} requests in {searches} searches; "
        f"translations equal to translate.py's: {same}/{len(lines)}"
    )
    results = {
        "translate_py_wall_s": wall,
        "translate_py_start_up_s": start_up,
        "server_s": seconds,
        "server_lines_per_s": len(lines) / seconds,
        "translate_py_lines_per_s": len(lines) / decoding if decoding > 0 else None,
        "ratio": decoding / seconds if decoding > 0 else None,
        "requests": requests,
        "searches": searches,
        "equal_lines": same,
    }
    write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
