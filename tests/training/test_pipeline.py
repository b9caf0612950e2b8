"""train.py's pipeline: configs compose, a fast dev run, exact resume, DDP BLEU, checkpoints.

Also: the GPU configs compose to arguments that exist, and a compiled run validates, tests and
writes checkpoints that load without torch.compile.
"""

from __future__ import annotations

import csv
import inspect
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict
from torch._dynamo.utils import counters

from common.checkpoint_file import CheckpointError
from data.settings import config_defaults
from fastpaths import hardware
from tests.toy_text import tiny_run_overrides, train_word_spm, write_toy_corpus
from training import average, checkpoint_io, run_record
from training.budget import BudgetSettings
from training.budget.points import point_path
from training.lr import RateSettings
from training.module import DEFAULT_OPTIMIZER, TranslationModule
from training.pipeline import train
from transformer import TransformerConfig
from translation import Translator

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if p.stem != "default")


def toy_overrides(corpus: Path, cache: Path, runs: Path) -> list[str]:
    return [
        "model=tiny",
        f"data.data_dir={corpus}",
        "data.test_split=test",
        "data.vocab_size=64",
        "data.max_tokens=512",
        f"data.cache_dir={cache}",
        f"paths.runs_dir={runs}",
        "lr.peak=3e-3",
        "lr.warmup_steps=20",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=5",
        "plot=false",
    ]


def compose_config(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir) if output_dir else "/nonexistent"
    return cfg


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    base = tmp_path_factory.mktemp("toy")
    return write_toy_corpus(base / "corpus"), base / "cache", base / "runs"


@pytest.mark.parametrize("experiment", [None, *_options("experiment")])
@pytest.mark.parametrize("model", _options("model"))
def test_every_model_and_experiment_composes(model, experiment):
    overrides = [f"model={model}"] + ([f"experiment={experiment}"] if experiment else [])
    cfg = compose_config(overrides)
    model_cfg = dict(cfg.model)
    TransformerConfig(src_vocab_size=100, tgt_vocab_size=100, **model_cfg)  # every key is a real field
    assert cfg.data._target_ == "data.datamodule.TranslationDataModule"
    assert cfg.hydra.job.chdir is False if "hydra" in cfg else True


@pytest.mark.parametrize("trainer", _options("trainer"))
def test_every_trainer_composes(trainer):
    cfg = compose_config([f"trainer={trainer}"])
    assert cfg.trainer._target_ == "lightning.Trainer"
    if trainer == "ddp":
        assert cfg.trainer.strategy == "ddp"


GPU_CONFIGS = {
    "trainer=gpu": ["trainer=gpu"],
    "trainer=ddp": ["trainer=ddp"],
    "model=base trainer=gpu": ["model=base", "trainer=gpu"],
    "experiment=multi30k_de_en_gpu": ["experiment=multi30k_de_en_gpu"],
    "experiment=wmt14_de_en_base_gpu": ["experiment=wmt14_de_en_base_gpu"],
}


@pytest.mark.parametrize("overrides", GPU_CONFIGS.values(), ids=GPU_CONFIGS.keys())
def test_gpu_configs_resolve_to_arguments_that_exist(overrides):
    """Every key resolves and is an argument of what it configures; the GPU settings are on."""
    cfg = OmegaConf.to_container(compose_config(overrides, Path("/tmp/run")), resolve=True)
    trainer, data, optimizer = cfg["trainer"], cfg["data"], cfg["optimizer"]
    # train.py takes the DDP timeouts out (training/ranks.py); _convert_ is Hydra's.
    taken_out = {"_target_", "_convert_", "ddp_timeout", "ddp_rendezvous_timeout"}
    assert set(trainer) - taken_out <= set(inspect.signature(L.Trainer.__init__).parameters)
    assert set(data) - taken_out <= set(config_defaults())  # the keys TranslationDataModule reads
    assert set(optimizer) == set(DEFAULT_OPTIMIZER)
    RateSettings.from_dict(cfg["lr"]), BudgetSettings.from_dict(cfg["budget"])  # every key known
    TransformerConfig(src_vocab_size=100, tgt_vocab_size=100, **cfg["model"])
    assert (trainer["accelerator"], trainer["precision"]) == ("gpu", "auto")  # bf16 where native
    assert trainer["gradient_clip_val"] > 0 and trainer["accumulate_grad_batches"] >= 1
    assert optimizer["fused"] is None  # auto: fused Adam unless fp16 scales gradients
    assert data["pin_memory"] is None  # auto: pinned on CUDA
    assert isinstance(cfg["compile"], bool)
    torch.set_float32_matmul_precision(cfg["float32_matmul_precision"])  # a valid value
    torch.set_float32_matmul_precision("highest")
    if "experiment" in overrides[0]:
        assert data["num_workers"] > 0
    if overrides == ["experiment=wmt14_de_en_base_gpu"]:
        assert cfg["model"]["d_model"] == 512 and data["max_tokens"] == 25000 and cfg["compile"] is True


def test_command_line_overrides_from_the_issue_compose():
    cfg = compose_config(
        ["data.src_lang=en", "data.tgt_lang=de", "model=tiny"]
        + ["trainer.max_epochs=1", "trainer.fast_dev_run=true"]
    )
    assert (cfg.data.src_lang, cfg.data.tgt_lang, cfg.model.d_model) == ("en", "de", 64)
    assert cfg.trainer.fast_dev_run is True


def test_fast_dev_run_on_a_corpus_made_in_the_test(toy, tmp_path):
    cfg = compose_config([*toy_overrides(*toy), "trainer.fast_dev_run=true"], tmp_path / "run")
    results = train(cfg)
    assert "test/bleu" in results and "train/loss" in results
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert (tmp_path / "run" / "tokenizer" / "joint.model").is_file()


def test_precision_and_time_budget_are_chosen_said_and_recorded(toy, tmp_path, monkeypatch, caplog):
    """On a CPU without native bf16, auto trains in fp32; the log, config.yaml and results.json say
    so and why; a time budget too short for the schedule is said at the start, with what to change."""
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    overrides = [*toy_overrides(*toy), "trainer.precision=auto", "trainer.max_time=00:00:05:00"]
    overrides += ["lr.warmup_steps=100000", "trainer.max_epochs=1", "trainer.limit_val_batches=1"]
    overrides += ["test=false", "average_last=3"]
    caplog.set_level(logging.INFO)
    results = train(compose_config(overrides, tmp_path / "run"))
    said = [r.getMessage() for r in caplog.records if r.name.startswith("training.")]
    chosen = [m for m in said if m.startswith("precision: 32-true (trainer.precision=auto): no native bf16")]
    assert len(chosen) == 1 and "native bf16 is False" in chosen[0]
    budget = [m for m in said if m.startswith("time budget:")]
    assert len(budget) == 1 and "too few for this schedule" in budget[0] and "trainer.max_time=" in budget[0]
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert config.startswith("# trainer.precision: auto -> 32-true: no native bf16: CPU capability")
    assert OmegaConf.create(config).trainer.precision == "32-true"
    assert results["precision"] == "32-true" and "native bf16 is False" in results["precision_reason"]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["precision"] == "32-true"


@pytest.mark.cpu_dependent
def test_auto_precision_trains_in_what_this_cpu_computes(tmp_path):
    """No monkeypatch: trainer.precision=auto trains two updates, validates and tests in bf16-mixed
    where this CPU computes bf16 natively, else in 32-true (AVX2 in .ci/run's emulated run), and
    says why. In-process: a train.py process would import torch and Lightning again, a minute of
    the emulated run (tests/test_train.py runs the same as a process)."""
    corpus = write_toy_corpus(tmp_path / "corpus", {"train": 40, "val": 2, "test": 2})
    overrides = [*tiny_run_overrides(corpus, tmp_path / "cache"), f"paths.runs_dir={tmp_path}"]
    results = train(compose_config(overrides, tmp_path / "run"))
    native, capability = hardware.native_bf16(), torch.backends.cpu.get_cpu_capability()
    assert results["precision"] == ("bf16-mixed" if native else "32-true") and results["ending_update"] == 2
    assert f"CPU capability {capability} " in results["precision_reason"]
    assert f"native bf16 is {native}" in results["precision_reason"]
    assert {"train/loss", "val/bleu", "test/bleu"} <= set(results)


@pytest.mark.slow  # compiles
def test_a_compiled_run_validates_tests_and_writes_plain_checkpoints(toy, tmp_path):
    """compile: the training step is compiled; greedy validation, beam-search test and checkpoints
    work as without, and the checkpoint loads with weights_only=True and no torch.compile.

    aot_eager (dynamo and AOTAutograd, no code generation) keeps this quick on the CPU; the
    inductor backend is compared with eager in tests/training/test_module.py.
    """
    overrides = [*toy_overrides(*toy), "compile={backend:aot_eager}", "trainer.max_epochs=1"]
    overrides += [
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2",
    ]
    torch._dynamo.reset()
    counters.clear()
    results = train(compose_config(overrides, tmp_path / "run"))
    assert counters["stats"]["unique_graphs"] >= 1  # the training step was compiled
    torch._dynamo.reset()
    assert {"train/loss", "val/bleu", "test/bleu"} <= set(results)
    ckpt_path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"]
    hp = torch.load(ckpt_path, map_location="cpu", weights_only=True)["hyper_parameters"]
    assert "compile" not in hp
    assert state.keys() == TranslationModule(hp["model"]).state_dict().keys()  # no "_orig_mod."
    translator = Translator.from_checkpoint(ckpt_path)
    assert len(translator.translate(["ein hund läuft", "die katze"])) == 2


@pytest.fixture(scope="module")
def trained_run(toy, tmp_path_factory):
    """A tiny model trained for a few epochs on the toy corpus: its run directory and results."""
    out = tmp_path_factory.mktemp("trained") / "run"
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=12", "data.max_tokens=256", "plot=true"]
    results = train(compose_config(overrides, out))
    return out, results


def test_training_learns_the_toy_task_and_writes_the_run(trained_run):
    out, results = trained_run
    assert results["test/bleu"] > 40, results  # untrained: ~2
    written = json.loads((out / "results.json").read_text())
    assert written["test/bleu"] == pytest.approx(results["test/bleu"])
    # The process's peak resident memory so far: at least what torch and the model take.
    assert 100 < written["peak_resident_mib"] < 24 * 1024
    hyps = (out / "test.en.hyp").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == 24
    assert (out / "learning_curve.png").stat().st_size > 10_000
    assert len(list((out / "checkpoints").glob("best-*.ckpt"))) == 1


def test_checkpoints_load_with_weights_only_and_hold_plain_hyperparameters(trained_run):
    out, _ = trained_run
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    hp = ckpt["hyper_parameters"]
    assert type(hp["model"]) is dict and type(hp["optimizer"]) is dict
    assert hp["model"]["d_model"] == 64 and hp["src_lang"] == "de"
    assert ckpt["nmt"]["src_lang"] == "de" and isinstance(ckpt["nmt"]["src_spm"], bytes)


def test_resumed_run_equals_a_straight_run(toy, tmp_path):
    """2 epochs, then resumed for 2 more == 4 epochs straight (dropout on): RNG and data restored."""
    corpus, cache, _ = toy
    runs = tmp_path / "runs"
    common = [*toy_overrides(corpus, cache, runs), "test=false", "name=resume"]

    def last_weights(run: str, epochs: int, extra: list[str], ckpt_run: str | None = None) -> dict:
        train(compose_config([*common, f"trainer.max_epochs={epochs}", *extra], runs / "resume" / run))
        last = runs / "resume" / (ckpt_run or run) / "checkpoints" / "last.ckpt"
        return torch.load(last, weights_only=True)["state_dict"]

    straight = last_weights("straight", 4, ["ckpt_path=null"])
    os.rename(runs / "resume" / "straight", tmp_path / "straight")  # "last" must find the 2-epoch run
    last_weights("a_first", 2, [])
    # The resumed run writes its checkpoints on into the run it resumes.
    resumed = last_weights("b_second", 4, ["ckpt_path=last"], ckpt_run="a_first")
    assert straight.keys() == resumed.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)


def test_every_checkpoint_and_results_json_go_through_the_atomic_writer(toy, tmp_path, monkeypatch):
    written: list[Path] = []

    def recording(module):
        real = module.atomic_write

        def atomic_write(path):
            written.append(Path(path))
            return real(path)

        monkeypatch.setattr(module, "atomic_write", atomic_write)

    recording(checkpoint_io)
    recording(run_record)
    recording(average)
    out = tmp_path / "run"
    overrides = [*toy_overrides(*toy), "trainer.max_epochs=2", "average_last=2", "test=false"]
    train(compose_config(overrides, out))
    checkpoints = sorted((out / "checkpoints").iterdir())
    assert {p.name for p in checkpoints} >= {"last.ckpt", "averaged.ckpt", "epoch000.ckpt", "epoch001.ckpt"}
    assert set(written) >= set(checkpoints)  # every file there came through the atomic writer
    assert out / "results.json" in written  # a reader never sees half of it either


@pytest.mark.slow
def test_ddp_bleu_equals_single_process_bleu(toy, trained_run, tmp_path):
    """2 gloo processes decode disjoint shares; BLEU over the gathered outputs is the same.

    25 test sentences in small batches: the ranks decode different sentences (and different
    numbers of them), so a BLEU computed per rank, or averaged over ranks, would differ.
    """
    corpus, cache, _ = toy
    odd = write_toy_corpus(tmp_path / "odd", {"train": 300, "val": 24, "test": 25})
    ckpt = trained_run[0] / "checkpoints" / "last.ckpt"
    for split in ("train", "val"):  # same training text -> same cached SentencePiece model
        for lang in ("de", "en"):
            (odd / f"{split}.{lang}").write_bytes((corpus / f"{split}.{lang}").read_bytes())

    def run(trainer: list[str], out: Path) -> dict:
        overrides = toy_overrides(odd, cache, tmp_path / "runs")
        overrides += ["train=false", f"ckpt_path={ckpt}", "data.max_tokens=64", f"hydra.run.dir={out}"]
        proc = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), *overrides, *trainer],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return {"log": proc.stdout + proc.stderr, **json.loads((out / "results.json").read_text())}

    single = run(["trainer=cpu"], tmp_path / "single")
    ddp_args = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    ddp = run(ddp_args, tmp_path / "ddp")
    assert "GLOBAL_RANK: 1" in ddp["log"] and "distributed_backend=gloo" in ddp["log"]
    assert single["test/bleu"] > 10
    assert ddp["test/bleu"] == pytest.approx(single["test/bleu"], abs=1e-9)
    assert ddp["test/chrf"] == pytest.approx(single["test/chrf"], abs=1e-9)


@pytest.mark.slow  # two train.py processes
def test_two_runs_started_in_the_same_second_get_different_directories():
    """The run directory ends in ${unique_id:}: pid + random bits, one value per process."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml"), resolve=False)
    run_dir = raw["hydra"]["run"]["dir"]
    assert run_dir.endswith("%H-%M-%S}_${unique_id:}")
    code = (
        "import training.pipeline; from omegaconf import OmegaConf; "
        "c = OmegaConf.create({'a': '${unique_id:}', 'b': '${unique_id:}'}); print(c.a, c.a == c.b)"
    )
    outputs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert outputs[0][1] == outputs[1][1] == "True"  # stable within a process
    assert outputs[0][0] != outputs[1][0]  # different across processes


def test_a_mix_of_tagged_corpora_trains_records_its_counts_and_resumes_exactly(toy, tmp_path):
    corpus, cache, _ = toy
    bt = write_toy_corpus(tmp_path / "bt", {"train": 300}, seed=7)
    runs = tmp_path / "runs"
    bt_entry = f"{{name: bt, data_dir: '{bt}', weight: 0.5, tag: '<BT>'}}"
    mix = f"data.corpora=[{{name: clean, weight: 1.5}}, {bt_entry}]"
    common = [*toy_overrides(corpus, cache, runs), "test=false", "name=mix", mix]
    common += [
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=1",
        "trainer.num_sanity_val_steps=0",
    ]

    def last_weights(
        run: str, epochs: int, extra: list[str], ckpt_run: str | None = None
    ) -> tuple[dict, dict]:
        results = train(compose_config([*common, f"trainer.max_epochs={epochs}", *extra], runs / "mix" / run))
        last = runs / "mix" / (ckpt_run or run) / "checkpoints" / "last.ckpt"
        return torch.load(last, weights_only=True)["state_dict"], results

    straight, results = last_weights("straight", 2, ["ckpt_path=null"])
    assert [(c["name"], c["weight"], c["tag"]) for c in results["corpora"]] == [
        ("clean", 1.5, None),
        ("bt", 0.5, "<BT>"),
    ]
    assert [c["per_epoch"] for c in results["corpora"]] == [
        round(1.5 * c["pairs"]) for c in results["corpora"][:1]
    ] + [round(0.5 * results["corpora"][1]["pairs"])]
    os.rename(runs / "mix" / "straight", tmp_path / "straight")  # "last" must find the 1-epoch run
    last_weights("a_first", 1, [])
    resumed, _ = last_weights("b_second", 2, ["ckpt_path=last"], ckpt_run="a_first")
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow  # trains for its time budget
def test_a_run_fitted_to_its_budget_says_records_and_averages_its_fit(toy, tmp_path, caplog):
    """budget.fit=budget: the fit is said in one line each time, recorded in results.json, and the
    averaged checkpoint holds the weights of the budget's last part; the run stops at the limit."""
    overrides = [*toy_overrides(*toy), "trainer.max_time=00:00:00:08", "trainer.max_epochs=200"]
    overrides += [
        "budget.fit=budget",
        "lr.warmup_steps=4000",
        "average_last=3",
        "test_ckpt=averaged",
    ]
    caplog.set_level(logging.INFO)
    results = train(compose_config(overrides, tmp_path / "run"))
    said = [r.getMessage() for r in caplog.records if r.name == "training.budget.fit"]
    fits = [m for m in said if m.startswith("schedule fit")]
    assert fits and all("the budget holds ~" in m and "warmup" in m for m in fits)
    fit = json.loads((tmp_path / "run" / "results.json").read_text())["schedule_fit"]
    assert fit == results["schedule_fit"] and fit["fitted"] and fit["warmup"] < 4000
    assert fit["decay_end"] == fit["forecast_updates"] and fit["validate_every_epochs"] >= 1
    averaged = torch.load(tmp_path / "run" / "checkpoints" / "averaged.ckpt", weights_only=True)
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert averaged["averaged_from"] == [str(point_path(ckpt_dir, u)) for u in fit["averaged_updates"]]
    assert len(fit["averaged_updates"]) >= 2 and results["ending"] == "stopped early"
    assert "test/bleu" in results


def test_a_run_resumed_on_another_corpus_keeps_its_vocabulary(toy, tmp_path, caplog):
    """resume.allow_changes=[data.data_dir], the corpus replaced by another whose SentencePiece
    model would differ: the run resumes with its checkpoint's (no new one trained), and its first
    update's loss is the run's, not a model's under another vocabulary's (~ln V)."""
    corpus, cache, _ = toy
    runs = tmp_path / "runs"
    common = [*toy_overrides(corpus, cache, runs), "test=false", "name=vocab", "logger=csv"]
    train(compose_config([*common, "trainer.max_epochs=3"], runs / "vocab" / "first"))
    last = runs / "vocab" / "first" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    other = write_toy_corpus(tmp_path / "other", {"train": 1000, "val": 24, "test": 24}, seed=7)
    caplog.set_level(logging.INFO)
    resumed = [*common, f"data.data_dir={other}", "resume.allow_changes=[data.data_dir]"]
    train(compose_config([*resumed, f"ckpt_path={last}", "trainer.max_epochs=4"], runs / "vocab" / "second"))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume: the SentencePiece")]
    assert len(said) == 1 and str(last) in said[0]
    assert not [r for r in caplog.records if "training SentencePiece" in r.getMessage()]
    tokenizer = runs / "vocab" / "second" / "tokenizer" / "joint.model"
    assert tokenizer.read_bytes() == saved["nmt"]["src_spm"]
    rows = list(csv.DictReader((runs / "vocab" / "first" / "logs" / "metrics.csv").open()))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    step = int(saved["global_step"])
    resumed_rows = list(csv.DictReader((runs / "vocab" / "second" / "logs" / "metrics.csv").open()))
    first = next(
        float(r["train/loss"]) for r in resumed_rows if r.get("train/loss") and int(r["step"]) >= step
    )
    assert first < losses[0] - 1.0 and first < 1.5 * losses[-1] + 0.5, (losses[0], losses[-1], first)


def test_a_run_resumed_with_another_vocabulary_is_refused_naming_both_files(toy, tmp_path):
    corpus, cache, _ = toy
    runs = tmp_path / "runs"
    common = [*toy_overrides(corpus, cache, runs), "test=false", "name=vocab2", "trainer.max_epochs=1"]
    train(compose_config(common, runs / "vocab2" / "first"))
    last = runs / "vocab2" / "first" / "checkpoints" / "last.ckpt"
    other = tmp_path / "other.model"
    other.write_bytes(train_word_spm(["ein anderes wort"]))
    with pytest.raises(
        CheckpointError, match=rf"data.spm_model={other} is not the SentencePiece model {last}"
    ):
        train(
            compose_config(
                [
                    *common,
                    f"ckpt_path={last}",
                    f"data.spm_model={other}",
                    "resume.allow_changes=[data.spm_model]",
                ],
                runs / "vocab2" / "b",
            )
        )
    tokenizer = runs / "vocab2" / "first" / "tokenizer" / "joint.model"
    tokenizer.write_bytes(other.read_bytes())  # the run's own file changed since
    with pytest.raises(CheckpointError, match=rf"{tokenizer} .* is not the SentencePiece model {last}"):
        train(compose_config([*common, f"ckpt_path={last}"], runs / "vocab2" / "c"))


@pytest.mark.parametrize("schedule", ["constant", "plateau"])
def test_a_flat_schedule_with_a_budget_fit_is_refused_naming_both_keys(toy, tmp_path, schedule):
    overrides = [*toy_overrides(*toy), "trainer.max_time=00:00:00:08", "budget.fit=budget"]
    with pytest.raises(ValueError, match=f"lr.schedule={schedule} .* budget.fit=budget"):
        train(compose_config([*overrides, f"lr.schedule={schedule}"], tmp_path / "run"))
