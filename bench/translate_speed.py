"""translate.py from several source trees, side by side: speed, peak memory, identical outputs.

    python bench/translate_speed.py --checkpoint CKPT --tree old=/path/to/old/checkout --tree new=.
    python bench/translate_speed.py --checkpoint CKPT --tree old=../old --tree new=. --threads 2 1 --rounds 3
    python bench/translate_speed.py --checkpoint CKPT --tree plain=. --tree aligned=. \\
        --tree-args "aligned=--alignment-output /tmp/aligned.align"       # one tree, two ways

Each tree's ``translate.py --checkpoint CKPT --input test_2016_flickr.de --quiet`` runs as a user
runs it (default options unless ``--args`` adds some, or ``--tree-args`` to one tree only: a
tree may be given twice under two names, to time an option), with ``--threads`` given, the trees
alternated round by round in fresh processes, so that the machine's noise falls on all of them
alike. Per tree and thread count: the median wall time, sentences per second, the peak resident
memory (``ru_maxrss`` of the child, from ``os.wait4``), the speed as a ratio to the first tree,
and whether its output is byte-identical to the ``--same-as`` tree's (every round's).

Not a test: the figures depend on the machine and the checkpoint. Results: BENCHMARKS.md,
"Translation speed within the memory target".
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    add_json_option,
    environment,
    median,
    print_config,
    print_table,
    run_measured,
    write_json,
)


def run_once(tree: Path, args: list[str], threads: int, out: Path) -> tuple[float, float]:
    """One ``translate.py`` of ``tree``: (wall seconds, peak RSS MiB); its stdout goes to ``out``."""
    command = [sys.executable, str(tree / "translate.py"), *args, "--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    with open(out, "wb") as stdout:
        proc, wall, peak = run_measured(command, cwd=tree, env=env, stdout=stdout, stderr=subprocess.PIPE)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{stderr[-3000:]}")
    return wall, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="the .ckpt every tree translates with")
    parser.add_argument(
        "--tree", action="append", required=True, metavar="NAME=PATH", help="a source tree (repeat)"
    )
    parser.add_argument("--input", default=str(MULTI30K_DIR / "test_2016_flickr.de.gz"), help="source file")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="thread counts to run")
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs of every tree")
    parser.add_argument("--args", default="", help="more translate.py options, e.g. '--greedy'")
    parser.add_argument(
        "--tree-args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="more translate.py options for tree NAME only (repeat): 'aligned=--alignment-output a.align'",
    )
    parser.add_argument("--same-as", help="the tree every tree's outputs must equal (default: the last)")
    add_json_option(parser, "translate_speed")
    args = parser.parse_args()

    trees = dict(item.split("=", 1) for item in args.tree)
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    extra = {name: shlex.split(more) for name, more in (item.split("=", 1) for item in args.tree_args)}
    if set(extra) - set(trees):
        parser.error(f"--tree-args for {', '.join(sorted(set(extra) - set(trees)))}: no --tree of that name")
    reference = args.same_as or list(trees)[-1]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(args.input)
        if source.suffix == ".gz":  # translate.py reads plain text
            import gzip

            plain = Path(tmp) / source.stem
            plain.write_bytes(gzip.decompress(source.read_bytes()))
            source = plain
        n_lines = source.read_bytes().count(b"\n")
        base = ["--checkpoint", str(Path(args.checkpoint).resolve()), "--input", str(source), "--quiet"]
        base += shlex.split(args.args)
        config = {
            **environment(max(args.threads)),
            "checkpoint": args.checkpoint,
            "input": f"{args.input} ({n_lines} lines)",
            "trees": {name: str(path) for name, path in trees.items()},
            "translate.py options": shlex.join(base[4:]) + " --threads N",
            **{f"{name}'s own options": shlex.join(more) for name, more in extra.items()},
            "rounds": f"{args.rounds}, trees alternated within each round",
        }
        print_config("translate.py side by side", config)
        walls: dict[tuple[str, int], list[float]] = {}
        peaks: dict[tuple[str, int], list[float]] = {}
        outputs: dict[tuple[str, int], set[bytes]] = {}
        for threads in args.threads:
            for r in range(args.rounds):
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for name in order:
                    out = Path(tmp) / f"{name}.{threads}.out"
                    wall, peak = run_once(trees[name], base + extra.get(name, []), threads, out)
                    walls.setdefault((name, threads), []).append(wall)
                    peaks.setdefault((name, threads), []).append(peak)
                    outputs.setdefault((name, threads), set()).add(out.read_bytes())
                    said = f"{wall:.2f} s, {peak:.0f} MiB"
                    print(f"  {threads} threads, round {r + 1}, {name}: {said}", flush=True)
        rows, results = [], {}
        for threads in args.threads:
            first = median(walls[(list(trees)[0], threads)])
            expected = outputs[(reference, threads)]
            for name in trees:
                key = (name, threads)
                wall = median(walls[key])
                same = outputs[key] == expected and len(expected) == 1
                rows.append(
                    [
                        name,
                        threads,
                        f"{wall:.2f}",
                        f"{min(walls[key]):.2f}-{max(walls[key]):.2f}",
                        f"{n_lines / wall:.1f}",
                        f"{first / wall:.2f}",
                        f"{max(peaks[key]):.0f}",
                        "yes" if same else "NO",
                    ]
                )
                results[f"{name}/{threads}"] = {
                    "wall_s": walls[key],
                    "peak_mib": peaks[key],
                    "sentences_per_s": n_lines / wall,
                    "speed_vs_first": first / wall,
                    f"outputs_equal_{reference}": same,
                }
        print()
        print_table(
            ["tree", "threads", "median s", "range s", "sent/s", "x first", "peak MiB", f"= {reference}"],
            rows,
        )
        write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
