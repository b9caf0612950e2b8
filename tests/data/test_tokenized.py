"""Split tokenization: ids and lengths per row, a cache keyed by content, few large record batches."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from data.tokenized import tokenize_split
from data.tokenizer import EOS_ID, SubwordTokenizer


def test_tokenize_split_fields_and_cache_reuse(
    joint: SubwordTokenizer,
    pairs: list[tuple[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ds = datasets.Dataset.from_dict(
        {"id": [10, 11, 12], "src": [p[0] for p in pairs[:3]], "tgt": [p[1] for p in pairs[:3]]}
    )
    out = tokenize_split(ds, joint, joint, cache_dir=tmp_path)
    assert out.column_names == ["id", "src_ids", "tgt_ids", "src_len", "tgt_len"]
    assert out["id"] == [10, 11, 12]
    for row, (s, t) in zip(out, pairs[:3], strict=True):
        assert row["src_ids"] == joint.encode([s])[0] + [EOS_ID]
        assert row["tgt_ids"] == joint.encode([t])[0]
        assert row["src_len"] == len(row["src_ids"])
        assert row["tgt_len"] == len(row["tgt_ids"]) + 1
    assert len(list((tmp_path / "tokenized").glob("*.arrow"))) == 1

    def fail(self: SubwordTokenizer, texts: list[str]) -> list[list[int]]:
        raise AssertionError("re-encoded although the tokenized split is cached")

    with monkeypatch.context() as m:
        m.setattr(SubwordTokenizer, "encode", fail)
        again = tokenize_split(ds, joint, joint, cache_dir=tmp_path)
        assert again["src_ids"] == out["src_ids"]
    changed = ds.map(lambda row: {"tgt": row["tgt"] + " ."})
    tokenize_split(changed, joint, joint, cache_dir=tmp_path)
    assert len(list((tmp_path / "tokenized").glob("*.arrow"))) == 2


def test_tokenized_cache_file_has_few_large_record_batches(
    joint: SubwordTokenizer, pairs: list[tuple[str, str]], tmp_path: Path
) -> None:
    import pyarrow as pa

    ds = datasets.Dataset.from_dict(
        {"id": list(range(len(pairs))), "src": [p[0] for p in pairs], "tgt": [p[1] for p in pairs]}
    )
    cached = tokenize_split(ds, joint, joint, cache_dir=tmp_path, batch_size=20)
    in_memory = tokenize_split(ds, joint, joint, cache_dir=None, batch_size=20)
    assert cached["src_ids"][:] == in_memory["src_ids"][:] and cached["id"][:] == list(range(len(pairs)))
    (path,) = (tmp_path / "tokenized").glob("*.arrow")
    with pa.memory_map(str(path)) as source:
        rows = [batch.num_rows for batch in pa.ipc.open_stream(source)]
    assert rows == [200, 100]  # ten encoded blocks of 20 rows per record batch: few gathers per batch
