"""The real Multi30k corpus from ../shared/data/multi30k (or $MULTI30K_DIR); skipped where absent."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from data.corpus import DATA_DIR_ENV, shared_data_dir
from data.datamodule import TranslationDataModule

MULTI30K = Path(os.environ.get(DATA_DIR_ENV) or shared_data_dir())
pytestmark = [
    pytest.mark.realdata,
    pytest.mark.skipif(
        not (MULTI30K / "train.de.gz").is_file(),
        reason=f"Multi30k not found in {MULTI30K} (set $MULTI30K_DIR)",
    ),
]


def test_multi30k_de_en_sizes_and_padding(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dm = TranslationDataModule(
        src_lang="de",
        tgt_lang="en",
        vocab_size=8000,
        max_tokens=4096,
        spm_threads=2,
        cache_dir=str(tmp_path / "cache"),
        run_dir=str(tmp_path / "run"),
    )  # data_dir left to its default, as train.py does
    with caplog.at_level(logging.INFO, logger="data"):
        dm.prepare_data()
        dm.setup("fit")
    assert {k: len(v) for k, v in dm.corpus.items()} == {
        "train": 29000,
        "validation": 1014,
        "test": 1000,
    }
    assert len(dm.tokenized["train"]) == 29000  # nothing blank or over max_len=250
    assert dm.src_vocab_size == 8000
    assert (tmp_path / "run" / "tokenizer" / "joint.model").is_file()
    assert dm.reference_texts("test")[0] == "A man in an orange hat starring at something."

    fraction = dm.train_padding_fraction()
    print(f"Multi30k de-en train padding fraction at max_tokens=4096: {fraction:.4f}")
    assert fraction < 0.10
    assert len(dm.train_dataloader()) == len(list(dm.train_dataloader()))
