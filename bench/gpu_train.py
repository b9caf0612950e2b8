"""GPU training speed: ours against ``torch.nn.Transformer``, eager and compiled, base and big, side by side.

    python bench/gpu_train.py                                  # CUDA: base and big, bf16, 25k tokens
    python bench/gpu_train.py --models base --steps 50         # longer, one size
    python bench/gpu_train.py --device cpu --models tiny --steps 2 --warmup 1 --batches 1 \\
        --max-tokens 512 --no-compile                          # smoke check of the script on a CPU

What is compared, per model size, in one process, interleaved round-robin (each round: the same
batch through every configuration, the order rotated each round):

* ours eager / ours compiled: ``transformer.Transformer`` with the sizes of ``model=<name>``
  (``conf/model/``, dropout included), shared and tied embeddings; the step is what training runs:
  ``training.module.token_losses`` (forward + label-smoothed loss), compiled with ``torch.compile``
  exactly as ``compile=true`` compiles it;
* nn.Transformer eager / compiled: ``torch.nn.Transformer(batch_first=True)`` of the same sizes, as
  ``bench/train_speed.py`` builds it (shared embedding, the same sinusoidal table, tied output),
  through the same loss function;
* each with its own Adam (fused, as training's ``optimizer.fused`` auto), lr 1e-4,
  gradient-norm clipping at 1.0; bf16 autocast around forward and loss (``bf16-mixed``), or fp32.

``--configs`` leaves configurations out (a compile costs minutes of a short GPU lease);
``--loss-block-rows N`` adds ours eager with the loss's logits N rows at a time, against the
device's default (``fastpaths.loss.default_block_rows``); ``--profile FILE`` takes one step of each
configuration under ``torch.profiler`` after the timed rounds: the operators' table goes to FILE
(on a CPU with inductor's generated kernels as rows of their own), the device's busy time over the
step's wall time and the host's kernel launches to the JSON. The process makes train.py's
allocator settings first (``training.memory``): on a CPU the step is the recipe's.

Batches: random ids in the shapes of the training sampler's batches (``data.batching.
TokenBucketBatchSampler``, ``--max-tokens`` padded tokens per batch, ``data.max_tokens``) over
synthetic sentence lengths: normal(``--mean-len``, ``--sd-len``) subwords, clipped to [4, 128],
target = source +-3 (no WMT corpus on the machine; the lengths set the attention share and the
padding). ``--batches`` of them, used in turn: compiled models see several shapes, as in training
(torch.compile's default: static shapes first, dynamic after the first change).

Figures per configuration: target tokens/s (real target tokens, not padding, of all timed steps
over their time, each step timed between CUDA synchronisations); the paired ratio to
nn.Transformer (median over rounds of the step-time ratio on the same batch); peak memory (its
parameters and Adam state plus the most its step allocated on top, ``torch.cuda.max_memory_
allocated``); and MFU = model FLOPs per second / the device's peak. Model FLOPs are analytic: the
matmuls of forward + backward = 3x forward (``bench/train_speed.forward_flops``: Q/K/V/output
projections, attention scores and weighted sums over the full score matrix, feed-forward, output
projection; 2 FLOPs per multiply-add), counted on the real (unpadded) sentences; "padded" counts
the padded batch. ``torch.utils.flop_counter.FlopCounterMode`` counts one eager step of ours as a
check. The peak is the GPU's dense bf16 tensor-core peak, by default 989 TFLOP/s (H100 SXM and
H200; ``--peak-tflops`` for others, e.g. 756 for an H100 PCIe); on a CPU, the measured matmul peak.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.memory import configure_allocators  # noqa: E402

# As train.py does, before torch is imported: on a CPU the bounded oneDNN kernel caches decide
# how often a product's kernel is made again (training/memory.py), so the step is the recipe's.
configure_allocators()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.utils.flop_counter import (  # noqa: E402
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from bench.harness import (  # noqa: E402
    ROOT,
    environment,
    matmul_peak,
    median,
    print_config,
    print_table,
    set_threads,
    write_json,
)
from bench.train_speed import (  # noqa: E402
    EOS,
    PAD,
    Sizes,
    TorchTransformer,
    build_ours,
    forward_flops,
    losses_of,
)
from data.batching import TokenBucketBatchSampler, collate_columns  # noqa: E402
from data.length_buckets import LengthBuckets  # noqa: E402
from data.tokenized_pairs import PairColumns  # noqa: E402
from fastpaths.hardware import bf16_capability  # noqa: E402
from fastpaths.optimize import optimize  # noqa: E402
from training.module import FUSED_ADAM_DEVICES  # noqa: E402

CONFIGS = ("ours-eager", "ours-compiled", "torch-eager", "torch-compiled")
H100_BF16_DENSE_TFLOPS = 989.0  # H100 SXM5 (and H200) dense bf16 tensor-core peak, NVIDIA's data sheet
GIB = 2**30


# ----------------------------------------------------------------------------- FLOP counting

# The CPU's fused attention has no formula in torch.utils.flop_counter; count it as the GPU's
# (as bench/decode_speed.py does), so that the check below also means something on a CPU.
_CPU_ATTENTION = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CPU_ATTENTION_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
if _CPU_ATTENTION not in flop_registry:
    register_flop_formula(_CPU_ATTENTION)(lambda q, k, v, *args, **kwargs: sdpa_flop_count(q, k, v))
if _CPU_ATTENTION_BACKWARD not in flop_registry:
    register_flop_formula(_CPU_ATTENTION_BACKWARD)(
        lambda grad, q, k, v, *args, **kwargs: sdpa_backward_flop_count(grad, q, k, v)
    )


def model_sizes(name: str, vocab: int) -> Sizes:
    """The sizes of ``model=<name>`` as train.py composes it, with a ``vocab``-word joint vocabulary.

    Composed by Hydra: ``conf/model/<name>.yaml`` changes only some keys of its base config.
    """
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}"]).model
    if cfg["n_encoder_layers"] != cfg["n_decoder_layers"]:
        raise ValueError(f"model={name}: nn.Transformer here takes one layer count for both stacks")
    return Sizes(
        vocab=vocab,
        d_model=cfg["d_model"],
        n_heads=cfg["n_heads"],
        layers=cfg["n_encoder_layers"],
        d_ff=cfg["d_ff"],
        dropout=cfg["dropout"],
        max_positions=cfg["max_positions"],
    )


def train_flops(s: Sizes, batch: dict) -> tuple[float, float]:
    """Model FLOPs of one training step (3x forward): (real sentences, padded batch)."""
    real = sum(forward_flops(s, 1, ls, lt) for ls, lt in batch["lengths"])
    return 3 * real, 3 * forward_flops(s, *batch["padded"])


# ----------------------------------------------------------------------------- batches


def make_batches(args: argparse.Namespace, vocab: int) -> list[dict]:
    """``args.batches`` batches of random ids, cut by the training sampler from synthetic lengths
    and padded by training's collate function (with ``--length-buckets``, to those buckets)."""
    rng = np.random.default_rng(args.seed)
    n = 20 * max(1, args.max_tokens // int(args.mean_len)) * args.batches  # enough for the batches asked
    src_lens = np.clip(np.rint(rng.normal(args.mean_len, args.sd_len, n)), 4, 128).astype(int)
    tgt_lens = np.clip(src_lens + rng.integers(-3, 4, n), 4, 128)  # target tokens incl. EOS
    buckets = LengthBuckets.parse(args.length_buckets)
    sampler = TokenBucketBatchSampler(
        src_lens, tgt_lens, max_tokens=args.max_tokens, seed=args.seed, length_buckets=buckets
    )
    batches = []
    for indices in list(sampler)[: args.batches]:
        ls, lt = src_lens[indices], tgt_lens[indices]
        src_values = rng.integers(4, vocab, int(ls.sum()))
        src_values[np.cumsum(ls) - 1] = EOS  # each source ends in EOS
        columns = PairColumns(
            np.asarray(indices), src_values, ls, rng.integers(4, vocab, int((lt - 1).sum())), lt - 1
        )
        batch = collate_columns(columns, buckets, args.max_tokens)
        lengths = [(int(a), int(b)) for a, b in zip(ls, lt, strict=True)]
        batch.update(
            tokens=int(lt.sum()),
            lengths=lengths,
            padded=tuple(batch["tgt_in"].shape[:1]) + (batch["src"].shape[1], batch["tgt_in"].shape[1]),
        )
        batches.append(batch)
    return batches


def target_padding(batches: list[dict]) -> float:
    """The share of the batches' target slots that are padding (filler rows included)."""
    slots = sum(b["tgt_out"].numel() for b in batches)
    return 1.0 - sum(b["tokens"] for b in batches) / max(slots, 1)


# ----------------------------------------------------------------------------- stepping


class Runner:
    """One model, its optimizer, eager or compiled; ``step(batch)`` is one timed training step."""

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        compiled: bool,
        args: argparse.Namespace,
        block_rows: int | None = None,
    ) -> None:
        self.name, self.compiled, self.device = name, compiled, torch.device(args.device)
        self.block_rows = block_rows  # ours: the loss's rows of logits at a time; None: the default
        self.model = model.to(self.device).train()
        self.bf16 = args.precision == "bf16"
        fused = self.device.type in FUSED_ADAM_DEVICES  # as training's optimizer.fused: null
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused)
        if name == "ours":  # the device's module swaps, as train.py applies them
            optimize(self.model, self.device, "train")
        self.losses = losses_of(name, self.device.type, compiled, block_rows)  # ours: training's own
        if compiled:
            mode = {} if args.compile_mode is None else {"mode": args.compile_mode}
            self.losses = torch.compile(self.losses, backend=args.compile_backend, **mode)
        self.warmup_times: list[float] = []
        self.times: list[float] = []
        self.peak_bytes = 0
        self.last_loss = math.nan

    @property
    def label(self) -> str:
        blocks = "" if self.block_rows is None else f" blocks{self.block_rows}"
        return f"{self.name} {'compiled' if self.compiled else 'eager'}{blocks}"

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def resident_bytes(self) -> int:
        """Parameters and optimizer state (gradients are freed before each step)."""
        tensors = list(self.model.parameters()) + [
            t for state in self.opt.state.values() for t in state.values() if torch.is_tensor(t)
        ]
        return sum(t.numel() * t.element_size() for t in tensors)

    def step(self, batch: dict, timed: bool) -> None:
        src, tgt_in, tgt_out = (batch[k].to(self.device) for k in ("src", "tgt_in", "tgt_out"))
        self.opt.zero_grad(set_to_none=True)
        self._sync()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            others = torch.cuda.memory_allocated(self.device) - self.resident_bytes()
        start = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            # Ours as training runs it: the block loss takes the host's target positions (no wait).
            extra = {}
            if self.name == "ours":
                extra["positions"] = batch["tgt_positions"].to(self.device, non_blocking=True)
            loss = self.losses(self.model, src, tgt_in, tgt_out, PAD, 0.1, **extra).sum() / batch["tokens"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self._sync()
        elapsed = time.perf_counter() - start
        (self.times if timed else self.warmup_times).append(elapsed)
        if cuda and timed:
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device) - others)
        self.last_loss = float(loss.detach())


def count_flops(runner: Runner, batch: dict) -> float:
    """FLOPs of one step of ``runner`` (eager) as ``FlopCounterMode`` counts them."""
    with FlopCounterMode(display=False) as counter:
        runner.step(batch, timed=False)
    runner.warmup_times.pop()
    return counter.get_total_flops()


def profile_step(runner: Runner, batch: dict, path: str) -> dict:
    """One step of ``runner`` under ``torch.profiler``: what bounds it.

    Appends the operators' table (sorted by device time on CUDA, by CPU time elsewhere) to
    ``path``; returns the step's wall time, the device's busy time (the sum of its kernels' and
    copies' own times), their ratio, and the kernel launches the host made.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    cuda = runner.device.type == "cuda"
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        runner.step(batch, timed=False)
    wall_s = runner.warmup_times.pop()
    averages = prof.key_averages()
    # The kernels' and copies' own events (a CPU operator's device time counts its kernels again).
    busy_us = sum(e.self_device_time_total for e in averages if e.device_type == DeviceType.CUDA)
    launches = sum(e.count for e in averages if "LaunchKernel" in e.key)
    sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
    with open(path, "a") as f:
        f.write(f"== {runner.label}: one step of batch {batch['padded']}, wall {wall_s * 1e3:.1f} ms, ")
        f.write(f"device busy {busy_us / 1e3:.1f} ms, {launches} kernel launches\n")
        f.write(averages.table(sort_by=sort_by, row_limit=25) + "\n")
    out = {
        "wall_ms": wall_s * 1e3,
        "device_busy_ms": busy_us / 1e3,
        "busy_fraction": busy_us / 1e6 / wall_s if cuda else math.nan,
        "kernel_launches": launches,
    }
    print(f"== profile {runner.label}: " + ", ".join(f"{k} {v:.3g}" for k, v in out.items()), flush=True)
    return out


def measure(size: str, args: argparse.Namespace, peak_flops: float) -> tuple[list[list], dict]:
    """Interleaved rounds of every configuration of one model size: table rows and JSON."""
    s = model_sizes(size, args.vocab)
    batches = make_batches(args, s.vocab)
    runners = []
    for name in ("ours", "torch"):
        for compiled in (False, True) if args.compile else (False,):
            config = f"{name}-{'compiled' if compiled else 'eager'}"
            if config not in args.configs and config != "ours-eager":  # the FLOP check runs ours eager
                continue
            torch.manual_seed(args.seed)
            model = build_ours(s) if name == "ours" else TorchTransformer(s)
            runners.append(Runner(name, model, compiled, args))
    if args.loss_block_rows:
        torch.manual_seed(args.seed)
        runners.append(Runner("ours", build_ours(s), False, args, block_rows=args.loss_block_rows))
    n_params = {r.name: sum(p.numel() for p in r.model.parameters()) for r in runners}
    counted = count_flops(runners[0], batches[0])
    analytic = train_flops(s, batches[0])[1]
    print(
        f"== model={size}: {s}; ours {n_params['ours']:,} parameters, nn.Transformer "
        f"{n_params.get('torch', 0):,}; batch shapes (b, S, T) "
        f"{' '.join(str(b['padded']) for b in batches)}, target padding {target_padding(batches):.1%}"
        f"{'' if args.length_buckets is None else f' with --length-buckets {args.length_buckets}'}; "
        f"FlopCounterMode / analytic FLOPs of one eager step of ours (padded): {counted / analytic:.3f}",
        flush=True,
    )
    failed = {}  # a configuration that fails (a compile error, out of memory) must not cost the others
    for r in range(args.warmup + args.steps):
        batch = batches[r % len(batches)]
        for runner in runners[r % len(runners) :] + runners[: r % len(runners)]:
            try:
                runner.step(batch, timed=r >= args.warmup)
                if r < args.warmup:  # where the compiles go, also when a time limit ends the run
                    print(f"   warm-up {r}: {runner.label} {runner.warmup_times[-1]:.2f} s", flush=True)
            except Exception as err:  # reported in the table and the JSON
                if r >= args.warmup:
                    raise  # a failure after warm-up would make the timed rounds unequal
                failed[runner.label] = f"{type(err).__name__}: {str(err)[:500]}"
                print(f"== {size} {runner.label} failed, left out: {failed[runner.label]}", flush=True)
                runners.remove(runner)
                runner.opt.state.clear()
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()

    profiles = {r.label: profile_step(r, batches[0], args.profile) for r in runners} if args.profile else {}

    timed = [batches[(args.warmup + i) % len(batches)] for i in range(args.steps)]
    tokens = sum(b["tokens"] for b in timed)
    flops = [train_flops(s, b) for b in timed]
    real_flops, padded_flops = sum(f[0] for f in flops), sum(f[1] for f in flops)
    by_label = {r.label: r for r in runners}

    def ratio(r: Runner, other: str) -> float:
        """Median over rounds of other's step time / r's, on the same batch (> 1: r is faster)."""
        if other not in by_label:
            return math.nan
        return median([t_o / t for t, t_o in zip(r.times, by_label[other].times, strict=True)])

    rows, results = [], {}
    for r in runners:
        seconds = sum(r.times)
        mode = "compiled" if r.compiled else "eager"
        # Warm-up time beyond its steps' median: the compiles (static shapes, then dynamic).
        compile_s = sum(r.warmup_times) - len(r.warmup_times) * median(r.times)
        out = {
            "tokens_per_s": tokens / seconds,
            "ratio_vs_torch_same_mode": ratio(r, f"torch {mode}"),
            "ratio_vs_torch_eager": ratio(r, "torch eager"),
            "peak_memory_gib": r.peak_bytes / GIB if r.device.type == "cuda" else math.nan,
            "warmup_beyond_steps_s": compile_s,
            "model_tflop_s": real_flops / seconds / 1e12,
            "mfu": real_flops / seconds / peak_flops,
            "mfu_padded": padded_flops / seconds / peak_flops,
            "last_loss": r.last_loss,
            "step_seconds": r.times,
        }
        if r.label in profiles:
            out["profile"] = profiles[r.label]
        results[r.label] = out
        rows.append(
            [
                f"{size} {r.label}",
                out["tokens_per_s"],
                out["ratio_vs_torch_same_mode"],
                out["ratio_vs_torch_eager"],
                out["peak_memory_gib"],
                compile_s,
                out["model_tflop_s"],
                out["mfu"],
                out["mfu_padded"],
                r.last_loss,
            ]
        )
    info = {
        "sizes": str(s),
        "parameters": n_params,
        "batch_shapes": [b["padded"] for b in batches],
        "target_tokens_per_batch": [b["tokens"] for b in batches],
        "target_padding": target_padding(batches),
        "length_buckets": args.length_buckets,
        "compile_mode": args.compile_mode,
        "flop_counter_over_analytic_padded": counted / analytic,
        "failed": failed,
    }
    rows += [[f"{size} {label}", "failed (see above)"] + [math.nan] * 8 for label in failed]
    return rows, {"info": info, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--models", nargs="+", default=["base", "big"], help="conf/model/ names (default base big)"
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "bf16", "fp32"],
        help="bf16: autocast; auto (default): bf16 where the device computes it natively, else fp32 "
        "(training/precision.py), so that no emulated bf16 is timed",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=25000, help="padded tokens per batch (data.max_tokens)"
    )
    parser.add_argument("--vocab", type=int, default=32000, help="joint vocabulary (conf/data/hub.yaml's)")
    parser.add_argument("--mean-len", type=float, default=28.0, help="mean sentence length, subwords")
    parser.add_argument("--sd-len", type=float, default=12.0, help="its standard deviation")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches (shapes), used in turn")
    parser.add_argument("--warmup", type=int, default=6, help="untimed rounds first (the compiles)")
    parser.add_argument("--steps", type=int, default=20, help="timed rounds (each: every configuration once)")
    parser.add_argument(
        "--no-compile", dest="compile", action="store_false", help="eager configurations only"
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        default=list(CONFIGS),
        choices=CONFIGS,
        help="which to run (default all; ours-eager always: the FLOP check runs on it)",
    )
    parser.add_argument(
        "--loss-block-rows",
        type=int,
        default=None,
        help="also ours eager with the loss's blocks of this many rows (against the device's default)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="after the timed rounds, one step of each configuration under torch.profiler: the "
        "operators' table appended to this file, the device's busy time in the JSON",
    )
    parser.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend (default inductor)"
    )
    parser.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode, e.g. reduce-overhead (CUDA graphs: with --length-buckets) or "
        "max-autotune (default: torch's)",
    )
    parser.add_argument(
        "--length-buckets",
        type=int,
        nargs="+",
        default=None,
        help="batches cut and padded as data.length_buckets does (data/length_buckets.py), e.g. "
        "16 24 32 48 64 96 128: a few shapes, for CUDA graphs; the padding is printed",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help=f"the device's peak; default {H100_BF16_DENSE_TFLOPS:g} (H100 SXM dense bf16) on CUDA, "
        "the measured matmul peak on a CPU",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", default="gpu_train", help="results: bench/results/<name>.json, or a path")
    args = parser.parse_args()
    if args.warmup < args.batches:
        # A batch first seen in a timed round pays for its shape there (the caching allocator's new
        # blocks, cuBLAS heuristics, a compiled model's recompile). On an H100, 4 shapes after 2
        # warm-up rounds (2 of them first run while timed) read 168k tokens/s, 2 shorter shapes
        # after 2 read 344k: how much of that gap is the first runs was not separated.
        parser.error(f"--warmup {args.warmup} < --batches {args.batches}: each batch must run once untimed")

    if args.threads:
        set_threads(args.threads)
    # Every compiled configuration recompiles token_losses (one code object) for its own model
    # and shapes; torch's default limit of 8 would send the later ones back to eager.
    torch._dynamo.config.recompile_limit = 64
    if args.profile and not args.device.startswith("cuda"):
        # Inductor's generated CPU kernels as rows of the profile, each named after the operators it
        # fuses, instead of one row for a whole compiled graph. Read when a kernel is compiled, so
        # set before any: the timed steps run the same kernels (each records its own span, as an
        # eager operator does).
        torch._inductor.config.cpp.enable_kernel_profile = True
    device = torch.device(args.device)
    native, capability = bf16_capability(device.type)
    if args.precision == "auto":
        args.precision = "bf16" if native else "fp32"
    elif args.precision == "bf16" and not native:
        print(f"warning: bf16 is emulated on this device ({capability}): figures far below fp32's")
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    if args.peak_tflops is not None:
        peak, peak_source = args.peak_tflops * 1e12, "given (--peak-tflops)"
    elif device.type == "cuda":
        if args.precision != "bf16":
            parser.error("--precision fp32 on CUDA needs --peak-tflops (the default is the bf16 peak)")
        peak, peak_source = H100_BF16_DENSE_TFLOPS * 1e12, "H100 SXM dense bf16 (NVIDIA's data sheet)"
    else:
        peak, peak_source = matmul_peak(dtype), f"measured: best 2048^3 {args.precision} matmul on this CPU"
    config = {
        **environment(torch.get_num_threads()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({args.device})",
        "cuda": torch.version.cuda,
        "precision": f"{args.precision} ({'autocast, fp32 weights' if args.precision == 'bf16' else 'fp32'})",
        "peak": f"{peak / 1e12:.1f} TFLOP/s, {peak_source}",
        "batches": f"{args.batches} of <= {args.max_tokens} padded tokens (TokenBucketBatchSampler); lengths "
        f"normal({args.mean_len:g}, {args.sd_len:g}) clipped to [4, 128], target = source +-3; "
        f"vocabulary {args.vocab}",
        "optimizer": "Adam lr 1e-4 betas (0.9, 0.98) eps 1e-9"
        f"{', fused' if device.type in FUSED_ADAM_DEVICES else ''}; "
        "label smoothing 0.1; clip 1.0",
        "compile": f"torch.compile(token_losses, backend={args.compile_backend!r})"
        if args.compile
        else "off",
        "rounds": f"{args.steps} timed after {args.warmup} warm-up, round-robin, order rotated",
        "flops": "analytic, 3x forward matmuls (bench/train_speed.forward_flops) of the real sentences; "
        "'padded': of the padded batch",
    }
    print_config("GPU training speed: ours vs torch.nn.Transformer, eager and compiled", config)
    rows, results = [], {}
    for size in args.models:
        size_rows, results[size] = measure(size, args, peak)
        rows += size_rows
        torch._dynamo.reset()  # frees this size's compiled code, models and optimizer state
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(
        [
            "config",
            "tok/s",
            "x nn.T same mode",
            "x nn.T eager",
            "peak GiB",
            "warm-up beyond steps s",
            "model TFLOP/s",
            "MFU",
            "MFU padded",
            "last loss",
        ],
        rows,
    )
    print("tok/s: real target tokens of all timed steps / their time; x nn.T: median over rounds of the")
    print("step-time ratio against nn.Transformer on the same batch, > 1 means faster; MFU: model FLOPs of")
    print(f"the real sentences per second / {peak / 1e12:.3g} TFLOP/s ('padded': of the padded batches)")
    print(
        "targets (issue 13): ours >= 1.0x nn.Transformer at equal precision; base compiled >= 45% MFU (bf16)"
    )
    write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
