"""One decoding step against a long source: the cost of cross-attention per step, per mechanism.

    python bench/cross_decoding.py
    python bench/cross_decoding.py --source-length 4096 --d-model 256 --layers 2 --steps 64

Issue 41, item 2. A decoder of ``--layers`` layers (``--d-model`` 256, ``--heads`` 4, softmax
self-attention) decodes greedily, one sentence (batch 1, inference mode, fp32), against a source
of ``--source-length`` positions (a random encoder output: how the source was encoded does not
change a step's cost). Each cross-capable mechanism (every one whose ``cross`` role is not refused)
reads the source as ``decoding.state.CachedDecoder.begin`` leaves it: softmax its K/V, linear and the
Performer their summaries [S, Z], Linformer its E K and F V, made once per source, not per step.
Per mechanism: the median time of a step over ``--steps`` steps (after ``--warmup``), and the
ratio to softmax's; the issue's target is ≤ 1.2x softmax for each. Linformer's
``max_length`` is set to the source length.

Not a test: the figures depend on the machine (its CPU is printed with them).
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


def cross_mechanisms() -> list[str]:
    """Every mechanism that may do cross-attention, softmax first."""
    from transformer.mechanisms import REFUSED

    names = [name for name, refused in REFUSED.items() if "cross" not in refused]
    return sorted(names, key=lambda name: name != "softmax")


def step_times(name: str, args: argparse.Namespace) -> dict:
    """Seconds of each decoding step of a ``name`` cross-attention decoder, and the start's."""
    import torch

    from decoding.state import CachedDecoder
    from transformer import Transformer, TransformerConfig

    torch.manual_seed(0)
    attention = {"cross": name, "max_length": args.source_length}
    cfg = TransformerConfig(
        src_vocab_size=64,
        tgt_vocab_size=64,
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=4 * args.d_model,
        n_encoder_layers=1,
        n_decoder_layers=args.layers,
        dropout=0.0,
        max_positions=max(args.steps + args.warmup + 1, 64),
        attention=attention,
    )
    model = Transformer(cfg).eval()
    memory = torch.randn(1, args.source_length, args.d_model)
    src_mask = torch.ones(1, 1, 1, args.source_length, dtype=torch.bool)
    times = []
    with torch.inference_mode():
        steps = args.steps + args.warmup
        decoder = CachedDecoder(model)
        start_s, state = timed(lambda: decoder.begin(memory, src_mask, max_steps=steps))
        token = torch.tensor([1])
        for step in range(args.warmup + args.steps):
            seconds, logits = timed(lambda token=token: model.logits(decoder.step(token, state)))
            if step >= args.warmup:
                times.append(seconds)
            token = logits.argmax(-1)
    return {"step_ms": [t * 1e3 for t in times], "median_step_ms": median(times) * 1e3, "start_s": start_s}


def main() -> None:
    names = cross_mechanisms()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source-length", type=int, default=4096, help="source positions")
    parser.add_argument("--d-model", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--steps", type=int, default=64, help="timed decoding steps")
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps first")
    parser.add_argument("--mechanisms", nargs="+", default=names, choices=names)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument("--json", default="cross_decoding", help="results file: bench/results/<name>.json")
    args = parser.parse_args()

    set_threads(args.threads)
    config = {
        **environment(args.threads),
        "command": " ".join(["python", "bench/cross_decoding.py", *sys.argv[1:]]),
        **{k: v for k, v in vars(args).items() if k not in ("json", "threads")},
        "what": "a decoding step of a whole decoder (softmax self-attention), batch 1, fp32, inference "
        "mode, against a random encoder output; cross-attention by each mechanism",
    }
    print_config("cross-attention decoding steps", config)
    results = {}
    for name in args.mechanisms:
        results[name] = step_times(name, args)
        print(f"  {name}: {results[name]['median_step_ms']:.3f} ms a step", flush=True)
    base = results.get("softmax")
    rows = []
    for name, r in results.items():
        ratio = r["median_step_ms"] / base["median_step_ms"] if base else float("nan")
        r["vs_softmax"] = ratio
        rows.append([name, r["median_step_ms"], ratio, r["start_s"], "met" if ratio <= 1.2 else "not met"])
    print()
    print_table(["mechanism", "ms/step (median)", "vs softmax", "begin s", "≤ 1.2x softmax"], rows)
    write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
