"""Training speed: our Transformer against ``torch.nn.Transformer`` of the same sizes, side by side.

    python bench/train_speed.py                   # 2 threads, fp32 and bf16 autocast, 20 rounds
    python bench/train_speed.py --workers 2       # also: two single-thread processes at once
    python bench/train_speed.py --profile         # torch.profiler table of one step of each

What is compared, in one process, interleaved round-robin (each round: the same batch through every
configuration, the order rotated each round so no configuration always runs first):

* ours: ``transformer.Transformer`` (d 256, 3+3 layers, FFN 1024, 4 heads, vocab 8000, shared and
  tied embeddings, post-LN, dropout 0.1 on embeddings and sub-layer outputs, as conf/model/small),
  stepped as the recipe steps it: training's own forward and loss (``training.module.token_losses``:
  the output projection and loss a block of rows at a time) and the process's allocator settings
  (``training.memory``, made before torch is imported, as train.py makes them);
* torch: ``torch.nn.Transformer(batch_first=True)`` of the same sizes with one shared embedding
  table (x sqrt(d)), the same sinusoidal table, and the output projection tied to the embedding.
  Its attention dropout and FFN activation dropout are set to 0, as ours (``nn.Transformer`` has
  one ``dropout`` for all three); its final encoder/decoder LayerNorms stay (nn.Transformer has them);
* each with its own fused Adam (as training's on the CPU; lr 1e-4, betas 0.9/0.98, eps 1e-9),
  label-smoothed (0.1) cross-entropy summed over real target tokens / their count, gradient-norm
  clipping at 1.0 (as training);
* fp32, and bf16 autocast (``torch.autocast("cpu", torch.bfloat16)`` around forward and loss, as
  Lightning's ``bf16-mixed``).

Batches: random token ids in the shapes of real Multi30k de-en batches: the training split's
subword lengths (SentencePiece model of a Multi30k run, or of the data cache), sorted by length
and cut as the training sampler cuts them (``data.batching``: at most ``--max-tokens`` padded
tokens, 4096 as the recipe's ``data.max_tokens``), of which
``--batches`` spread over the length range are used in turn. Without a SentencePiece model, lengths
are drawn from a normal distribution (mean 14, sd 4) and the script says so.

Figures: median target tokens/s per configuration (real target tokens, not padding, per
optimizer step), ratios, and achieved model FLOP/s as a fraction of this CPU's measured matmul
peak at the same thread count (FLOPs counted analytically from the padded shapes: every matmul of
forward + backward = 3x forward; the same formula for both models).
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing as mp
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.memory import configure_allocators  # noqa: E402

configure_allocators()  # as train.py does, before torch is imported (training/memory.py)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from bench.harness import (  # noqa: E402
    MULTI30K_DIR,
    environment,
    find_spm_model,
    matmul_peak,
    median,
    print_config,
    print_table,
    read_gz_lines,
    set_threads,
    timed,
    write_json,
)
from data.batching import token_budget_batches  # noqa: E402
from fastpaths.hardware import native_bf16  # noqa: E402
from fastpaths.loss import BLOCK_ROWS  # noqa: E402
from fastpaths.optimize import optimize  # noqa: E402
from training.loss import cross_entropy  # noqa: E402
from training.module import token_losses  # noqa: E402
from transformer import Transformer, TransformerConfig  # noqa: E402
from transformer.embeddings import sinusoidal_table  # noqa: E402

PAD, BOS, EOS = 0, 2, 3


@dataclass
class Sizes:
    vocab: int = 8000
    d_model: int = 256
    n_heads: int = 4
    layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 512


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` with a shared embedding, our sinusoidal table and a tied output layer."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.d_model = s.d_model
        self.embed = nn.Embedding(s.vocab, s.d_model, padding_idx=PAD)
        nn.init.normal_(self.embed.weight, std=s.d_model**-0.5)
        self.register_buffer("pe", sinusoidal_table(s.max_positions, s.d_model), persistent=False)
        self.dropout = nn.Dropout(s.dropout)
        self.transformer = nn.Transformer(
            s.d_model, s.n_heads, s.layers, s.layers, s.d_ff, s.dropout, batch_first=True
        )
        # Same regularisation as ours: dropout on sub-layer outputs only.
        for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
            layer.dropout.p = 0.0  # after the FFN activation
            layer.self_attn.dropout = 0.0  # on attention weights
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = 0.0

    def _embed(self, ids: Tensor) -> Tensor:
        return self.dropout(self.embed(ids) * math.sqrt(self.d_model) + self.pe[: ids.size(1)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V]."""
        src_pad = src == PAD  # True = ignore (nn.Transformer's convention)
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=tgt_in.device, dtype=torch.float32
        )
        y = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return F.linear(y, self.embed.weight)


def build_ours(s: Sizes) -> Transformer:
    cfg = TransformerConfig(
        s.vocab,
        s.vocab,
        d_model=s.d_model,
        n_heads=s.n_heads,
        n_encoder_layers=s.layers,
        n_decoder_layers=s.layers,
        d_ff=s.d_ff,
        dropout=s.dropout,
        max_positions=s.max_positions,
        share_embeddings=True,
        tie_output=True,
    )
    model = Transformer(cfg)
    optimize(model, "cpu", "train")  # the CPU module swaps the trainer applies
    return model


# ----------------------------------------------------------------------------- batches


def multi30k_length_pairs() -> tuple[list[tuple[int, int]], str]:
    """(source length incl. EOS, target length incl. BOS/EOS shift) of each training pair."""
    spm_path = find_spm_model()
    src_file, tgt_file = MULTI30K_DIR / "train.de.gz", MULTI30K_DIR / "train.en.gz"
    if spm_path is None or not src_file.exists():
        return [], "synthetic: normal(mean 14, sd 4) lengths (no SentencePiece model or Multi30k found)"
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    src = sp.encode(read_gz_lines(src_file))
    tgt = sp.encode(read_gz_lines(tgt_file))
    pairs = [(len(a) + 1, len(b) + 1) for a, b in zip(src, tgt, strict=True)]
    return pairs, f"Multi30k train de-en subword lengths ({spm_path})"


def make_batches(n_batches: int, max_tokens: int, vocab: int, seed: int) -> tuple[list[dict], str]:
    """``n_batches`` batches of random ids, cut as training cuts them: ``data.max_tokens`` padded
    tokens, batch size x max(source, target length), at most (``data.batching``)."""
    rng = random.Random(seed)
    pairs, source = multi30k_length_pairs()
    if not pairs:
        pairs = []
        for _ in range(29000):
            t = max(3, round(rng.gauss(14, 4)))
            pairs.append((max(3, t + rng.randint(-2, 2)), t))
    rng.shuffle(pairs)
    pairs.sort(key=lambda p: (max(p), p[0], p[1]))  # the training sampler's order
    spans = token_budget_batches([max(p) for p in pairs], max_tokens)
    cut = [pairs[start:stop] for start, stop in spans]
    # Spread over the length range: short, typical and long batches in the corpus' proportions.
    step = len(cut) / n_batches
    chosen = [cut[int(i * step + step / 2)] for i in range(n_batches)]
    g = torch.Generator().manual_seed(seed)
    batches = []
    for lengths in chosen:
        b = len(lengths)
        S, T = max(p[0] for p in lengths), max(p[1] for p in lengths)
        src = torch.full((b, S), PAD, dtype=torch.long)
        tgt = torch.full((b, T + 1), PAD, dtype=torch.long)  # BOS + tokens + EOS
        for i, (ls, lt) in enumerate(lengths):
            src[i, : ls - 1] = torch.randint(4, vocab, (ls - 1,), generator=g)
            src[i, ls - 1] = EOS
            tgt[i, 0] = BOS
            tgt[i, 1:lt] = torch.randint(4, vocab, (lt - 1,), generator=g)
            tgt[i, lt] = EOS
        tgt_out = tgt[:, 1:]
        batches.append(
            {
                "src": src,
                "tgt_in": tgt[:, :-1].masked_fill(tgt_out == PAD, PAD),
                "tgt_out": tgt_out,
                "tokens": int((tgt_out != PAD).sum()),
                "padded": (b, S, T),
            }
        )
    return batches, source


def forward_flops(s: Sizes, b: int, src_len: int, tgt_len: int) -> float:
    """Matmul FLOPs of one forward pass on padded [b, src_len] / [b, tgt_len] (2 per multiply-add)."""
    d, f, S, T = s.d_model, s.d_ff, src_len, tgt_len
    enc = s.layers * (2 * b * S * (4 * d * d + 2 * d * f) + 4 * b * S * S * d)
    dec = s.layers * (
        2 * b * T * (4 * d * d)
        + 4 * b * T * T * d  # self-attention
        + 2 * b * T * (2 * d * d)
        + 2 * b * S * (2 * d * d)
        + 4 * b * T * S * d  # cross-attention
        + 2 * b * T * (2 * d * f)  # feed-forward
    )
    return enc + dec + 2 * b * T * d * s.vocab  # output projection


def step_products(s: Sizes, b: int, src_len: int, tgt_len: int) -> dict[tuple[int, int, int, int, bool], int]:
    """The matrix products of one training step on padded [b, src_len] / [b, tgt_len], as
    ``{(batch, m, k, n, a_transposed): count}``: each linear map's forward [m, k] @ [k, n], its
    input gradient [m, n] @ [n, k] and its weight gradient [n, m] @ [m, k] (the output gradient
    transposed, as autograd multiplies it), and attention's batched products (scores and weighted
    sums, forward and backward) per head; the output projection's forward a block of the loss's
    rows at a time. The same work as ``3 * forward_flops``."""
    d, f, S, T, H = s.d_model, s.d_ff, src_len, tgt_len, s.n_heads
    dh = d // H
    products: dict[tuple[int, int, int, int, bool], int] = {}

    def add(key: tuple[int, int, int, int, bool], count: int) -> None:
        products[key] = products.get(key, 0) + count

    def linear(rows: int, k: int, n: int, count: int, forward_rows: int | None = None) -> None:
        block = forward_rows or rows
        add((1, block, k, n, False), count * (rows // block))
        if rows % block:
            add((1, rows % block, k, n, False), count)
        add((1, rows, n, k, False), count)  # input gradient
        add((1, n, rows, k, True), count)  # weight gradient

    def attention(q_len: int, k_len: int, count: int) -> None:
        bh = b * H
        # forward: scores q k^T, weights v; backward: two products for each
        for m, k, n in ((q_len, dh, k_len), (q_len, k_len, dh)):
            add((bh, m, k, n, False), count)
            add((bh, m, n, k, False), count)
            add((bh, k, m, n, True), count)

    L = s.layers
    for rows, k, n in ((b * S, d, 3 * d), (b * S, d, d), (b * S, d, f), (b * S, f, d)):
        linear(rows, k, n, L)
    attention(S, S, L)
    for rows, k, n in ((b * T, d, 3 * d), (b * T, d, d), (b * T, d, d), (b * S, d, 2 * d), (b * T, d, d)):
        linear(rows, k, n, L)
    for rows, k, n in ((b * T, d, f), (b * T, f, d)):
        linear(rows, k, n, L)
    attention(T, T, L)
    attention(T, S, L)
    linear(b * T, d, s.vocab, 1, forward_rows=BLOCK_ROWS)
    return products


def products_seconds(products: dict[tuple[int, int, int, int, bool], int], dtype: torch.dtype) -> float:
    """Seconds the products take by themselves (each the best of 2 after a warm-up), summed."""
    total = 0.0
    for (batch, m, k, n, transposed), count in products.items():
        a = torch.randn(batch, k, m).transpose(1, 2) if transposed else torch.randn(batch, m, k)
        a, w = a.to(dtype), torch.randn(batch, k, n).to(dtype)
        if batch == 1:
            a, w = a[0], w[0]
        mul = torch.bmm if batch > 1 else torch.mm
        mul(a, w)
        best = min(timed(lambda a=a, w=w, mul=mul: mul(a, w))[0] for _ in range(2))
        total += count * best
    return total


# ----------------------------------------------------------------------------- stepping


def logits_losses(
    model: nn.Module, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, pad_id: int, label_smoothing: float
) -> Tensor:
    """``nn.Transformer``'s logits, then the label-smoothed loss on flat (B*T, V) rows: [B, T]."""
    logits = model(src, tgt_in)  # (B, T, V)
    return F.cross_entropy(
        logits.float().flatten(0, 1),
        tgt_out.flatten(),
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
        reduction="none",
    ).view_as(tgt_out)


def losses_of(name: str, device: str = "cpu", compiled: bool = False, block_rows: int | None = None):  # noqa: ANN201
    """The forward-and-loss function of a model by name: ours is training's own
    (``training.module.token_losses`` with the loss ``fastpaths.optimize`` gives ``device``, eager
    or ``compiled``: the block loss, of ``block_rows`` rows if given), the torch one ``logits_losses``."""
    if name != "ours":
        return logits_losses
    paths = optimize(nn.Module(), device, "train")
    loss = (paths.compiled_loss if compiled else paths.loss) or cross_entropy
    if block_rows is not None:
        loss = functools.partial(loss, block_rows=block_rows)

    def ours(model, src, tgt_in, tgt_out, pad_id, label_smoothing, positions=None):  # noqa: ANN001, ANN202
        return token_losses(model, src, tgt_in, tgt_out, pad_id, label_smoothing, loss, positions=positions)

    return ours


class Runner:
    """One model, its optimizer and its numerics; ``step(batch)`` is one training step."""

    def __init__(self, name: str, model: nn.Module, bf16: bool) -> None:
        self.name, self.model, self.bf16 = name, model.train(), bf16
        # Fused, as training's optimizer.fused: null chooses on the CPU (training/module.py).
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
        self.times: list[float] = []
        self.tok_s: list[float] = []
        self.losses: list[float] = []

    @property
    def label(self) -> str:
        return f"{self.name} {'bf16' if self.bf16 else 'fp32'}"

    def step(self, batch: dict) -> float:
        """One timed update on ``batch``: its seconds."""
        elapsed, loss = timed(lambda: self._update(batch))
        self.losses.append(float(loss.detach()))
        return elapsed

    def _update(self, batch: dict) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            fn = losses_of(self.name)
            losses = fn(self.model, batch["src"], batch["tgt_in"], batch["tgt_out"], PAD, 0.1)
            loss = losses.sum() / batch["tokens"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss


def build_runners(s: Sizes, which: list[str], precisions: list[str], seed: int) -> list[Runner]:
    runners = []
    for precision in precisions:
        for name in which:
            torch.manual_seed(seed)
            model = build_ours(s) if name == "ours" else TorchTransformer(s)
            runners.append(Runner(name, model, precision == "bf16"))
    return runners


def run_rounds(runners: list[Runner], batches: list[dict], rounds: int, warmup: int) -> None:
    for r in range(warmup + rounds):
        batch = batches[r % len(batches)]
        order = runners[r % len(runners) :] + runners[: r % len(runners)]
        for runner in order:
            elapsed = runner.step(batch)
            if r >= warmup:
                runner.times.append(elapsed)
                runner.tok_s.append(batch["tokens"] / elapsed)


def _worker(rank: int, s: Sizes, batches: list[dict], args: argparse.Namespace, barrier, queue) -> None:  # noqa: ANN001
    set_threads(1)
    runners = build_runners(s, ["ours", "torch"], args.precisions, args.seed)
    run_rounds(runners, batches, 1, 1)  # warm-up before the clock starts
    for r in runners:
        r.times, r.tok_s = [], []
    barrier.wait()
    run_rounds(runners, batches[rank:] + batches[:rank], args.worker_rounds, 0)
    tokens = {r.label: sum(k * t for k, t in zip(r.tok_s, r.times, strict=True)) for r in runners}
    queue.put((rank, {r.label: tokens[r.label] / sum(r.times) for r in runners}))


def two_workers(s: Sizes, batches: list[dict], args: argparse.Namespace) -> dict[str, float]:
    """Two single-thread processes training at once (no gradient exchange): summed tokens/s."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(rank, s, batches, args, barrier, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    return {label: results[0][label] + results[1][label] for label in results[0]}


def profile(runners: list[Runner], batch: dict) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for runner in runners:
        runner.step(batch)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            runner.step(batch)
        print(f"== profile: {runner.label}, one step, batch {batch['padded']}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (default 2: this machine's cores)"
    )
    parser.add_argument(
        "--rounds", type=int, default=20, help="timed rounds (each: every configuration once)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--batches", type=int, default=10, help="distinct batches, used in turn")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="padded tokens per batch, as data.max_tokens (default 4096: the Multi30k recipe's)",
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=["fp32", "bf16"],
        help="default: fp32, and bf16 autocast where the CPU computes bf16 natively "
        "(transformer/hardware.py); elsewhere bf16 is emulated and left out unless named here",
    )
    parser.add_argument("--workers", type=int, default=0, choices=[0, 2], help="2: also two 1-thread workers")
    parser.add_argument("--worker-rounds", type=int, default=8, help="timed rounds per worker")
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table per config")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", default="train_speed", help="results file: bench/results/<name>.json")
    parser.add_argument("--tiny", action="store_true", help="smoke test: tiny model and batches")
    args = parser.parse_args()

    set_threads(args.threads)
    if args.precisions is None:
        args.precisions = ["fp32", "bf16"] if native_bf16() else ["fp32"]
        if not native_bf16():
            print("bf16 left out: no native bf16 on this CPU (transformer/hardware.py), it would be emulated")
    s = Sizes(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=500) if args.tiny else Sizes()
    batches, length_source = make_batches(args.batches, args.max_tokens, s.vocab, args.seed)
    runners = build_runners(s, ["ours", "torch"], args.precisions, args.seed)
    n_params = {r.name: sum(p.numel() for p in r.model.parameters()) for r in runners}

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    peaks = {precision: matmul_peak(dtypes[precision]) for precision in args.precisions}
    config = {
        **environment(args.threads),
        "model": f"{s} (ours {n_params['ours']:,} parameters, nn.Transformer {n_params['torch']:,})",
        "batches": f"{len(batches)} of at most {args.max_tokens} padded tokens; {length_source}",
        "batch shapes (b, S, T)": " ".join(str(b["padded"]) for b in batches),
        "target tokens per batch": " ".join(str(b["tokens"]) for b in batches),
        "optimizer": "Adam lr 1e-4 betas (0.9, 0.98) eps 1e-9, fused; label smoothing 0.1; clip 1.0",
        "rounds": f"{args.rounds} timed after {args.warmup} warm-up, round-robin, order rotated",
        **{f"matmul peak {p} (2048^3)": f"{peak / 1e9:.1f} GFLOP/s" for p, peak in peaks.items()},
    }
    print_config("training speed: ours vs torch.nn.Transformer", config)
    if args.profile:
        profile(runners, batches[len(batches) // 2])
        return

    run_rounds(runners, batches, args.rounds, args.warmup)

    by_label = {r.label: r for r in runners}
    timed_batches = [batches[(args.warmup + i) % len(batches)] for i in range(args.rounds)]
    timed_tokens = [batch["tokens"] for batch in timed_batches]
    flops = [3 * forward_flops(s, *batch["padded"]) for batch in timed_batches]

    def paired(r: Runner, other: str) -> float:
        """Median over rounds of (other's step time / r's step time) on the same batch."""
        if other not in by_label:
            return math.nan
        return median([t_o / t for t, t_o in zip(r.times, by_label[other].times, strict=True)])

    rows, results = [], {}
    for r in runners:
        precision = "bf16" if r.bf16 else "fp32"
        tok_s = sum(timed_tokens) / sum(r.times)  # all timed steps together
        flop_s = sum(flops) / sum(r.times)
        vs_same, vs_fp32 = paired(r, f"torch {precision}"), paired(r, "torch fp32")
        rows.append(
            [
                r.label,
                tok_s,
                median(r.tok_s),
                vs_same,
                vs_fp32,
                flop_s / 1e9,
                flop_s / peaks[precision],
                r.losses[-1],
            ]
        )
        results[r.label] = {
            "tokens_per_s": tok_s,
            "tokens_per_s_median_step": median(r.tok_s),
            "tokens_per_s_min_max_step": (min(r.tok_s), max(r.tok_s)),
            "ratio_vs_torch_same_precision": vs_same,
            "ratio_vs_torch_fp32": vs_fp32,
            "model_gflop_s": flop_s / 1e9,
            "fraction_of_matmul_peak": flop_s / peaks[precision],
            "last_loss": r.losses[-1],
        }
    print_table(
        [
            "config",
            "tok/s",
            "tok/s (median step)",
            "x nn.Transformer same prec.",
            "x nn.Transformer fp32",
            "model GFLOP/s",
            "of matmul peak",
            "last loss",
        ],
        rows,
    )
    print("tok/s: real target tokens of all timed steps / their time; ratios: median over rounds of the")
    print("step-time ratio on the same batch (paired), > 1 means faster than nn.Transformer")
    print("targets: ours fp32 >= 1.0x torch fp32; ours bf16 >= 1.5x torch fp32")
    # The bound on the fraction of the peak: the same steps' matrix products timed by themselves.
    bound_rows = []
    for precision in args.precisions:
        products = [step_products(s, *batch["padded"]) for batch in timed_batches]
        seconds = sum(products_seconds(p, dtypes[precision]) for p in products)
        ours = by_label[f"ours {precision}"]
        bound_rows.append(
            [
                precision,
                sum(ours.times) / len(ours.times) * 1e3,
                seconds / len(timed_batches) * 1e3,
                sum(flops) / seconds / peaks[precision],
                sum(flops) / sum(ours.times) / peaks[precision],
            ]
        )
        results[f"ours {precision}"].update(
            matmuls_alone_ms_per_step=bound_rows[-1][2], matmuls_alone_fraction_of_peak=bound_rows[-1][3]
        )
    print("== the steps' matrix products by themselves (the same shapes and layouts, each timed alone)")
    print_table(
        ["precision", "ours: ms a step", "products alone: ms", "products alone: of peak", "step: of peak"],
        bound_rows,
    )
    print("the step's fraction of the peak cannot exceed its products' fraction timed alone")
    if args.workers == 2:
        summed = two_workers(s, batches, args)
        print(f"== two single-thread workers at once ({args.worker_rounds} rounds each), summed tok/s")
        print_table(
            ["config", "2 x 1 thread tok/s", f"1 x {args.threads} threads tok/s", "ratio"],
            [[k, v, results[k]["tokens_per_s"], v / results[k]["tokens_per_s"]] for k, v in summed.items()],
        )
        results["two_single_thread_workers"] = summed
    if not args.tiny:
        write_json(args.json, {"config": config, "results": results})


if __name__ == "__main__":
    main()
