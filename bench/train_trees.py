"""bench/train_speed.py from several source trees, alternated: is a tree's training step as fast as another's?

    python bench/train_trees.py --tree old=/path/to/old/checkout --tree new=. -- --rounds 10

Each tree's ``bench/train_speed.py`` (its own model, loss and allocator settings, against
``torch.nn.Transformer`` in the same process) runs ``--repeats`` times, the trees alternated, in
fresh processes; the arguments after ``--`` go to every run. Per tree and precision: the median of
our target tokens/s, of nn.Transformer's, their ratio, and that ratio against the first tree's. The
ratio to nn.Transformer, measured in the same process a few milliseconds apart, carries the
machine's noise away, so the last column compares the trees even on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import environment, print_config, print_table, write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR", help="a source tree")
    parser.add_argument("--repeats", type=int, default=2, help="runs of every tree, alternated")
    parser.add_argument("rest", nargs="*", help="bench/train_speed.py options (after --)")
    args = parser.parse_args()
    trees = [(name, Path(path).resolve()) for name, _, path in (t.partition("=") for t in args.tree)]
    print_config(
        "train_trees", {"trees": dict((n, str(p)) for n, p in trees), "args": args.rest} | environment(2)
    )
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for repeat in range(args.repeats):
        for name, tree in trees:
            label = f"trees_{name}_{repeat}"
            command = [sys.executable, "bench/train_speed.py", "--json", label, *args.rest]
            print(f"[{repeat + 1}/{args.repeats}] {name}: {' '.join(command[1:])}", flush=True)
            env = {**os.environ, "PYTHONPATH": str(tree)}
            subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
            results = json.loads((tree / "bench" / "results" / f"{label}.json").read_text())["results"]
            for precision in ("fp32", "bf16"):
                if f"ours {precision}" in results:
                    pair = (
                        results[f"ours {precision}"]["tokens_per_s"],
                        results[f"torch {precision}"]["tokens_per_s"],
                    )
                    found.setdefault((name, precision), []).append(pair)
    rows, summary = [], {}
    for (name, precision), pairs in found.items():
        ours = statistics.median(p[0] for p in pairs)
        torch_ = statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        first = statistics.median(p[0] / p[1] for p in found[(trees[0][0], precision)])
        summary[f"{name} {precision}"] = {
            "ours": ours,
            "torch": torch_,
            "ratio": ratio,
            "vs_first": ratio / first,
        }
        rows.append([name, precision, ours, torch_, ratio, ratio / first])
    print_table(
        ["tree", "precision", "ours tok/s", "nn.Transformer tok/s", "ours / nn", f"vs {trees[0][0]}"], rows
    )
    write_json("train_trees", {"trees": [str(p) for _, p in trees], "results": summary})


if __name__ == "__main__":
    main()
