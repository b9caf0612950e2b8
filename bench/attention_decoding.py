"""Step-by-step decoding through one decoder self-attention layer: time per step as the state grows.

    python bench/attention_decoding.py
    python bench/attention_decoding.py --steps 4096 --mechanisms softmax linear performer local
    python bench/attention_decoding.py --steps 4096 --mechanisms softmax lsh --d-model 64 --heads 4

Issue 23, item 3. One ``MultiHeadAttention`` layer (``--d-model`` 512, ``--heads`` 8 of 64, batch
1, inference mode) decodes ``--steps`` steps greedily: each step feeds one position, the layer's
output (layer-normalised) being the next step's input, through the mechanism's own decoding state
(``mechanism.new_state``: ``KVCache`` for softmax, the RNN state (S, Z) for linear and Performer,
the window cache for local, the cache and each bucket's last c positions for LSH). Per mechanism:
the mean time of the first and last 10% of the steps
and their ratio (the issue's target: last / first ≤ 1.2 for the constant-state mechanisms;
softmax's grows with the cache), beside the same ratio of the analytic FLOPs of a step; the
state's bytes (the tensors it holds, storage allocated) at the first and last step; the total time
and FLOPs as ratios to softmax's; and the peak bytes of tensor storage over the whole decoding,
counted exactly (``bench/storage_meter.py``, in a second, untimed pass), beside softmax's (issue
41, item 3: LSH's 4,096 steps in a tiny model at ≤ 1.0x softmax's time and memory).

Not a test: the figures depend on the machine. Results: BENCHMARKS.md, "Attention mechanisms".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/x.py` without installing the project
    sys.path.insert(0, str(ROOT))

from bench.harness import (  # noqa: E402
    environment,
    print_config,
    print_table,
    set_threads,
    timed,
    write_json,
)

MECHANISMS = ("softmax", "linear", "performer", "local", "lsh")


def state_bytes(state: object) -> int:
    """Bytes of the tensors a decoding state holds (each storage once, as allocated)."""
    import torch

    seen, total = set(), 0
    for value in vars(state).values():  # (an LSHCache's ring and counts are small beside its kv)
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def step_flops(name: str, t: int, d_model: int, heads: int, cfg) -> float:
    """Multiply-adds x 2 of decoding step ``t`` (1-based): projections plus the mechanism's core."""
    d_head = d_model // heads
    projections = 2 * 4 * d_model * d_model  # Q, K, V and the output, one position
    if name == "softmax":
        core = 2 * 2 * t * d_model  # q·k over t keys and the weighted sum of t values, every head
    elif name == "linear":
        core = 2 * 3 * d_head * d_model  # S += φ(k)vᵀ, φ(q)ᵀS, φ(q)·Z  (m = d_head features)
    elif name == "performer":
        m = cfg.features
        core = 2 * 3 * m * d_model + 2 * 2 * d_head * m * heads  # as linear with m, plus φ(q), φ(k)
    elif name == "local":
        core = 2 * 2 * min(t, cfg.window) * d_model  # softmax over the last `window` positions
    elif name == "lsh":  # the R sets of the last c keys of the query's bucket, and the hash
        core = (
            2 * 2 * cfg.rounds * min(t, cfg.chunk_length) * d_model
            + 2 * d_model * cfg.rounds * cfg.buckets // 2
        )
    else:
        raise ValueError(name)
    return projections + core


def run_steps(layer, steps: int, d_model: int, times: list | None = None, sizes: list | None = None) -> None:
    """Decodes ``steps`` steps through ``layer`` from a fixed first input, each output the next input."""
    import torch
    import torch.nn.functional as F

    from decoding.state import new_state

    torch.manual_seed(1)
    with torch.inference_mode():
        state = new_state(layer.mechanism, steps)
        x = torch.randn(1, 1, d_model)
        for _ in range(steps):
            seconds, (out, _) = timed(lambda x=x: layer(x, state=state))
            x = F.layer_norm(out, (d_model,))
            if times is not None:
                times.append(seconds)
            if sizes is not None:
                sizes.append(state_bytes(state))


def decode(name: str, steps: int, d_model: int, heads: int, memory: bool = True) -> dict:
    import torch

    from bench.storage_meter import StorageMeter
    from transformer.mechanisms import AttentionConfig, build_attention

    torch.manual_seed(0)
    cfg = AttentionConfig(decoder_self=name)
    layer = build_attention("decoder_self", cfg, d_model, heads, 0.0).eval()
    times, state_sizes = [], []
    run_steps(layer, steps, d_model, times, state_sizes)
    peak = float("nan")
    if memory:  # a second pass: the meter's bookkeeping would slow the timed one
        with StorageMeter() as meter:
            run_steps(layer, steps, d_model)
        peak = meter.peak_bytes
    tenth = max(1, steps // 10)
    first, last = sum(times[:tenth]) / tenth, sum(times[-tenth:]) / tenth
    flops = [step_flops(name, t, d_model, heads, cfg) for t in range(1, steps + 1)]
    flop_first, flop_last = sum(flops[:tenth]) / tenth, sum(flops[-tenth:]) / tenth
    return {
        "first_ms": first * 1e3,
        "last_ms": last * 1e3,
        "last_over_first": last / first,
        "flop_last_over_first": flop_last / flop_first,
        "state_first_bytes": state_sizes[0],
        "state_last_bytes": state_sizes[-1],
        "total_s": sum(times),
        "total_flops": sum(flops),
        "step_ms": [s * 1e3 for s in times],
        "peak_bytes": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4096, help="decoding steps")
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
    parser.add_argument("--d-model", type=int, default=512, help="model width")
    parser.add_argument("--heads", type=int, default=8, help="attention heads")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the second, metered pass (peak storage bytes)"
    )
    parser.add_argument(
        "--json", default="attention_decoding", help="results file: bench/results/<name>.json"
    )
    args = parser.parse_args()

    set_threads(args.threads)
    config = {
        **environment(args.threads),
        "command": " ".join(["python", "bench/attention_decoding.py", *sys.argv[1:]]),
        "steps": args.steps,
        "mechanisms": args.mechanisms,
        "d_model": args.d_model,
        "heads": args.heads,
        "batch": 1,
        "what": "one MultiHeadAttention layer, causal self-attention, one position per step, fp32, "
        "inference mode, the mechanism's own state (AttentionConfig defaults)",
        "first/last": f"mean of the first and last {max(1, args.steps // 10)} steps",
    }
    print_config("attention decoding", config)
    results = {}
    for name in args.mechanisms:
        results[name] = decode(name, args.steps, args.d_model, args.heads, not args.no_memory)
        r = results[name]
        print(f"  {name}: {r['total_s']:.2f} s, last/first {r['last_over_first']:.2f}", flush=True)
    base = results.get("softmax")
    rows = []
    for name, r in results.items():
        total_ratio = r["total_s"] / base["total_s"] if base else float("nan")
        flop_ratio = r["total_flops"] / base["total_flops"] if base else float("nan")
        peak_ratio = r["peak_bytes"] / base["peak_bytes"] if base else float("nan")
        rows.append(
            [
                name,
                r["first_ms"],
                r["last_ms"],
                r["last_over_first"],
                r["flop_last_over_first"],
                r["state_first_bytes"] / 1024,
                r["state_last_bytes"] / 1024,
                r["total_s"],
                total_ratio,
                flop_ratio,
                r["peak_bytes"] / 1024,
                peak_ratio,
                "met" if r["last_over_first"] <= 1.2 else "not met",
            ]
        )
    print()
    print_table(
        [
            "mechanism",
            "first 10% ms/step",
            "last 10% ms/step",
            "last/first",
            "FLOPs last/first",
            "state KiB first",
            "state KiB last",
            "total s",
            "total vs softmax",
            "FLOPs vs softmax",
            "peak KiB",
            "peak vs softmax",
            "last/first ≤ 1.2",
        ],
        rows,
    )
    write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
