"""Our attention mechanisms against lucidrains' implementations: time and peak memory against length.

    python bench/attention_reference.py
    python bench/attention_reference.py --lengths 256 1024 --pairs local lsh --roles encoder --scopes layer
    python bench/attention_reference.py --from-json run1.json run2.json run3.json --median --plot ''

Issue 23, item 2: "the same layer, shapes and settings" in ``performer-pytorch``, ``linformer``,
``nystrom-attention``, ``local-attention`` and ``reformer-pytorch`` (the ``bench`` extra, never a
runtime dependency). At d_model 512 (``--d-model``), 8 heads of 64 (``--heads``), batch 1, fp32,
a forward + backward pass of each pair is timed in two scopes: ``layer``, the whole attention
layer with its projections (ours: ``MultiHeadAttention`` around the mechanism), and ``core``,
projected Q, K, V [1, heads, n, 64] to the heads' output, where their package exposes that
part on its own (``FastAttention``, ``LocalAttention``, reformer's ``LSHAttention``; Linformer
and Nyström project inside their layer's ``forward``, so layer only). Roles: ``encoder``
(non-causal) for every pair, ``decoder`` (causal) where both implementations have it
(Performer, local, LSH). Each configuration runs in its own child process through
``bench/attention_runs.py`` (``run_config``: a time limit, an address-space cap,
``OOM`` and ``timeout`` reported, not dropped; ``measure``: the timing loop, peak memory as the
child's VmHWM minus its VmRSS after building the module and inputs). The speed ratio comes
from one more child where both ran (``--speed in-turn``, the default): ours and theirs timed in
turn, call by call, and the median of their time / ours over the pairs of calls, so that a slow
spell of the shared machine falls on both instead of on whichever child ran in it (separate
children, ``--speed separate``, gave ratios that moved by ±10% between runs of the same code).
The tables' times are then that child's medians too. Memory (``--memory exact``, the default):
the two separate children run with glibc told to return every freed allocation over 64 KiB at
once (``attention_runs.EXACT_MEMORY_ENV``), so that their peak RSS is the peak of what was
allocated and alive; with its default caching the same code's peak moved by ±15% between runs
(``--memory rss``). Their own times are then slowed by page faults and not shown.

Theirs are configured with our defaults (``AttentionConfig``), mapped to their nearest setting:
``bench/lucidrains.py`` gives the mapping, and where the outputs are not the same.

Ratios: "speed" = their time / ours (≥ 1.0: ours is at least as fast), "memory" = ours / theirs
(≤ 1.0: ours needs at most as much), at every length both ran. Not a test: the figures depend on
the machine. The plot (``--plot``, the ``--plot-scope`` scope): time and memory against length,
log-log, a row per role, ours solid, theirs dashed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and the model are imported where they are used (the parent stays small)
    from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from bench.attention_runs import (  # noqa: E402
    EXACT_MEMORY_ENV,
    ROLES,
    add_child_options,
    add_memory_options,
    add_output_options,
    label_axes,
    length_figure,
    measure,
    measure_in_turn,
    memory_description,
    plot_line,
    run_config,
    save_figure,
    timing_description,
)
from bench.harness import environment, median, print_config, print_table, set_threads, version, write_json  # noqa: E402
from bench.lucidrains import (  # noqa: E402
    CAUSAL,
    CORES,
    PACKAGES,
    PAIRS,
    check_length,
    missing_packages,
    our_layer,
    our_mechanism,
    reference_core,
    reference_layer,
)

LENGTHS = (256, 1024, 4096, 16384)


# ------------------------------------------------------------------------------------- the child


def build(spec: dict, impl: str) -> tuple[nn.Module, list[Tensor], Callable[[], Tensor]]:
    """Implementation ``impl`` (ours or theirs) of ``spec``: its module, its input leaves and a
    call that runs it forward on them. Raises ValueError for a setting one of them refuses."""
    import torch

    from transformer.mechanisms import AttentionConfig

    pair, n, scope = spec["pair"], spec["length"], spec["scope"]
    causal = spec["role"] == "decoder"
    d_model, heads = spec["d_model"], spec["heads"]
    d_head = d_model // heads
    cfg = AttentionConfig()
    if impl == "ours" and scope == "layer":
        module = our_layer(pair, cfg, d_model, heads, causal, n)
    elif impl == "ours":
        module = our_mechanism(pair, cfg, d_head, causal, n)
    elif scope == "layer":
        check_length(pair, cfg, n)
        module = reference_layer(pair, cfg, d_model, heads, causal, n)
    else:
        check_length(pair, cfg, n)
        module = reference_core(pair, cfg, d_head, causal)
    if scope == "layer":
        inputs = [torch.randn(1, n, d_model, requires_grad=True)]
        if impl == "ours":
            return module, inputs, lambda: module(inputs[0])[0]
        return module, inputs, lambda: module(inputs[0])
    inputs = [torch.randn(1, heads, n, d_head, requires_grad=True) for _ in range(3)]
    if impl == "ours":
        return module, inputs, lambda: module(*inputs, None, causal, None, False)[0]
    return module, inputs, lambda: module(*inputs)


def run_child(spec: dict) -> dict:
    """One configuration, measured in this process: the result's dict (printed as JSON by main).

    ``spec["impl"]`` ours or theirs: its time and peak memory (``measure``). ``both``: the two
    timed in turn (:func:`measure_in_turn`), for the speed ratio only.
    """
    import torch

    set_threads(spec["threads"])
    torch.manual_seed(0)
    impls = ("ours", "theirs") if spec["impl"] == "both" else (spec["impl"],)
    try:
        built = {impl: build(spec, impl) for impl in impls}
    except ValueError as error:
        return {"status": "refused", "why": str(error)}
    if spec["impl"] == "both":
        return measure_in_turn(built, spec)
    return measure(*built[spec["impl"]], spec)


# ------------------------------------------------------------------------------------ the parent


def _ms(r: dict | None) -> object:
    return "-" if r is None else r["seconds"] * 1e3 if r["status"] == "ok" else r["status"]


def _mib(r: dict | None) -> object:
    return "-" if r is None else r["peak_mib"] if r["status"] == "ok" else r["status"]


def merge_runs(runs: list[list[dict]]) -> list[dict]:
    """Several runs' results of the same configurations, one result each: the median time and
    peak memory over the runs where it ran (``runs``: how many; ``run_seconds``: each run's time,
    by run number, for the per-run speed ratios). A configuration that ran in no run keeps its
    first run's status (OOM, timeout, refused)."""
    groups: dict[tuple, list[dict]] = {}
    for number, results in enumerate(runs):
        for r in results:
            key = (r["scope"], r["role"], r["pair"], r["impl"], r["length"])
            groups.setdefault(key, []).append({**r, "run": number})
    merged = []
    for rs in groups.values():
        ok = [r for r in rs if r["status"] == "ok"]
        if not ok:
            merged.append(rs[0])
            continue
        entry = {
            **ok[0],
            "seconds": median(r["seconds"] for r in ok),
            "peak_mib": median(r["peak_mib"] for r in ok),
            "runs": len(ok),
            "run_seconds": {r["run"]: r["seconds"] for r in ok},
        }
        in_turn = [r for r in ok if r.get("in_turn", {}).get("status") == "ok"]
        if in_turn:
            speeds = {r["run"]: r["in_turn"]["speed"] for r in in_turn}
            entry["in_turn"] = {
                "status": "ok",
                "speed": median(speeds.values()),
                "run_speeds": speeds,
                **{
                    key: median(r["in_turn"][key] for r in in_turn)
                    for key in ("ours_seconds", "theirs_seconds")
                    if all(key in r["in_turn"] for r in in_turn)
                },
            }
        merged.append(entry)
    return merged


def shown_seconds(ours: dict | None, theirs: dict | None) -> tuple[object, object]:
    """The times of ours and theirs for the tables and the plot: those of the calls timed in turn
    where that ran (the calls the speed ratio comes from), else each child's own (as ``_ms``, in
    seconds)."""
    in_turn = (ours or {}).get("in_turn") or {}
    if in_turn.get("status") == "ok" and "ours_seconds" in in_turn:
        return in_turn["ours_seconds"], in_turn["theirs_seconds"]
    return tuple(r["seconds"] if r and r["status"] == "ok" else None for r in (ours, theirs))


def speed_ratio(ours: dict, theirs: dict) -> float:
    """Their time / ours: timed in turn in one process where that ran, else from the two children."""
    in_turn = ours.get("in_turn") or {}
    return in_turn["speed"] if in_turn.get("status") == "ok" else theirs["seconds"] / ours["seconds"]


def _run_speeds(ours: dict | None, theirs: dict | None) -> object:
    """Their time / ours in each run both ran, as "lowest-highest" ("-" for a single run)."""
    if ours and "run_speeds" in ours.get("in_turn", {}):
        ratios = list(ours["in_turn"]["run_speeds"].values())
        return f"{min(ratios):.2f}-{max(ratios):.2f} ({len(ratios)})" if len(ratios) > 1 else "-"
    if not ours or not theirs or "run_seconds" not in ours or "run_seconds" not in theirs:
        return "-"
    both = [k for k in ours["run_seconds"] if k in theirs["run_seconds"]]
    ratios = [theirs["run_seconds"][k] / ours["run_seconds"][k] for k in both]
    return f"{min(ratios):.2f}-{max(ratios):.2f} ({len(ratios)})" if len(ratios) > 1 else "-"


def report(results: list[dict], lengths: list[int]) -> dict:
    """Tables per role x scope (ours against theirs at each length) and the issue's verdict; the summary."""
    summary = {}
    repeated = any("run_seconds" in r for r in results)  # merged runs: medians, and each run's ratio
    groups = sorted(
        {(r["scope"], r["role"]) for r in results}, key=lambda g: (g[0] != "layer", list(ROLES).index(g[1]))
    )
    for scope, role in groups:
        by = {
            (r["pair"], r["impl"], r["length"]): r
            for r in results
            if (r["scope"], r["role"]) == (scope, role)
        }
        pairs = list(dict.fromkeys(p for p, _, _ in by))
        kind = "causal" if role == "decoder" else "non-causal"
        print(f"## {scope}, {role} ({kind}), fp32: forward + backward")
        table, verdicts = [], []
        for pair in pairs:
            failed, compared = [], 0
            for n in lengths:
                ours, theirs = by.get((pair, "ours", n)), by.get((pair, "theirs", n))
                if ours is None and theirs is None:
                    continue
                speed = memory = float("nan")
                verdict = "-"
                if ours and theirs and ours["status"] == theirs["status"] == "ok":
                    speed = speed_ratio(ours, theirs)
                    memory = ours["peak_mib"] / theirs["peak_mib"] if theirs["peak_mib"] > 0 else float("nan")
                    short = [
                        what for what, ok in (("speed", speed >= 1.0), ("memory", memory <= 1.0)) if not ok
                    ]
                    verdict = "met" if not short else f"not met ({', '.join(short)})"
                    compared += 1
                    if short:
                        failed.append(f"{n}: {', '.join(short)}")
                    ours["speed_vs_theirs"], ours["memory_vs_theirs"] = speed, memory
                times = [
                    _ms(r) if seconds is None else seconds * 1e3
                    for r, seconds in zip((ours, theirs), shown_seconds(ours, theirs), strict=True)
                ]
                row = [pair, n, *times, speed, _mib(ours), _mib(theirs), memory, verdict]
                table.append(row + ([_run_speeds(ours, theirs)] if repeated else []))
            both = (
                "no length that both ran"
                if not compared
                else "met"
                if not failed
                else "not met: " + "; ".join(failed)
            )
            verdicts.append([pair, PACKAGES[pair][0], compared, both])
        print_table(
            ["pair", "length", "ours ms", "theirs ms", "speed (theirs/ours)", "ours MiB", "theirs MiB",
             "memory (ours/theirs)", "≥ 1.0× speed, ≤ 1.0× memory"]
            + (["speed in each run (runs)"] if repeated else []),
            table,
        )  # fmt: skip
        print("ours ≥ 1.0× their speed and ≤ 1.0× their memory at every length both ran:")
        print_table(["pair", "theirs", "lengths both ran", "verdict"], verdicts)
        summary[f"{scope}/{role}"] = verdicts
    return summary


def plot(results: list[dict], path: Path, lengths: list[int], scope: str) -> None:
    """Time and memory against length, log-log, one line per implementation (ours solid, theirs dashed);
    a row per role."""
    chosen = [r for r in results if r["scope"] == scope and r["status"] == "ok"]
    by = {(r["role"], r["pair"], r["impl"], r["length"]): r for r in chosen}
    seconds = {}  # (role, pair, impl, length) -> the time shown in the tables
    for (role, pair, impl, n), r in by.items():
        if impl == "ours":
            shown = shown_seconds(r, by.get((role, pair, "theirs", n)))
            seconds.update({(role, pair, i, n): t for i, t in zip(("ours", "theirs"), shown, strict=True)})

    def time_of(r: dict) -> float:
        shown = seconds.get((r["role"], r["pair"], r["impl"], r["length"]))
        return r["seconds"] if shown is None else shown

    roles = [role for role in ROLES if any(r["role"] == role for r in chosen)]
    if not roles:
        print(f"no {scope} results to plot")
        return
    fig, axes, plt = length_figure(len(roles), 4.5)
    colors = dict(zip(PAIRS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for row, role in zip(axes, roles, strict=True):
        for pair in PAIRS:
            for impl, style in (("ours", "-"), ("theirs", "--")):
                ok = sorted(
                    (r["length"], r)
                    for r in chosen
                    if (r["role"], r["pair"], r["impl"]) == (role, pair, impl)
                )
                if not ok:
                    continue
                label = f"{pair} (ours)" if impl == "ours" else f"{pair} ({PACKAGES[pair][0]})"
                points = [(n, time_of(r), r["peak_mib"]) for n, r in ok]
                marker = "o" if impl == "ours" else "s"
                plot_line(row, points, style, color=colors[pair], marker=marker, label=label)
        label_axes(row, lengths, f"{role} ({'causal' if role == 'decoder' else 'non-causal'})")
        row[0].legend(fontsize=7, loc="upper left")
    save_figure(fig, path, f"Attention {scope}, ours against lucidrains', fp32, batch 1: forward + backward")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="sequence lengths")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS), help="mechanisms")
    parser.add_argument("--roles", nargs="+", default=list(ROLES), choices=list(ROLES), help="roles")
    parser.add_argument("--scopes", nargs="+", default=["layer", "core"], choices=["layer", "core"])
    add_child_options(parser, timeout=60.0)
    parser.add_argument(
        "--speed",
        default="in-turn",
        choices=["in-turn", "separate"],
        help="speed ratio from ours and theirs timed in turn in one more child (default), or from "
        "the two children's times",
    )
    add_memory_options(
        parser,
        "peak memory of the separate children with glibc returning freed memory at once (default; "
        "needs --speed in-turn, their own times are slowed) or with its default caching",
    )
    parser.add_argument(
        "--plot", default=str(ROOT / "docs" / "attention_reference.png"), help="PNG ('' none)"
    )
    parser.add_argument("--plot-scope", default="layer", choices=["layer", "core"], help="scope plotted")
    add_output_options(parser, "attention_reference")
    parser.add_argument(
        "--median", action="store_true", help="with --from-json: the files are repeated runs; report medians"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return
    if args.from_json:  # several runs' results together, e.g. the roles or scopes run one by one
        runs = [json.loads(Path(path).read_text())["results"] for path in args.from_json]
        # The same configuration in several files: repeated runs, reported by their medians.
        results = merge_runs(runs) if args.median else [r for run in runs for r in run]
        lengths = sorted({r["length"] for r in results})
        report(results, lengths)
        if args.plot:
            plot(results, Path(args.plot), lengths, args.plot_scope)
        return
    if args.memory == "exact" and args.speed == "separate":
        parser.error(
            "--memory exact slows the separate children's times, which --speed separate uses: "
            "add --memory rss"
        )
    missing = missing_packages(args.pairs)
    if missing:
        sys.exit(
            f"attention_reference: needs {', '.join(missing)}, from the bench extra "
            "(python3 -m pip install -e '.[bench]')"
        )

    lengths = sorted(args.lengths)
    config = {
        **environment(args.threads),
        **{PACKAGES[p][0]: version(PACKAGES[p][0]) for p in args.pairs},
        "command": " ".join(["python", "bench/attention_reference.py", *sys.argv[1:]]),
        "lengths": lengths,
        "pairs": args.pairs,
        "roles": args.roles,
        "scopes": args.scopes,
        "d_model": args.d_model,
        "heads": args.heads,
        "batch": 1,
        "precision": "fp32",
        "settings": "AttentionConfig defaults, theirs mapped to them (the docstring's table)",
        "not run": f"decoder: {', '.join(p for p in PAIRS if p not in CAUSAL)} (neither is causal); "
        f"core: {', '.join(p for p in PAIRS if p not in CORES)} (no core apart from their layer)",
        "timing": timing_description(args.repeats),
        "speed": "their time / ours: "
        + (
            f"median over {args.repeats} or more pairs of calls (more while under 1 s, at most 25), ours "
            "and theirs in turn in one more child, so that the shared machine's slow spells fall on both"
            if args.speed == "in-turn"
            else "the two children's median times"
        ),
        "memory": memory_description(args.memory, "from the separate children", "the separate children's"),
        "timeout_s": args.timeout,
        "memory_limit_gib": args.memory_limit,
    }
    print_config("attention against the reference implementations", config)
    results = []
    started = time.perf_counter()
    for scope in args.scopes:
        for role in args.roles:
            for n in lengths:
                for pair in args.pairs:
                    if (role == "decoder" and pair not in CAUSAL) or (scope == "core" and pair not in CORES):
                        continue
                    done = {}
                    for impl in ("ours", "theirs", "both"):
                        ran = [done[i]["status"] == "ok" for i in done]
                        if impl == "both" and (args.speed != "in-turn" or not all(ran)):
                            break
                        spec = {
                            "pair": pair,
                            "impl": impl,
                            "role": role,
                            "scope": scope,
                            "length": n,
                            "precision": "fp32",
                            "d_model": args.d_model,
                            "heads": args.heads,
                            "threads": args.threads,
                            "repeats": args.repeats,
                            "timeout": args.timeout,
                            "memory": args.memory,
                        }
                        exact = args.memory == "exact" and impl != "both"  # in turn: the speed's child
                        env = EXACT_MEMORY_ENV if exact else None
                        r = {**spec, **run_config(spec, args.memory_limit, Path(__file__), env)}
                        if impl == "both":  # the speed ratio belongs to the pair: kept with ours
                            done["ours"]["in_turn"] = r
                            shown = (
                                f"their time / ours {r['speed']:.3f} ({r['pairs']} pairs)"
                                if r["status"] == "ok"
                                else ""
                            )
                        else:
                            done[impl] = r
                            results.append(r)
                            shown = "" if r["status"] != "ok" else f"{r['peak_mib']:.0f} MiB"
                            if r["status"] == "ok" and not exact:  # exact: its time is slowed, not shown
                                shown += f", {r['seconds'] * 1e3:.1f} ms"
                        print(
                            f"  {scope} {role} {n:>6} {pair:<10} {impl:<6} {r['status']} {shown}",
                            r.get("why", ""),
                            flush=True,
                        )
    print(f"\nall configurations: {time.perf_counter() - started:.0f} s\n")
    summary = report(results, lengths)
    if args.plot:
        plot(results, Path(args.plot), lengths, args.plot_scope)
    write_json(args.json, {"config": config, "results": results, "summary": summary})


if __name__ == "__main__":
    main()
