"""Corpus sources and reading: faithful line splitting, clear errors, which source is read."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import datasets
import pytest

from data import corpus as corpus_mod
from data import lines as lines_mod
from data.corpus import (
    HUB_SPLITS,
    MULTI30K_HUB_ID,
    CorpusError,
    CorpusLocation,
    CorpusNotFoundError,
    iter_parallel_blocks,
    shared_data_dir,
)
from data.lines import LineMode, read_lines
from data.prepared import prepare_corpus
from tests.data.conftest import write_file
from tests.toy_text import make_pairs, write_split


def local_corpus(
    data_dir: Path, src_lang: str = "de", tgt_lang: str = "en", **splits: str
) -> datasets.DatasetDict:
    """The splits train.py prepares from ``data_dir`` (in memory, no hub fallback)."""
    return prepare_corpus(
        CorpusLocation(src_lang, tgt_lang, str(data_dir), fallback_hub_id=None, **splits)
    ).splits


# Characters that str.splitlines() or universal newlines treat as line breaks.
HOSTILE = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_hostile_separators_stay_inside_lines(tmp_path: Path, suffix: str) -> None:
    src_lines = [f"vor{c}nach {i}" for i, c in enumerate(HOSTILE)] + ["\r\r", "ende\r"]
    tgt_lines = [f"before{c}after {i}" for i, c in enumerate(HOSTILE)] + ["x", "end"]
    for split in ("train", "val", "test_2016_flickr"):
        write_file(tmp_path / f"{split}.de{suffix}", "".join(s + "\n" for s in src_lines))
        write_file(tmp_path / f"{split}.en{suffix}", "".join(t + "\n" for t in tgt_lines))

    # \r\n is a line end (one \r removed from a line's end); every other \r stays.
    src_read = [s.removesuffix("\r") for s in src_lines]
    assert read_lines(tmp_path / f"train.de{suffix}", LineMode.STRICT) == src_read
    assert len("".join(s + "\n" for s in src_lines).splitlines()) > len(src_lines)  # the trap

    corpus = local_corpus(tmp_path)
    for split in ("validation", "test"):  # never filtered (training drops its blank pairs)
        assert corpus[split]["src"] == src_read
        assert corpus[split]["tgt"] == tgt_lines
        assert corpus[split]["id"] == list(range(len(src_lines)))


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    write_split(tmp_path, "train", make_pairs(5, seed=0))
    write_split(tmp_path, "val", make_pairs(3, seed=0))
    write_split(tmp_path, "test_2016_flickr", make_pairs(3, seed=0))
    write_file(tmp_path / "val.en.gz", "one\ntwo\n")
    with pytest.raises(CorpusError) as err:
        local_corpus(tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "val.de.gz") in msg and "3 lines" in msg
    assert str(tmp_path / "val.en.gz") in msg and "2 lines" in msg


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_invalid_utf8_names_file_and_line(tmp_path: Path, suffix: str) -> None:
    path = write_file(tmp_path / f"train.de{suffix}", b"gut\nauch gut\nkaputt \xff\xfe hier\nok\n")
    with pytest.raises(CorpusError) as err:
        list(iter_parallel_blocks(path, path))
    msg = str(err.value)
    assert str(path) in msg
    assert "line 3" in msg
    assert "\\xff" in msg


def test_missing_file_split_and_directory(tmp_path: Path) -> None:
    write_split(tmp_path, "train", make_pairs(5, seed=0))
    write_split(tmp_path, "val", make_pairs(3, seed=0))
    with pytest.raises(FileNotFoundError, match="test_2016_flickr.de.gz"):
        local_corpus(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'fr'"):
        local_corpus(tmp_path, "de", "fr", test_split="val")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        local_corpus(tmp_path / "nowhere")


def test_split_names_are_configurable(tmp_path: Path) -> None:
    write_split(tmp_path, "tr", make_pairs(7, seed=0))
    write_split(tmp_path, "dev", make_pairs(4, seed=1))
    write_split(tmp_path, "tst", make_pairs(3, seed=2), gz=False)
    corpus = local_corpus(tmp_path, train_split="tr", valid_split="dev", test_split="tst")
    assert {k: len(v) for k, v in corpus.items()} == {"train": 7, "validation": 4, "test": 3}
    assert corpus["validation"]["src"] == [p[0] for p in make_pairs(4, seed=1)]


def test_hub_layouts_normalized_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    flat = datasets.Dataset.from_dict({"en": ["a dog", "a cat"], "de": ["ein hund", "eine katze"]})
    nested = datasets.Dataset.from_dict(
        {"translation": [{"de": "ein hund", "en": "a dog"}, {"de": "haus", "en": "house"}]},
        features=datasets.Features({"translation": datasets.Translation(languages=["de", "en"])}),
    )
    hubs = {
        name: datasets.DatasetDict({s: ds for s in HUB_SPLITS})
        for name, ds in [("flat", flat), ("nested", nested)]
    }
    monkeypatch.setattr(corpus_mod.datasets, "load_dataset", lambda hub_id, config: hubs[hub_id])

    def hub(hub_id: str, src: str, tgt: str, valid_split: str = "validation") -> datasets.DatasetDict:
        return prepare_corpus(
            CorpusLocation(src, tgt, hub_id=hub_id, valid_split=valid_split, test_split="test")
        ).splits

    out = hub("flat", "de", "en")["test"]
    assert out.column_names == ["id", "src", "tgt"]
    assert out["src"] == ["ein hund", "eine katze"] and out["id"] == [0, 1]
    out = hub("nested", "en", "de")["test"]
    assert out["src"] == ["a dog", "house"] and out["tgt"] == ["ein hund", "haus"]
    with pytest.raises(CorpusError, match="not both"):
        hub("nested", "de", "fr")
    with pytest.raises(CorpusError, match="expected a 'translation' column"):
        hub("flat", "de", "fr")
    with pytest.raises(CorpusError, match="has no split 'val'"):
        hub("nested", "de", "en", valid_split="val")


def test_shared_data_dir_is_beside_the_project_whatever_the_working_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir("/")
    expected = Path(corpus_mod.__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
    assert shared_data_dir() == expected.resolve()


# ------------------------------------------------------------------ where the corpus comes from

MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")


@pytest.fixture
def shared_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``../shared/data/multi30k`` moved under ``tmp_path`` (not created) and ``$MULTI30K_DIR`` unset."""
    shared = tmp_path / "shared" / "data" / "multi30k"
    monkeypatch.setattr(corpus_mod, "shared_data_dir", lambda: shared)
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    return shared


def _fake_hub(monkeypatch: pytest.MonkeyPatch, hub: datasets.DatasetDict) -> list[tuple]:
    """``datasets.load_dataset`` answering with ``hub``; returns the calls it got."""
    calls: list[tuple] = []

    def load_dataset(*args: object, **kwargs: object) -> datasets.DatasetDict:
        calls.append(args)
        return hub

    monkeypatch.setattr(corpus_mod.datasets, "load_dataset", load_dataset)
    return calls


def _no_hub(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def load_dataset(*args: object, **kwargs: object) -> datasets.DatasetDict:
        raise error

    monkeypatch.setattr(corpus_mod.datasets, "load_dataset", load_dataset)


def _multi30k_dir(directory: Path, n: int) -> Path:
    """A Multi30k-shaped directory whose training split has ``n`` pairs (to tell sources apart)."""
    for split, size in zip(MULTI30K_SPLITS, (n, 3, 2), strict=True):
        write_split(directory, split, make_pairs(size, seed=n))
    return directory


def _hub_multi30k(n: int) -> datasets.DatasetDict:
    """The hub layout of Multi30k: flat en/de columns, splits train / validation / test."""
    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {
                    "en": [t for _, t in make_pairs(size, seed=n)],
                    "de": [s for s, _ in make_pairs(size, seed=n)],
                }
            )
            for split, size in zip(HUB_SPLITS, (n, 3, 2), strict=True)
        }
    )


def test_source_order_data_dir_env_shared_then_hub(
    shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    explicit = _multi30k_dir(tmp_path / "explicit", 5)
    env = _multi30k_dir(tmp_path / "env", 6)
    _multi30k_dir(shared_dir, 7)
    calls = _fake_hub(monkeypatch, _hub_multi30k(8))
    monkeypatch.setenv("MULTI30K_DIR", str(env))

    def train_size() -> int:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="data.prepared"):
            corpus = prepare_corpus(CorpusLocation("de", "en", data_dir=data_dir)).splits
        return len(corpus["train"])

    data_dir: str | None = str(explicit)  # 1. an explicit data_dir beats everything local
    assert train_size() == 5 and f"local files in {explicit} " in caplog.text

    data_dir = None  # 2. then $MULTI30K_DIR
    assert train_size() == 6 and f"local files in {env} " in caplog.text and "$MULTI30K_DIR" in caplog.text

    monkeypatch.setenv("MULTI30K_DIR", "")  # empty counts as unset; 3. then ../shared/data/multi30k
    assert train_size() == 7 and f"local files in {shared_dir} " in caplog.text
    monkeypatch.delenv("MULTI30K_DIR")
    assert train_size() == 7 and calls == []

    for path in shared_dir.iterdir():  # 4. no local copy at all: the hub
        path.unlink()
    shared_dir.rmdir()
    assert train_size() == 8 and calls == [(MULTI30K_HUB_ID, None)]
    assert f"Hugging Face hub dataset {MULTI30K_HUB_ID} (splits train/validation/test" in caplog.text

    # An explicit hub_id still comes first, with the split names it is given.
    source = CorpusLocation(
        data_dir=str(explicit), hub_id="some/hub-id", valid_split="dev", test_split="tst"
    ).resolve()
    assert (source.hub_id, source.data_dir, source.splits) == ("some/hub-id", None, ("train", "dev", "tst"))
    # Without a fallback, a missing shared directory stays the error it always was.
    with pytest.raises(CorpusNotFoundError, match=f"corpus directory {shared_dir} does not exist"):
        prepare_corpus(CorpusLocation("de", "en", fallback_hub_id=None))


def test_explicit_directories_that_do_not_exist_are_errors_not_downloads(
    shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_hub(monkeypatch, _hub_multi30k(8))
    with pytest.raises(FileNotFoundError, match=f"corpus directory {tmp_path / 'typo'} does not exist"):
        prepare_corpus(CorpusLocation("de", "en", data_dir=str(tmp_path / "typo")))
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "typo2"))
    with pytest.raises(FileNotFoundError, match="typo2 does not exist"):
        prepare_corpus(CorpusLocation("de", "en"))
    assert calls == []


def test_hub_fallback_gives_the_corpus_the_local_files_give(
    shared_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows that test the line handling: separators kept inside, blanks dropped from train only.
    src = [f"vor{c}nach" for c in HOSTILE] + ["", "gut", " \t", "o\rk"]
    tgt = [f"before{c}after" for c in HOSTILE] + ["empty", "", "blank", "ok"]
    (tmp_path / "local").mkdir()
    for split in MULTI30K_SPLITS:
        write_file(tmp_path / "local" / f"{split}.de", "".join(s + "\n" for s in src))
        write_file(tmp_path / "local" / f"{split}.en", "".join(t + "\n" for t in tgt))
    rows = datasets.Dataset.from_dict({"en": tgt, "de": src})
    _fake_hub(monkeypatch, datasets.DatasetDict({split: rows for split in HUB_SPLITS}))

    local = prepare_corpus(CorpusLocation("de", "en", data_dir=str(tmp_path / "local"))).splits
    hub = prepare_corpus(CorpusLocation("de", "en")).splits  # nothing local: the fallback
    for split in ("train", "validation", "test"):
        assert hub[split].to_dict() == local[split].to_dict(), split
    assert hub["train"]["id"] == [*range(len(HOSTILE)), len(src) - 1]  # row index before filtering
    assert hub["test"]["id"] == list(range(len(src)))
    assert hub["test"]["src"] == src


def test_unreachable_hub_fallback_is_one_message_naming_every_option(
    shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_hub(
        monkeypatch, ConnectionError("Couldn't reach 'bentrevett/multi30k' on the Hub (OfflineModeIsEnabled)")
    )
    with pytest.raises(CorpusNotFoundError) as err:
        prepare_corpus(CorpusLocation("de", "en"))
    msg = str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    assert "data.data_dir=PATH" in msg and "$MULTI30K_DIR=PATH" in msg and str(shared_dir) in msg
    assert "../shared/data/multi30k" in msg
    assert f"hub copy {MULTI30K_HUB_ID} cannot be read" in msg and "OfflineModeIsEnabled" in msg
    assert "{train,val,test_2016_flickr}.{de,en}[.gz]" in msg


def test_unreachable_explicit_hub_id_names_the_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_hub(monkeypatch, ConnectionError("Couldn't reach 'wmt14' on the Hub (ConnectError)"))
    with pytest.raises(CorpusNotFoundError, match=r"cannot read hub dataset wmt14 \(de-en\): Couldn't reach"):
        prepare_corpus(CorpusLocation("de", "en", hub_id="wmt14", hub_config="de-en"))


# ------------------------------------------------------------------ streaming in blocks


def test_errors_at_scale_name_file_line_and_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines_mod, "_BLOCK_BYTES", 64)  # many blocks, as in a large file
    lines = [f"zeile {i}" for i in range(200)]
    # Undecodable bytes deep into the file: the line is counted across blocks.
    bad = "".join(s + "\n" for s in lines[:150]).encode() + b"kaputt \xff\n" + b"ok\n"
    path = write_file(tmp_path / "bad.de.gz", bad)
    with pytest.raises(CorpusError, match=r"bad\.de\.gz: invalid UTF-8 at line 151, byte 7"):
        list(corpus_mod.iter_parallel_blocks(path, path))
    # Mismatched counts: both files counted to their ends although reading stops at the first.
    src = write_file(tmp_path / "a.de", "".join(s + "\n" for s in lines))
    tgt = write_file(tmp_path / "a.en.gz", "".join(s + "\n" for s in lines[:37]))
    with pytest.raises(CorpusError) as err:
        list(corpus_mod.iter_parallel_blocks(src, tgt))
    assert f"{src} has 200 lines, {tgt} has 37 lines" in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_corrupt_gzip_names_file_and_line_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    monkeypatch.setattr(lines_mod, "_BLOCK_BYTES", 256)
    text = "".join(f"{i} {' '.join(str(j * i) for j in range(30))}\n" for i in range(400))
    payload = bytearray(gzip.compress(text.encode(), mtime=0))
    if damage == "truncated":
        payload = payload[: len(payload) * 2 // 3]
    else:
        payload[len(payload) * 2 // 3] ^= 0xFF
    path = tmp_path / "train.de.gz"
    path.write_bytes(bytes(payload))
    read = []
    with pytest.raises(CorpusError, match=r"train\.de\.gz: corrupt or truncated gzip data after line") as err:
        for block, _ in corpus_mod.iter_parallel_blocks(path, path):
            read += block
    assert len(read) > 0  # it failed part-way, after some blocks
    assert f"after line {len(read)} (" in str(err.value)  # the last line read whole
    if damage == "truncated":
        assert read == text.split("\n")[: len(read)]
    # A flipped byte decompresses to garbage until gzip's checksum at the end says so: what was
    # read is thrown away with the half-written cache entry (tests/data/test_interrupted.py).
