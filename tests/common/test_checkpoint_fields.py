"""The checkpoint's inference fields: SentencePiece models as bytes or files, the project's special ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.checkpoint_fields import inference_fields
from tests.toy_text import train_word_spm
from tests.translation.test_checkpoint import SRC_TEXT, TGT_TEXT


@pytest.fixture(scope="module")
def protos() -> dict[str, bytes]:
    return {"src": train_word_spm(SRC_TEXT), "tgt": train_word_spm(TGT_TEXT)}


def test_a_target_model_equal_to_the_source_is_stored_as_joint(protos: dict[str, bytes]) -> None:
    fields = inference_fields(protos["src"], protos["src"], "de", "en")
    assert fields["tgt_spm"] is None and fields["src_lang"] == "de" and fields["target_tags"] == {}


def test_inference_fields_reads_model_files(tmp_path: Path, protos: dict[str, bytes]) -> None:
    (tmp_path / "src.model").write_bytes(protos["src"])
    fields = inference_fields(tmp_path / "src.model", str(tmp_path / "src.model"), "de", "en")
    assert fields["src_spm"] == protos["src"] and fields["tgt_spm"] is None


def test_inference_fields_refuses_other_special_ids(protos: dict[str, bytes]) -> None:
    foreign = train_word_spm(TGT_TEXT, project_ids=False)
    with pytest.raises(ValueError, match="target tokenizer: .*pad/unk/bos/eos ids"):
        inference_fields(protos["src"], foreign, "de", "en")
    with pytest.raises(ValueError, match="source tokenizer: not a SentencePiece model"):
        inference_fields(b"not a model", None, "de", "en")
