"""Where each attention mechanism pays off in the whole model: training speed and memory against length.

    python bench/length_sweep.py
    python bench/length_sweep.py --precision bf16 --plot docs/length_sweep.png   # BENCHMARKS.md's
    python bench/length_sweep.py --lengths 32 64 --tokens 128 --d-model 32 --heads 2 --layers 1 --steps 1

Issue 41, item 6. The recipe's model (``conf/model/small.yaml``: d_model 256, 4 heads, 3 + 3
layers, d_ff 1024; 8,000-piece vocabulary) trains on random tokens with sources and targets of
each ``--lengths`` L, in batches of the same token count (``--tokens`` per side, so ``tokens / L``
sentences), one Adam update a step, through the recipe's own forward and label-smoothed loss
(``training.module.token_losses``: no [batch, length, vocabulary] logits kept). Each mechanism
is the encoder's and the decoder's self-attention (the decoder's stays softmax where the
mechanism cannot be causal: linformer, nystrom); cross-attention is softmax throughout
(``--cross-too``: the mechanism where it does cross-attention). Settings are
``AttentionConfig``'s defaults, with linformer's ``max_length`` the longest length (``--set
key=value`` changes any).

Per mechanism and length: target tokens/s (median of ``--steps`` timed steps after one warm-up)
and the peak bytes of tensor storage of one step (forward, backward, update: counted exactly by
``bench/storage_meter.py``, in a separate step), each beside softmax's; and, per mechanism, the
crossover: the shortest length from which it trains faster than softmax at every longer length
measured (likewise for memory). ``--plot`` draws both against length.

Not a test: the figures depend on the machine (its CPU is printed with them). The third command
above is a seconds-long check of the script, not a measurement.
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
    median,
    print_config,
    print_table,
    set_threads,
    timed,
    write_json,
)


def mechanisms() -> list[str]:
    """Every mechanism that can do encoder self-attention, softmax first."""
    from transformer.mechanisms import REFUSED

    names = [name for name, refused in REFUSED.items() if "encoder_self" not in refused]
    return sorted(names, key=lambda name: name != "softmax")


def attention_for(name: str, args: argparse.Namespace) -> dict:
    """``model.attention`` for mechanism ``name`` in the sweep (see the module docstring)."""
    from transformer.mechanisms import REFUSED

    refused = REFUSED[name]
    attention = {"encoder_self": name, "decoder_self": "softmax" if "decoder_self" in refused else name}
    if args.cross_too and "cross" not in refused:
        attention["cross"] = name
    attention["max_length"] = max(args.lengths)
    for item in args.set:
        key, _, value = item.partition("=")
        attention[key] = int(value) if value.lstrip("-").isdigit() else value
    return attention


def measure(name: str, length: int, args: argparse.Namespace) -> dict:
    """Target tokens/s and peak storage bytes of training steps of ``name`` at ``length``."""
    import torch

    from bench.storage_meter import StorageMeter
    from training.module import token_losses
    from transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    cfg = TransformerConfig(
        src_vocab_size=args.vocab,
        tgt_vocab_size=args.vocab,
        d_model=args.d_model,
        n_heads=args.heads,
        n_encoder_layers=args.layers,
        n_decoder_layers=args.layers,
        d_ff=4 * args.d_model,
        dropout=0.1,
        max_positions=max(args.lengths) + 1,
        attention=attention_for(name, args),
    )
    model = Transformer(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = max(1, args.tokens // length)
    src = torch.randint(4, args.vocab, (batch, length))
    tgt = torch.randint(4, args.vocab, (batch, length + 1))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step() -> None:
        with autocast:  # the recipe's own forward and loss: the vocabulary's logits in blocks
            losses = token_losses(model, src, tgt[:, :-1], tgt[:, 1:], cfg.pad_id, label_smoothing=0.1)
        loss = losses.sum() / losses.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: Adam's state, first-call costs
    times = []
    for _ in range(args.steps):
        times.append(timed(step)[0])
    with StorageMeter() as meter:
        step()
    seconds = median(times)
    return {
        "batch": batch,
        "step_s": seconds,
        "tokens_s": batch * length / seconds,
        "peak_bytes": meter.peak_bytes,
        "attention": cfg.attention.to_dict(),
    }


def crossover(ratios: dict[int, float]) -> int | None:
    """The shortest length from which ``ratios`` (> 1: better than softmax) stays above 1."""
    best = None
    for length in sorted(ratios, reverse=True):
        if ratios[length] <= 1:
            break
        best = length
    return best


def plot(results: dict, lengths: list[int], path: Path, title: str = "") -> None:
    """Tokens/s and peak storage against length, one line per mechanism (softmax black, thicker)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4.4))
    for name, rows in results.items():
        xs = [n for n in lengths if "error" not in rows.get(str(n), {"error": 1})]
        style = {"color": "black", "linewidth": 2.5, "zorder": 3} if name == "softmax" else {}
        speed.plot(xs, [rows[str(n)]["tokens_s"] for n in xs], marker="o", label=name, **style)
        memory.plot(xs, [rows[str(n)]["peak_bytes"] / 2**20 for n in xs], marker="o", label=name, **style)
    for ax, name in ((speed, "training target tokens/s"), (memory, "peak tensor storage of a step, MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("source and target length (batches of the same token count)")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
    speed.legend(fontsize=8, ncol=2)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    names = mechanisms()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--tokens", type=int, default=4096, help="source (and target) tokens a batch")
    parser.add_argument("--mechanisms", nargs="+", default=names, choices=names)
    parser.add_argument("--steps", type=int, default=5, help="timed training steps (after one warm-up)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3, help="encoder layers, and decoder layers")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--cross-too", action="store_true", help="the mechanism in cross-attention too")
    parser.add_argument("--set", nargs="*", default=[], help="attention settings, key=value")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument("--plot", type=Path, help="draw speed and memory against length here (PNG)")
    parser.add_argument("--json", default="length_sweep", help="results file: bench/results/<name>.json")
    args = parser.parse_args()
    if "softmax" not in args.mechanisms:
        args.mechanisms.insert(0, "softmax")  # the baseline every ratio is to

    set_threads(args.threads)
    config = {
        **environment(args.threads),
        "command": " ".join(["python", "bench/length_sweep.py", *sys.argv[1:]]),
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("json",)},
        "what": "training steps (forward, backward, Adam) of the whole model on random tokens, "
        "sources and targets of one length, batches of the same token count",
    }
    print_config("whole-model length sweep", config)
    results: dict[str, dict[str, dict]] = {}
    for name in args.mechanisms:
        results[name] = {}
        for length in args.lengths:
            try:
                r = measure(name, length, args)
            except (RuntimeError, ValueError) as error:  # out of memory, a refused setting
                r = {"error": f"{type(error).__name__}: {error}"[:300]}
            results[name][str(length)] = r
            shown = (
                f"{r['tokens_s']:,.0f} tok/s, {r['peak_bytes'] / 2**20:,.1f} MiB"
                if "error" not in r
                else r["error"]
            )
            print(f"  {name} at {length}: {shown}", flush=True)

    base = results["softmax"]
    rows, summary = [], {}
    for name, by_length in results.items():
        speed, memory = {}, {}
        for length in args.lengths:
            r, b = by_length[str(length)], base[str(length)]
            if "error" in r or "error" in b:
                rows.append([name, length, float("nan"), float("nan"), float("nan"), float("nan")])
                continue
            speed[length] = r["tokens_s"] / b["tokens_s"]
            memory[length] = b["peak_bytes"] / r["peak_bytes"]  # > 1: less memory than softmax
            r["speed_vs_softmax"], r["memory_vs_softmax"] = speed[length], 1 / memory[length]
            rows.append(
                [name, length, r["tokens_s"], speed[length], r["peak_bytes"] / 2**20, 1 / memory[length]]
            )
        summary[name] = {"faster_from": crossover(speed), "less_memory_from": crossover(memory)}
    print()
    print_table(["mechanism", "length", "target tok/s", "vs softmax", "peak MiB", "vs softmax"], rows)
    print_table(
        ["mechanism", "faster than softmax from", "less memory from"],
        [
            [n, s["faster_from"] or "-", s["less_memory_from"] or "-"]
            for n, s in summary.items()
            if n != "softmax"
        ],
    )
    if args.plot:
        title = f"{config['cpu']} ({config['torch_cpu_capability']}), {args.threads} threads, "
        title += args.precision
        plot(results, args.lengths, args.plot, title)
        print(f"plot written to {args.plot}")
    write_json(args.json, {"config": config, "results": results, "crossover": summary})


if __name__ == "__main__":
    main()
