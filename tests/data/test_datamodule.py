"""TranslationDataModule on a tiny corpus: batches, run-dir tokenizer, Trainer epochs and resume."""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint

from data.datamodule import TranslationDataModule
from data.settings import config_defaults
from data.tokenizer import EOS_ID, PAD_ID, load_run_tokenizers

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
VOCAB = 64  # joint vocabulary of the toy lexicon


def _datamodule(corpus_dir: Path, tmp_path: Path, **kwargs: object) -> TranslationDataModule:
    args = {
        "data_dir": str(corpus_dir),
        "vocab_size": VOCAB,
        "max_tokens": 300,
        "cache_dir": str(tmp_path / "cache"),
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
    }
    args.update(kwargs)
    return TranslationDataModule(**args)


def _ids(loader: torch.utils.data.DataLoader) -> list[list[int]]:
    return [batch["ids"].tolist() for batch in loader]


def test_setup_serves_batches_and_texts(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    dm = _datamodule(tiny_corpus_dir, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.src_tokenizer is dm.tgt_tokenizer
    assert dm.src_vocab_size == dm.tgt_vocab_size == VOCAB
    assert (tmp_path / "run" / "tokenizer" / "joint.model").is_file()
    assert load_run_tokenizers(tmp_path / "run")[0].fingerprint == dm.src_tokenizer.fingerprint

    train = list(dm.train_dataloader())
    ids = [i for b in train for i in b["ids"].tolist()]
    assert sorted(ids) == list(range(400))
    for b in train:
        B, S = b["src"].shape
        assert b["tgt_in"].shape == b["tgt_out"].shape and b["tgt_in"].shape[0] == B
        assert B * max(S, b["tgt_in"].shape[1]) <= 300
        rows = torch.arange(B)
        assert (b["src"][rows, b["src_lengths"] - 1] == EOS_ID).all()
        assert (b["tgt_out"][rows, b["tgt_lengths"] - 1] == EOS_ID).all()
        assert ((b["src"] == PAD_ID).sum(1) == S - b["src_lengths"]).all()
    assert 0.0 <= dm.train_padding_fraction() < 0.2

    val_ids = _ids(dm.val_dataloader())
    assert val_ids == _ids(dm.val_dataloader())  # fixed order
    assert sorted(i for b in val_ids for i in b) == list(range(30))
    sources, refs = dm.source_texts("test"), dm.reference_texts("test")
    assert len(sources) == len(refs) == 25
    batch = next(iter(dm.test_dataloader()))
    i = batch["ids"][0].item()
    assert dm.src_tokenizer.decode([batch["src"][0].tolist()]) == [sources[i]]
    assert dm.tgt_tokenizer.decode([batch["tgt_out"][0].tolist()]) == [refs[i]]
    with pytest.raises(ValueError):
        dm.source_texts("train")


def test_separate_vocabularies(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    dm = _datamodule(tiny_corpus_dir, tmp_path, joint_vocab=False, vocab_size=40)
    dm.setup("validate")
    assert dm.src_tokenizer is not dm.tgt_tokenizer
    assert {p.name for p in (tmp_path / "run" / "tokenizer").glob("*.model")} == {
        "src.model",
        "tgt.model",
    }


def _spm_files(directory: Path) -> dict[str, Path]:
    """Two word-level SentencePiece models with the project's ids (one per side of the lexicon)."""
    from tests.toy_text import LEXICON, train_word_spm

    directory.mkdir(parents=True, exist_ok=True)
    files = {"src": directory / "src.model", "tgt": directory / "tgt.model"}
    files["src"].write_bytes(train_word_spm(list(LEXICON)))
    files["tgt"].write_bytes(train_word_spm(list(LEXICON.values())))
    return files


@pytest.mark.parametrize("joint", [True, False], ids=["spm_model", "src_and_tgt_spm_model"])
def test_given_spm_models_are_used_as_they_are_and_none_is_trained(
    tiny_corpus_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, joint: bool
) -> None:
    """data.spm_model (or the per-side keys): the given bytes tokenize the corpus and are copied
    into the run; SentencePiece is not trained (vocab_size is ignored), and the cache holds no model."""
    files = _spm_files(tmp_path / "given")
    keys = {"spm_model": str(files["src"])} if joint else {k + "_spm_model": str(f) for k, f in files.items()}
    dm = _datamodule(tiny_corpus_dir, tmp_path, joint_vocab=joint, vocab_size=VOCAB, **keys)
    with caplog.at_level(logging.INFO, logger="data"):
        dm.setup("fit")
    assert "training SentencePiece" not in caplog.text and "reusing SentencePiece" not in caplog.text
    assert "SentencePiece: using data." in caplog.text and "not training one" in caplog.text
    assert not (tmp_path / "cache" / "spm").exists()
    run = tmp_path / "run" / "tokenizer"
    if joint:
        assert dm.src_tokenizer is dm.tgt_tokenizer
        assert dm.src_tokenizer.model_proto == files["src"].read_bytes() == (run / "joint.model").read_bytes()
    else:
        assert dm.src_tokenizer.model_proto == files["src"].read_bytes() == (run / "src.model").read_bytes()
        assert dm.tgt_tokenizer.model_proto == files["tgt"].read_bytes() == (run / "tgt.model").read_bytes()
    assert dm.src_vocab_size != VOCAB  # the given model's size, not data.vocab_size
    assert len(list(dm.train_dataloader())) > 0


SPM_REFUSALS = {
    "missing file": (
        {"spm_model": "{dir}/absent.model"},
        True,
        r"data\.spm_model=.*absent\.model: cannot be read",
    ),
    "not a model": (
        {"spm_model": "{dir}/junk.model"},
        True,
        r"data\.spm_model=.*junk\.model: not a SentencePiece",
    ),
    "joint model, separate vocabularies": (
        {"spm_model": "{dir}/src.model"},
        False,
        r"data\.spm_model=.* data\.joint_vocab=false",
    ),
    "one side only": (
        {"src_spm_model": "{dir}/src.model"},
        False,
        r"data\.src_spm_model=.*src\.model is given without data\.tgt_spm_model",
    ),
    "both kinds": (
        {"spm_model": "{dir}/src.model", "tgt_spm_model": "{dir}/tgt.model"},
        True,
        r"data\.spm_model=.* and data\.tgt_spm_model=.* are both given",
    ),
}


@pytest.mark.parametrize("keys, joint, said", SPM_REFUSALS.values(), ids=SPM_REFUSALS.keys())
def test_an_unusable_spm_model_is_an_error_naming_the_key_and_path_before_the_corpus_is_read(
    tmp_path: Path, keys: dict[str, str], joint: bool, said: str
) -> None:
    from data.tokenizer import SpmModelError

    given = tmp_path / "given"
    _spm_files(given)
    (given / "junk.model").write_bytes(b"not a model")
    keys = {k: v.format(dir=given) for k, v in keys.items()}
    dm = _datamodule(tmp_path / "no-corpus-here", tmp_path, joint_vocab=joint, fallback_hub_id=None, **keys)
    with pytest.raises(SpmModelError, match=said) as err:
        dm.prepare_data()
    assert "\n" not in str(err.value)


def test_long_training_pairs_dropped_eval_kept(
    tiny_corpus_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dm = _datamodule(tiny_corpus_dir, tmp_path, max_len=20)
    with caplog.at_level(logging.INFO):
        dm.setup("fit")
    kept = len(dm.tokenized["train"])
    assert 0 < kept < 400
    train = dm.tokenized["train"]
    assert max(train["src_len"][:] + train["tgt_len"][:]) <= 20
    assert f"kept {kept} of 400 pairs; dropped {400 - kept} longer than 20 tokens" in caplog.text
    assert len(dm.tokenized["validation"]) == 30 and len(dm.tokenized["test"]) == 25
    assert re.search(r"validation: \d+ of 30 pairs are longer than max_len=20", caplog.text)
    assert "train padding fraction" in caplog.text


class _Recorder(L.LightningModule):
    """Records the example ids of every training batch, per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch["ids"].tolist()))
        return (self.w * batch["src"].float().mean()).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path: Path, **kwargs: object) -> L.Trainer:
    args = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "use_distributed_sampler": False,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "default_root_dir": str(tmp_path),
    }
    args.update(kwargs)
    return L.Trainer(**args)


def _by_epoch(seen: list[tuple[int, list[int]]]) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = {}
    for epoch, ids in seen:
        out.setdefault(epoch, []).append(ids)
    return out


@pytest.mark.filterwarnings("ignore:.*does not have many workers")
@pytest.mark.filterwarnings("ignore:.*but have no `validation_step`")
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
@pytest.mark.filterwarnings("error:.*not resumable")
def test_training_batches_at_another_size_leave_the_runs_own_untouched(
    tiny_corpus_dir: Path, tmp_path: Path
) -> None:
    """train_loader_at cuts the whole training set at the size asked (what the recipe fit times a
    candidate on), and the run's own batches and their epoch count stay those of data.max_tokens."""
    dm = _datamodule(tiny_corpus_dir, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    own = _ids(dm.train_dataloader())
    for size in (100, 600):
        other = list(dm.train_loader_at(size))
        assert sorted(i for b in other for i in b["ids"].tolist()) == list(range(400))
        assert all(b["src"].shape[0] * max(b["src"].shape[1], b["tgt_in"].shape[1]) <= size for b in other)
    assert len(dm.train_loader_at(100)) > len(own) > len(dm.train_loader_at(600))
    assert _ids(dm.train_dataloader()) == own and dm.settings.batches.max_tokens == 300


def test_trainer_epochs_reshuffle_and_resume_mid_epoch(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    reference = _Recorder()
    _trainer(tmp_path, max_epochs=2).fit(reference, datamodule=_datamodule(tiny_corpus_dir, tmp_path))
    epochs = _by_epoch(reference.seen)
    for batches in epochs.values():  # every example exactly once per epoch
        assert Counter(i for b in batches for i in b) == Counter(range(400))
    assert epochs[0] != epochs[1]  # the Trainer's set_epoch reached the sampler

    # The same run again, checkpointing three batches into the second epoch; then resume there.
    n = len(epochs[0])
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=n + 3, save_top_k=-1)
    first = _Recorder()
    _trainer(tmp_path, max_epochs=2, enable_checkpointing=True, callbacks=[saver]).fit(
        first, datamodule=_datamodule(tiny_corpus_dir, tmp_path)
    )
    assert first.seen == reference.seen
    (ckpt,) = (tmp_path / "ckpt").glob("*.ckpt")
    second = _Recorder()
    _trainer(tmp_path, max_epochs=2).fit(
        second, datamodule=_datamodule(tiny_corpus_dir, tmp_path), ckpt_path=str(ckpt)
    )
    assert _by_epoch(second.seen) == {1: epochs[1][3:]}


def _composed(name: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(overrides=[f"+data={name}"])
    return dict(cfg.data)


def test_configs_map_one_to_one_and_every_key_is_commented(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    params = set(config_defaults())  # the keys TranslationDataModule(**config) reads
    multi30k = _composed("multi30k")
    assert set(multi30k) - {"_target_", "_convert_"} == params
    hub = _composed("hub")
    assert set(hub) - {"_target_", "_convert_"} == params
    assert hub["hub_id"] == "wmt14" and hub["valid_split"] == "validation"
    for path in sorted((CONF_DIR / "data").glob("*.yaml")):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if re.match(r"^[A-Za-z_]+:", line) and not line.startswith(("_target_", "defaults")):
                above = n - 1
                while not lines[above].startswith("#"):
                    assert re.match(r"^[A-Za-z_]+:", lines[above]), f"{path.name}: {line}"
                    above -= 1  # a run of keys sharing one comment
    dm = instantiate(
        multi30k,
        data_dir=str(tiny_corpus_dir),
        vocab_size=VOCAB,
        cache_dir=str(tmp_path / "cache"),
    )
    assert isinstance(dm, TranslationDataModule)
    assert dm.hparams["valid_split"] == "val" and dm.hparams["test_split"] == "test_2016_flickr"
    dm.setup("test")
    assert len(dm.reference_texts("test")) == 25


def test_loaders_split_across_ranks_from_the_trainer(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    shares = {}
    for split in ("train", "validation"):
        per_rank = []
        for rank in range(3):
            dm = _datamodule(tiny_corpus_dir, tmp_path)
            dm.trainer = SimpleNamespace(world_size=3, global_rank=rank)  # what the loaders read
            dm.setup("validate")
            loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
            per_rank.append(_ids(loader))
        assert len({len(batches) for batches in per_rank}) == 1  # equal counts: DDP does not hang
        shares[split] = [i for batches in per_rank for b in batches for i in b]
    assert sorted(shares["train"]) == list(range(400))  # disjoint and complete
    assert sorted(shares["validation"]) == list(range(30))


def test_batches_are_pinned_by_default_only_for_a_cuda_trainer(tiny_corpus_dir: Path, tmp_path: Path) -> None:
    def pinned(device: str, **kwargs: object) -> bool:
        dm = _datamodule(tiny_corpus_dir, tmp_path, **kwargs)
        strategy = SimpleNamespace(root_device=torch.device(device))
        dm.trainer = SimpleNamespace(world_size=1, global_rank=0, strategy=strategy)
        dm.setup("validate")
        return dm.val_dataloader().pin_memory

    assert _datamodule(tiny_corpus_dir, tmp_path).hparams["pin_memory"] is None  # auto
    assert pinned("cuda") and not pinned("cpu")
    assert not pinned("cuda", pin_memory=False) and pinned("cpu", pin_memory=True)


def test_hub_translation_column_streams_through_the_same_preparation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A WMT-style hub dataset (a `translation` dict column), made here as local parquet files
    # and read by `datasets` itself: no network.
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data import arrow_pairs
    from data import corpus as corpus_mod
    from data import hub as hub_mod
    from data import prepared as prepared_mod
    from tests.toy_text import make_pairs

    sizes = {"train": 2500, "validation": 40, "test": 30}
    files = {}
    for seed, (split, n) in enumerate(sizes.items()):
        pairs = make_pairs(n, seed=seed)
        if split == "train":
            pairs[5] = ("  ", "blank source")  # dropped, counted
        rows = [{"de": s, "en": t} for s, t in pairs]
        files[split] = str(tmp_path / f"{split}.parquet")
        pq.write_table(pa.table({"translation": rows}), files[split])
    calls = []
    real_load_dataset = datasets.load_dataset

    def load_dataset(hub_id: str, config: str | None) -> datasets.DatasetDict:
        calls.append((hub_id, config))
        return real_load_dataset("parquet", data_files=files, cache_dir=str(tmp_path / "hf"))

    monkeypatch.setattr(corpus_mod.datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(hub_mod, "_HUB_BLOCK_ROWS", 700)  # several blocks, as for millions of rows
    args = {
        "hub_id": "someone/wmt-like",
        "hub_config": "de-en",
        "valid_split": "validation",
        "test_split": "test",
    }
    dm = _datamodule(tmp_path / "unused", tmp_path, **args)
    dm.setup("fit")
    assert calls == [("someone/wmt-like", "de-en")]
    assert {k: len(v) for k, v in dm.corpus.items()} == {"train": 2499, "validation": 40, "test": 30}
    assert 5 not in dm.corpus["train"]["id"] and dm.corpus["train"]["id"][5] == 6
    assert dm.reference_texts("test") == [t for _, t in make_pairs(30, seed=2)]
    # Written block by block into the corpus cache, and memory-mapped from there.
    (train_file,) = (Path(f["filename"]) for f in dm.corpus["train"].cache_files)
    assert train_file.parent.parent == tmp_path / "cache" / "corpus"
    with pa.memory_map(str(train_file)) as source:
        assert len(pa.ipc.open_stream(source).read_all().to_batches()) == 4  # ceil(2500 / 700)
    ids = sorted(i for b in dm.train_dataloader() for i in b["ids"].tolist())
    assert ids == sorted(dm.corpus["train"]["id"])

    def no_writing(*a: object, **k: object) -> None:
        raise AssertionError("the corpus was written again although its cache entry is complete")

    monkeypatch.setattr(prepared_mod, "write_pairs", no_writing)
    monkeypatch.setattr(arrow_pairs, "write_pairs", no_writing)
    again = _datamodule(tmp_path / "unused", tmp_path, **args)
    again.setup("fit")
    assert again.src_tokenizer.fingerprint == dm.src_tokenizer.fingerprint
