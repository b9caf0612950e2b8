"""Why ``compile=true`` loses on the CPU: inductor's code for the recipe's elementwise work, timed
against eager PyTorch on the same tensors.

    python bench/inductor_cpu.py                      # a recipe batch: 315 x 13 tokens, 2 threads
    python bench/inductor_cpu.py --shape 16 8 --repeats 2 --threads 1     # a quick check of the script

``torch.compile`` is the pure-PyTorch way to fuse a training step's elementwise passes (dropout,
residual adds, LayerNorm, ReLU), which take most of the bf16 step on a CPU with AMX (BENCHMARKS.md,
"Training speed"). On the recipe's model it is slower than eager (``bench/gpu_train.py --device
cpu --configs ours-eager ours-compiled``). Each case below isolates one part of that step, in
the recipe's sizes under bf16 autocast, and times it eager and compiled (inductor, static shapes,
compiled before the timing; eager and compiled alternate, medians of ``--repeats``):

* ``x <= 0`` into a bool tensor, a bool tensor's selection (``where``) and, for contrast, the same
  comparison written as 0/1 in bf16: what the compiled code pays for a bool tensor;
* a feed-forward block (linear, ReLU, linear; forward and backward), compiled with torch's
  defaults and with ``torch._functorch.config.ban_recompute_materialized_backward`` off: with the
  default, the partitioner keeps ReLU's comparison as a bool tensor for the backward pass beside
  the output it keeps anyway;
* LayerNorm(r + dropout(x)) forward and backward: ours eager (``fastpaths.dropout.Dropout``)
  against the same module compiled, where it is ``nn.Dropout`` and inductor draws the mask.

The columns: ms eager, ms compiled, compiled / eager (> 1: compiled is slower).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.memory import configure_allocators  # noqa: E402

configure_allocators()  # as train.py does, before torch is imported (training/memory.py)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.harness import (  # noqa: E402
    add_json_option,
    environment,
    median,
    print_config,
    print_table,
    set_threads,
    timed,
    write_json,
)
from fastpaths.dropout import Dropout  # noqa: E402

D_MODEL, D_FF, P_DROP = 256, 1024, 0.2  # the recipe's model (conf/model/small.yaml, cpu_recipe.yaml)


def _feed_forward(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """linear, ReLU, linear under bf16 autocast, summed: x [rows, d] -> a scalar to step back from."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.linear(torch.relu(F.linear(x, w1)), w2).float().sum()


# Two functions with one body: Dynamo keeps compiled code per function, so each is compiled under
# its own partitioner setting.
def feed_forward_default(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return _feed_forward(x, w1, w2)


def feed_forward_outputs_kept(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return _feed_forward(x, w1, w2)


def cases(batch: int, length: int) -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """(name, eager call, compiled call) of each case, on tensors [batch, length, ...]."""
    rows = (batch, length)
    h = torch.randn(*rows, D_FF, dtype=torch.bfloat16)
    mask = h > 0
    x = torch.randn(*rows, D_MODEL, requires_grad=True)
    w1 = (torch.randn(D_FF, D_MODEL) / D_MODEL**0.5).requires_grad_()
    w2 = (torch.randn(D_MODEL, D_FF) / D_FF**0.5).requires_grad_()
    dropout = Dropout(P_DROP).train()
    xb = torch.randn(*rows, D_MODEL, dtype=torch.bfloat16, requires_grad=True)
    residual = torch.randn(*rows, D_MODEL, requires_grad=True)
    grad = torch.randn(*rows, D_MODEL)
    shape = f"{batch} x {length}"

    def to_bool(t: torch.Tensor) -> torch.Tensor:
        return t <= 0

    def select(t: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, t, 0)

    def to_bf16(t: torch.Tensor) -> torch.Tensor:
        return (t <= 0).to(torch.bfloat16)

    def sublayer_end(t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(r + dropout(t), (D_MODEL,))

    def outputs_kept() -> None:
        with torch._functorch.config.patch(ban_recompute_materialized_backward=False):
            compiled_kept(x, w1, w2).backward()

    compile_ = torch.compile
    compiled_default = compile_(feed_forward_default, dynamic=False)
    compiled_kept = compile_(feed_forward_outputs_kept, dynamic=False)
    compiled_end = compile_(sublayer_end, dynamic=False)
    c_bool, c_select, c_bf16 = (compile_(f, dynamic=False) for f in (to_bool, select, to_bf16))
    return [
        (f"x <= 0 into bool, [{shape}, {D_FF}] bf16", lambda: to_bool(h), lambda: c_bool(h)),
        (f"where(bool mask, g, 0), [{shape}, {D_FF}] bf16", lambda: select(h), lambda: c_select(h)),
        (f"x <= 0 as 0/1 in bf16, [{shape}, {D_FF}]", lambda: to_bf16(h), lambda: c_bf16(h)),
        (
            f"linear, ReLU, linear, forward + backward ([{shape}, {D_MODEL}], {D_MODEL}-{D_FF}-{D_MODEL}), "
            "torch's partitioner",
            lambda: feed_forward_default(x, w1, w2).backward(),
            lambda: compiled_default(x, w1, w2).backward(),
        ),
        (
            "the same, ban_recompute_materialized_backward off (no bool mask kept)",
            lambda: feed_forward_outputs_kept(x, w1, w2).backward(),
            outputs_kept,
        ),
        (
            f"LayerNorm(r + dropout(x)), p {P_DROP}, forward + backward ([{shape}, {D_MODEL}], x bf16)",
            lambda: sublayer_end(xb, residual).backward(grad),
            lambda: compiled_end(xb, residual).backward(grad),
        ),
    ]


def time_pair(
    eager: Callable[[], object], compiled: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Median ms of each, alternating; each is called twice first (the compile, the first run)."""
    for fn in (eager, compiled, eager, compiled):
        fn()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((eager, times[0]), (compiled, times[1])):
            out.append(timed(fn)[0] * 1e3)
    return median(times[0]), median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape", type=int, nargs=2, default=[315, 13], metavar=("BATCH", "LENGTH"), help="a recipe batch's"
    )
    parser.add_argument("--repeats", type=int, default=20, help="timed calls of each, alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    add_json_option(parser, "inductor_cpu")
    args = parser.parse_args()
    set_threads(args.threads)
    config = environment(torch.get_num_threads())
    print_config("inductor's CPU code against eager", config)
    rows = []
    for name, eager, compiled in cases(*args.shape):
        e, c = time_pair(eager, compiled, args.repeats)
        rows.append([name, e, c, c / e])
        print(f"   {name}: eager {e:.3f} ms, compiled {c:.3f} ms", flush=True)
    print_table(["case", "eager ms", "compiled ms", "compiled / eager"], rows)
    write_json(
        args.json,
        {
            "config": config,
            "shape": args.shape,
            "results": {r[0]: {"eager_ms": r[1], "compiled_ms": r[2]} for r in rows},
        },
    )


if __name__ == "__main__":
    main()
