"""Attention mechanisms against sequence length on a GPU: time and peak memory of forward + backward.

    python bench/gpu_attention.py                                   # CUDA: 1K to 16K, bf16 and fp32
    python bench/gpu_attention.py --device cpu --lengths 64 128 --precisions fp32 --repeats 1  # smoke

The GPU counterpart of ``bench/attention_scaling.py`` (same modules, same shapes: ``--d-model`` 512,
8 heads of 64, batch 1, the ``core`` scope: the mechanism module from projected Q, K, V to the heads'
output), measured in one process, since CUDA's allocator reports each configuration's peak exactly:

* ``sdpa``: ``F.scaled_dot_product_attention`` (FlashAttention-2 for bf16 on an H100; the
  memory-efficient kernel for fp32), ``written``: equation (1) written out with the n x n weights
  materialised, and every mechanism of ``transformer/mechanisms.py`` with its default settings
  (linformer's ``max_length`` set to the length run);
* each configuration: one warm-up call, then ``--repeats`` calls timed between CUDA synchronisations
  (one when the warm-up took over a second), the median reported; peak memory is
  ``torch.cuda.max_memory_allocated`` during a call minus what was allocated before it (inputs
  included in neither); out of memory and errors are reported as such, and no row is dropped.

Not a test: the figures depend on the machine. Results: BENCHMARKS.md, "Attention mechanisms".
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.attention_runs import ROLES  # noqa: E402
from bench.attention_scaling import MECHANISMS, QUADRATIC, _reference_modules  # noqa: E402
from bench.harness import add_json_option, environment, median, print_config, print_table, write_json  # noqa: E402
from transformer.mechanisms import REFUSED, AttentionConfig, build_mechanism  # noqa: E402

LENGTHS = (1024, 2048, 4096, 8192, 16384)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MIB = 2**20


def module_for(name: str, role: str, n: int, d_head: int) -> torch.nn.Module | str:
    """The mechanism ``name`` for ``role`` at length ``n``, or why it refuses the role."""
    if name in REFUSED and REFUSED[name].get(ROLES[role]):
        return "refused"
    if name in QUADRATIC[:2]:
        return _reference_modules()[name]()
    cfg = AttentionConfig(**{ROLES[role]: name}, max_length=max(n, AttentionConfig.max_length))
    return build_mechanism(ROLES[role], cfg, d_head, 0.0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_one(name: str, role: str, n: int, precision: str, args: argparse.Namespace) -> dict:
    """One configuration: ``{"status": "ok", "ms": ..., "peak_mib": ...}`` or another status."""
    device, heads = torch.device(args.device), args.heads
    d_head = args.d_model // heads
    module = module_for(name, role, n, d_head)
    if isinstance(module, str):
        return {"status": module}
    module = module.to(device=device, dtype=DTYPES[precision])
    torch.manual_seed(0)
    inputs = [
        torch.randn(1, heads, n, d_head, device=device, dtype=DTYPES[precision], requires_grad=True)
        for _ in range(3)
    ]
    causal = role == "decoder"

    def call() -> None:
        out = module(*inputs, None, causal, None, False)[0]
        out.float().sum().backward()
        for x in inputs:
            x.grad = None

    try:
        sync(device)
        start = time.perf_counter()
        call()
        sync(device)
        first = time.perf_counter() - start
        times = []
        for _ in range(1 if first > 1.0 else args.repeats):
            sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            start = time.perf_counter()
            call()
            sync(device)
            times.append(time.perf_counter() - start)
        peak = (
            (torch.cuda.max_memory_allocated(device) - before) / MIB
            if device.type == "cuda"
            else float("nan")
        )
        return {"status": "ok", "ms": median(times) * 1e3, "peak_mib": peak}
    except torch.cuda.OutOfMemoryError:
        return {"status": "OOM"}
    except Exception as err:  # reported, not hidden: the row says what broke
        traceback.print_exc(limit=3)
        return {"status": f"error: {type(err).__name__}: {str(err)[:120]}"}
    finally:
        inputs.clear()  # the tensors freed before empty_cache
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--roles", nargs="+", default=list(ROLES), choices=list(ROLES))
    parser.add_argument("--precisions", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per configuration (median)")
    add_json_option(parser, "gpu_attention")
    args = parser.parse_args()
    device = torch.device(args.device)
    config = {**environment(torch.get_num_threads()), "device": str(device)}
    if device.type == "cuda":
        config["gpu"] = torch.cuda.get_device_name(device)
    config.update(d_model=args.d_model, heads=args.heads, batch=1, scope="core", repeats=args.repeats)
    print_config("attention mechanisms on a GPU: forward + backward against length", config)
    results = []
    for precision in args.precisions:
        for role in args.roles:
            rows = []
            by = {}
            for name in args.mechanisms:
                for n in args.lengths:
                    r = {"mechanism": name, "role": role, "precision": precision, "length": n}
                    r.update(run_one(name, role, n, precision, args))
                    by[(name, n)] = r
                    results.append(r)
            for (name, n), r in by.items():
                sdpa = by.get(("sdpa", n), {})
                ok = r["status"] == "ok" and sdpa.get("status") == "ok"
                speed = sdpa["ms"] / r["ms"] if ok else float("nan")
                mem = r["peak_mib"] / sdpa["peak_mib"] if ok and sdpa["peak_mib"] > 0 else float("nan")
                r["speed_vs_sdpa"], r["memory_vs_sdpa"] = speed, mem
                cells = [r["ms"], r["peak_mib"]] if r["status"] == "ok" else [r["status"], "-"]
                rows.append([name, n, *cells, speed, mem])
            print(f"## {role}, {precision}, core: forward + backward, batch 1", flush=True)
            print_table(["mechanism", "length", "ms", "peak MiB", "speed vs SDPA", "mem vs SDPA"], rows)
    write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
