"""Validation's and the test stage's decoding against translate.py's, on one checkpoint, side by side.

    python3 bench/validation_decode.py --checkpoint runs/multi30k_de_en/<run>/checkpoints/averaged.ckpt
    python3 bench/validation_decode.py --checkpoint CKPT --tree old=/path/to/old/checkout --tree new=.

For each source tree (default: this one), in a fresh process of its own (``PYTHONPATH`` the tree),
the trees alternated round by round:

* **the stage**, as training runs it: the checkpoint's weights in training's ``TranslationModule``
  (with the device's fast paths where the tree applies them at the program's edge), the split's
  batches from the data module the run's ``config.yaml`` describes (validation's order and
  ``data.eval_max_tokens``), each through ``validation_step``'s work and the stage's search, as
  Lightning calls them (inference mode). Its decoding seconds are the stage's seconds less the
  same batches' loss alone (measured apart, warm);
* **translate.py**: ``Translator.from_checkpoint`` of the same file (with the fast paths
  ``translate.py`` applies), its ``translate_ids`` of the same sentences with the same search
  (greedy for validation, beam 5 for the test stage), model load excluded.

Per tree, split and path: the median seconds, the stage's decoding over translate.py's, and
whether the two give the same outputs. Not a test: the figures depend on the machine. Results:
BENCHMARKS.md, "Validation at the decoder's speed".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPLITS = {"valid": "val", "test": "test"}  # the module's split name -> the data module's loader


def child(args: argparse.Namespace) -> dict:
    """Runs in the tree's own process: the timings of one round, as a dict."""
    sys.path.insert(0, str(args.tree))
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from training.module import TranslationModule
    from translation import Translator

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ckpt = Path(args.checkpoint).resolve()
    run_dir = ckpt.parent.parent
    cfg = OmegaConf.load(run_dir / "config.yaml")
    spm = sorted((run_dir / "tokenizer").glob("*.model"))
    overrides = {"run_dir": args.work_dir, "num_workers": 0}
    if len(spm) == 1:
        overrides["spm_model"] = str(spm[0])
    datamodule = instantiate(cfg.data, **overrides)
    datamodule.prepare_data()
    datamodule.setup("fit")
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    module = TranslationModule(**checkpoint["hyper_parameters"])
    module.model.load_state_dict({k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()})
    device = torch.device(args.device)
    module = module.to(device).eval()
    try:  # a tree with the fast paths applied at the program's edge
        from fastpaths.optimize import optimize

        module.use(optimize(module.model, device, "train"))
    except ImportError:
        pass  # a tree whose module applies them itself
    translator = Translator.from_checkpoint(str(ckpt), device=str(device))
    if hasattr(translator, "use"):
        translator.use(optimize(translator.model, device, "inference"))
    from translation.translator import SearchOptions

    result = {}
    for split, loader_name in SPLITS.items():
        if split not in args.splits:
            continue
        loader = datamodule.val_dataloader() if loader_name == "val" else datamodule.test_dataloader()
        batches = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in loader]
        beam = module.decoding.valid_beam_size if split == "valid" else module.decoding.beam_size
        with torch.inference_mode():
            for _ in range(2):  # the second pass is timed: the stage's own losses run warm
                start = time.perf_counter()
                for batch in batches:
                    module.loss(batch, label_smoothing=0.0)
                loss_s = time.perf_counter() - start
            module._eval_records = {}
            start = time.perf_counter()
            if hasattr(module, "_search") and module._search.__code__.co_argcount == 2:  # (self, split)
                for batch in batches:
                    module._eval_step(batch, split)
                records = module._search(split)
            else:  # a tree that searches inside each validation step
                for batch in batches:
                    module._eval_step(batch, beam, split)
                records = module._eval_records.pop(split)
            stage_s = time.perf_counter() - start
        by_id = {r[0]: r[3] for r in records if r[0] >= 0}
        ids = sorted(by_id)
        sources = []
        for batch in batches:
            rows = torch.cat([batch["ids"][:, None], batch["src_lengths"][:, None], batch["src"]], 1).tolist()
            sources += [(row[0], row[2 : 2 + row[1] - 1]) for row in rows if row[0] >= 0]
        sources = [ids_ for _, ids_ in sorted(sources)]
        options = SearchOptions(beam_size=beam, greedy=beam == 1)
        start = time.perf_counter()
        found = translator.translate_ids(sources, options)
        translate_s = time.perf_counter() - start
        same = sum(h[0].tokens == by_id[i] for i, h in zip(ids, found, strict=True))
        result[split] = {
            "sentences": len(ids),
            "beam": beam,
            "stage_s": stage_s,
            "loss_s": loss_s,
            "decode_s": stage_s - loss_s,
            "translate_s": translate_s,
            "same_outputs": same,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, help="a checkpoint in its run directory (config.yaml)")
    parser.add_argument("--tree", action="append", metavar="NAME=DIR", help="a tree (repeat); default: .")
    parser.add_argument("--rounds", type=int, default=3, help="runs of every tree, alternated")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    parser.add_argument("--splits", nargs="+", default=["valid", "test"], choices=list(SPLITS))
    parser.add_argument("--json", default="validation_decode", help="results file: bench/results/<name>.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.tree = Path(args.tree[0]).resolve()
        print(json.dumps(child(args)))
        return

    sys.path.insert(0, str(ROOT))
    import tempfile

    from bench.harness import environment, print_config, print_table, write_json

    given = args.tree or [f"this={ROOT}"]
    trees = [(n, Path(p).resolve()) for n, _, p in (t.partition("=") for t in given)]
    config = {
        **environment(args.threads),
        "command": " ".join(["python3", "bench/validation_decode.py", *sys.argv[1:]]),
        "trees": {n: str(p) for n, p in trees},
        "checkpoint": args.checkpoint,
    }
    print_config("validation and test decoding against translate.py", config)
    found: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as work:
        for round_ in range(args.rounds):
            for name, tree in trees:
                command = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree)]
                command += ["--checkpoint", str(Path(args.checkpoint).resolve())]
                command += ["--threads", str(args.threads)]
                command += ["--device", args.device, "--splits", *args.splits, "--work-dir", f"{work}/{name}"]
                env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
                proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{name}: {proc.stderr[-3000:]}")
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                for split, r in result.items():
                    found.setdefault((name, split), []).append(r)
                    print(
                        f"[{round_ + 1}/{args.rounds}] {name} {split}: stage {r['stage_s']:.2f} s "
                        f"(loss {r['loss_s']:.2f}), translate.py {r['translate_s']:.2f} s",
                        flush=True,
                    )
    rows, summary = [], {}
    for (name, split), runs in found.items():
        decode = statistics.median(r["decode_s"] for r in runs)
        translate = statistics.median(r["translate_s"] for r in runs)
        ratio = statistics.median(r["decode_s"] / r["translate_s"] for r in runs)
        same = min(r["same_outputs"] for r in runs)
        n = runs[0]["sentences"]
        summary[f"{name} {split}"] = {
            "decode_s": decode,
            "translate_s": translate,
            "ratio": ratio,
            "runs": runs,
        }
        search = "greedy" if runs[0]["beam"] == 1 else f"beam {runs[0]['beam']}"
        rows.append([name, split, search, n, decode, translate, ratio, f"{same}/{n}"])
    print()
    print_table(
        ["tree", "split", "search", "sentences", "stage decoding s", "translate.py s", "ratio", "same"],
        rows,
    )
    write_json(args.json, {"config": config, "results": summary})


if __name__ == "__main__":
    main()
