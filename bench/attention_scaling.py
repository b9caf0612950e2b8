"""Attention mechanisms against sequence length: time and peak memory of forward + backward, vs SDPA.

    python bench/attention_scaling.py
    python bench/attention_scaling.py --lengths 256 1024 4096 16384 --precisions fp32 --scopes core
    python bench/attention_scaling.py --roles decoder --scopes layer --mechanisms sdpa linear local

Issue 23, item 1. At the model's shapes (``--d-model`` 512, ``--heads`` 8 of 64, batch 1), for
the encoder (non-causal) and decoder (causal) self-attention roles, every mechanism of
``transformer/mechanisms.py`` with its default settings (``AttentionConfig``'s; linformer's
``max_length`` is set to the length run, since its default of 1024 refuses longer sequences),
plus ``written`` (equation (1) written out, the n x n weights materialised) and ``sdpa``
(``torch.nn.functional.scaled_dot_product_attention``), is timed on a forward + backward pass
in two scopes: ``core``, the mechanism module from projected Q, K, V to the heads' output (as
``MultiHeadAttention`` calls it), and ``layer``, the whole ``MultiHeadAttention`` with its
projections. ``softmax`` is the mechanism module itself (SDPA in fp32 on a CPU, written out
under bf16: ``fastpaths.attention.prefers_written_out``).

Each configuration runs in its own child process (this script with ``--child``): a warm-up call,
then up to ``--repeats`` timed calls (fewer when they are slow), the median reported. Peak
memory: the child's VmHWM at the end minus its VmRSS after imports and building the module (read
by the child from /proc/self/status); the parent's ``ru_maxrss`` of the child (``os.wait4``) is
kept in the JSON too. With ``--memory exact`` (the default) the peak comes from a second child of
the configuration, run with glibc returning freed memory at once (``EXACT_MEMORY_ENV``), so that
it is the peak of what was allocated and alive, the same to the MiB from run to run; the timing
child's own figure, which glibc's caching moved by ±15%, is kept as ``rss_peak_mib``. A child
past ``--timeout`` is killed and reported as ``timeout``; one that runs out of memory (its
address space is capped at ``--memory-limit`` GiB, so that the machine's OOM killer is not
involved) as ``OOM``; a role a mechanism cannot do as ``refused``. No row is dropped.

Not a test: the figures depend on the machine. Results: BENCHMARKS.md, "Attention mechanisms".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from bench.attention_runs import (  # noqa: E402
    ROLES,
    add_child_options,
    add_memory_options,
    add_output_options,
    label_axes,
    length_figure,
    measure,
    memory_description,
    plot_line,
    run_config,
    save_figure,
    timing_description,
    with_exact_memory,
)
from bench.harness import environment, print_config, print_table, set_threads, write_json  # noqa: E402

MECHANISMS = ("sdpa", "written", "softmax", "linear", "performer", "local", "atrous", "sparse", "lsh")
MECHANISMS += ("linformer", "nystrom")
LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUADRATIC = ("sdpa", "written", "softmax")
# Issue 23's targets for the core at 4K (speed as a multiple of SDPA's, memory as a fraction of
# written-out softmax's; LRA's Table 3 anchors) and at 16K (every sub-quadratic mechanism).
TARGETS_4K = {name: (5.0, 0.15) for name in ("linear", "performer", "linformer", "local")}
TARGETS_4K["lsh"] = (1.0, None)
TARGET_16K = 15.0


# ------------------------------------------------------------------------------------- the child


def _reference_modules():
    """Written-out softmax and SDPA behind the mechanisms' signature."""
    from torch import nn

    from transformer.attention import fused_attention, scaled_dot_product_attention

    class Written(nn.Module):
        def forward(self, q, k, v, mask=None, causal=False, state=None, need_weights=False):
            return scaled_dot_product_attention(q, k, v, mask, causal)[0], None

    class SDPA(nn.Module):
        def forward(self, q, k, v, mask=None, causal=False, state=None, need_weights=False):
            return fused_attention(q, k, v, mask, causal), None

    return {"written": Written, "sdpa": SDPA}


def run_child(spec: dict) -> dict:
    """One configuration, measured in this process: the result's dict (printed as JSON by main)."""
    import torch

    from transformer.attention import MultiHeadAttention
    from transformer.mechanisms import REFUSED, AttentionConfig, build_mechanism
    from transformer.registry import MECHANISMS

    set_threads(spec["threads"])
    torch.manual_seed(0)
    name, role, n = spec["mechanism"], ROLES[spec["role"]], spec["length"]
    causal = spec["role"] == "decoder"
    d_model, heads = spec["d_model"], spec["heads"]
    d_head = d_model // heads
    if name in REFUSED and REFUSED[name].get(role):
        return {"status": "refused", "why": REFUSED[name][role]}
    if name in QUADRATIC[:2]:
        mechanism = _reference_modules()[name]()
    else:
        cfg = AttentionConfig(**{role: name}, max_length=max(n, AttentionConfig.max_length))
        mechanism = build_mechanism(role, cfg, d_head, 0.0)
    if spec["scope"] == "layer":
        layer = MECHANISMS[name].layer if name in MECHANISMS else None  # LSH's, Linformer's own
        module = (layer or MultiHeadAttention)(d_model, heads, 0.0, mechanism, causal=causal)
        x = torch.randn(1, n, d_model, requires_grad=True)
        inputs = [x]

        def call():
            return module(x)[0]

    else:
        module = mechanism
        inputs = [torch.randn(1, heads, n, d_head, requires_grad=True) for _ in range(3)]

        def call():
            return module(*inputs, None, causal, None, False)[0]

    return measure(module, inputs, call, spec)


# ------------------------------------------------------------------------------------ the parent


def _cell(r: dict, key: str, scale: float = 1.0) -> object:
    return r[key] * scale if r["status"] == "ok" else r["status"]


def report(results: list[dict], lengths: list[int]) -> dict:
    """Tables per role x precision x scope, crossover lengths and targets; returns the summary."""
    summary = {}
    groups = sorted({(r["role"], r["precision"], r["scope"]) for r in results}, key=str)
    for role, precision, scope in groups:
        rows_of = [r for r in results if (r["role"], r["precision"], r["scope"]) == (role, precision, scope)]
        by = {(r["mechanism"], r["length"]): r for r in rows_of}
        names = list(dict.fromkeys(r["mechanism"] for r in rows_of))
        print(f"## {role}, {precision}, {scope}: forward + backward, batch 1")
        table = []
        for name in names:
            for n in lengths:
                r = by.get((name, n))
                if r is None:
                    continue
                sdpa, written = by.get(("sdpa", n)), by.get(("written", n))
                speed = mem = mem_w = float("nan")
                if r["status"] == "ok" and sdpa and sdpa["status"] == "ok":
                    speed = sdpa["seconds"] / r["seconds"]
                    mem = r["peak_mib"] / sdpa["peak_mib"] if sdpa["peak_mib"] > 0 else float("nan")
                if r["status"] == "ok" and written and written["status"] == "ok" and written["peak_mib"] > 0:
                    mem_w = r["peak_mib"] / written["peak_mib"]
                r["speed_vs_sdpa"], r["memory_vs_sdpa"], r["memory_vs_written"] = speed, mem, mem_w
                table.append([name, n, _cell(r, "seconds", 1e3), _cell(r, "peak_mib"), speed, mem, mem_w])
        print_table(
            ["mechanism", "length", "ms", "peak MiB", "speed vs SDPA", "mem vs SDPA", "mem vs written"], table
        )
        crossover = []
        for name in names:
            if name == "sdpa":
                continue
            faster = [n for n in lengths if by.get((name, n), {}).get("speed_vs_sdpa", 0) > 1]
            first = next(
                (
                    n
                    for n in lengths
                    if n in faster
                    and all(
                        m in faster for m in lengths if m > n and by.get((name, m), {}).get("status") == "ok"
                    )
                ),
                None,
            )
            refused = all(by[(name, n)]["status"] == "refused" for n in lengths if (name, n) in by)
            crossover.append(
                [name, first if first else "refused" if refused else "never (in the lengths run)"]
            )
        print("faster than SDPA from this length on (and at every longer length that ran):")
        print_table(["mechanism", "length"], crossover)
        targets = []
        if scope == "core":
            for name, (speed_target, mem_target) in TARGETS_4K.items():
                r = by.get((name, 4096))
                if r is None:
                    continue
                if r["status"] == "refused":
                    targets.append([name, "4K", "any", "refused", "n/a (role not supported)"])
                    continue
                met_speed = r["status"] == "ok" and r["speed_vs_sdpa"] >= speed_target
                row = [name, "4K", f"≥ {speed_target:g}x SDPA", r.get("speed_vs_sdpa", r["status"])]
                targets.append([*row, "met" if met_speed else "not met"])
                if mem_target is not None:
                    met_mem = r["status"] == "ok" and r["memory_vs_written"] <= mem_target
                    row = [name, "4K", f"≤ {mem_target:g}x written's memory", r.get("memory_vs_written")]
                    targets.append([*row, "met" if met_mem else "not met"])
            for name in names:
                r = by.get((name, 16384))
                if name in QUADRATIC or r is None or r["status"] == "refused":
                    continue
                met = r["status"] == "ok" and r["speed_vs_sdpa"] >= TARGET_16K
                speed = r.get("speed_vs_sdpa", r["status"])
                targets.append([name, "16K", f"≥ {TARGET_16K:g}x SDPA", speed, "met" if met else "not met"])
            if targets:
                print("issue 23's targets (core):")
                print_table(["mechanism", "length", "target", "measured", "verdict"], targets)
        summary[f"{role}/{precision}/{scope}"] = {"crossover": crossover, "targets": targets}
    return summary


def plot(results: list[dict], path: Path, lengths: list[int]) -> None:
    """Time and memory against length, log-log, one line per mechanism (core, encoder, fp32)."""
    chosen = [r for r in results if (r["scope"], r["role"], r["precision"]) == ("core", "encoder", "fp32")]
    if not chosen:
        print("no core/encoder/fp32 results to plot")
        return
    fig, axes, plt = length_figure(1, 5)
    names = list(dict.fromkeys(r["mechanism"] for r in chosen))
    colours = plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]  # 20, no repeat
    for name, colour in zip(names, colours, strict=False):
        ok = sorted((r["length"], r) for r in chosen if r["mechanism"] == name and r["status"] == "ok")
        if not ok:
            continue
        style = "--" if name in QUADRATIC else "-"
        points = [(n, r["seconds"], r["peak_mib"]) for n, r in ok]
        plot_line(axes[0], points, style, color=colour, marker="o", label=name)
    label_axes(axes[0], lengths)
    axes[0][0].legend(fontsize=8)
    title = "Attention core, encoder (non-causal), fp32, batch 1, 8 heads of 64: forward + backward"
    save_figure(fig, path, title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="sequence lengths")
    parser.add_argument("--roles", nargs="+", default=list(ROLES), choices=list(ROLES), help="roles")
    parser.add_argument(
        "--precisions", nargs="+", choices=["fp32", "bf16"], help="default: fp32, and bf16 where native"
    )
    parser.add_argument("--force-bf16", action="store_true", help="bf16 even where the CPU emulates it")
    parser.add_argument("--scopes", nargs="+", default=["core", "layer"], choices=["core", "layer"])
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
    add_child_options(parser, timeout=120.0)
    add_memory_options(
        parser,
        "peak memory from a second child with glibc returning freed memory at once (default), or the "
        "timing child's own, under glibc's default caching",
    )
    parser.add_argument("--plot", default=str(ROOT / "docs" / "attention_scaling.png"), help="PNG ('' none)")
    add_output_options(parser, "attention_scaling")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.from_json:  # several runs' results together, e.g. the roles or scopes run one by one
        results = [r for path in args.from_json for r in json.loads(Path(path).read_text())["results"]]
        lengths = sorted({r["length"] for r in results})
        report(results, lengths)
        if args.plot:
            plot(results, Path(args.plot), lengths)
        return

    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return

    from fastpaths.hardware import native_bf16

    precisions = args.precisions or (["fp32", "bf16"] if native_bf16() else ["fp32"])
    if "bf16" in precisions and not native_bf16() and not args.force_bf16:
        print("bf16 left out: this CPU emulates it (fastpaths.hardware.native_bf16); --force-bf16 runs it")
        precisions = [p for p in precisions if p != "bf16"]
    lengths = sorted(args.lengths)
    config = {
        **environment(args.threads),
        "command": " ".join(["python", "bench/attention_scaling.py", *sys.argv[1:]]),
        "lengths": lengths,
        "roles": args.roles,
        "precisions": precisions,
        "scopes": args.scopes,
        "mechanisms": args.mechanisms,
        "d_model": args.d_model,
        "heads": args.heads,
        "batch": 1,
        "mechanism_settings": "AttentionConfig defaults; linformer max_length = max(length, 1024)",
        "timing": timing_description(args.repeats),
        "memory": memory_description(args.memory, "from a second child", "the timing child's"),
        "timeout_s": args.timeout,
        "memory_limit_gib": args.memory_limit,
    }
    print_config("attention scaling", config)
    results = []
    started = time.perf_counter()
    for scope in args.scopes:
        for role in args.roles:
            for precision in precisions:
                for n in lengths:
                    for name in args.mechanisms:
                        spec = {
                            "mechanism": name,
                            "role": role,
                            "precision": precision,
                            "scope": scope,
                            "length": n,
                            "d_model": args.d_model,
                            "heads": args.heads,
                            "threads": args.threads,
                            "repeats": args.repeats,
                            "timeout": args.timeout,
                        }
                        script = Path(__file__)
                        r = {**spec, **run_config(spec, args.memory_limit, script), "memory": args.memory}
                        if args.memory == "exact" and r["status"] == "ok":
                            r = with_exact_memory(r, spec, args.memory_limit, script)
                        results.append(r)
                        shown = (
                            f"{r['seconds'] * 1e3:.1f} ms, {r['peak_mib']:.0f} MiB"
                            if r["status"] == "ok"
                            else ""
                        )
                        why = r.get("why", "")
                        print(
                            f"  {scope} {role} {precision} {n:>6} {name:<10} {r['status']} {shown} {why}",
                            flush=True,
                        )
    print(f"\nall configurations: {time.perf_counter() - started:.0f} s\n")
    summary = report(results, lengths)
    if args.plot:
        plot(results, Path(args.plot), lengths)
    write_json(args.json, {"config": config, "results": results, "summary": summary})


if __name__ == "__main__":
    main()
