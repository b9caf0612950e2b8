"""The atomic writer: a file is written whole or not at all, and a failed write leaves no trace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from data.atomic import atomic_write


class InterruptedWriteError(Exception):
    """Stands for a crash, a full disk or Ctrl-C in the middle of writing."""


def test_a_finished_write_is_the_whole_file_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    with atomic_write(target) as f:
        f.write(b"first half ")
        assert not target.exists()  # nothing at the target until the write has finished
        f.write(b"second half")
    assert target.read_bytes() == b"first half second half"
    assert sorted(tmp_path.iterdir()) == [target]


def test_an_interrupted_write_leaves_no_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    with pytest.raises(InterruptedWriteError), atomic_write(target) as f:
        f.write(b"half of it")
        raise InterruptedWriteError
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_leaves_an_existing_file_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"the old contents")
    with pytest.raises(InterruptedWriteError), atomic_write(target) as f:
        f.write(b"new contents, cut off")
        raise InterruptedWriteError
    assert target.read_bytes() == b"the old contents"
    assert sorted(tmp_path.iterdir()) == [target]


def test_torch_save_failing_midway_leaves_the_old_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "model.ckpt"
    torch.save({"w": torch.ones(3)}, target)
    # torch.save has written the start of its zip archive when pickling the lambda fails.
    with pytest.raises(Exception, match="lambda|pickle"), atomic_write(target) as f:
        torch.save({"w": torch.zeros(1000), "bad": lambda: None}, f)
    torch.testing.assert_close(torch.load(target, weights_only=True)["w"], torch.ones(3))
    assert sorted(tmp_path.iterdir()) == [target]


def test_concurrent_writers_do_not_share_a_temporary_file(tmp_path: Path) -> None:
    # Two ranks writing the same cache entry: each gets its own temporary file; the last to finish wins.
    target = tmp_path / "entry.model"
    with atomic_write(target) as first, atomic_write(target) as second:
        assert first.name != second.name
        first.write(b"rank 0")
        second.write(b"rank 1")
    assert target.read_bytes() == b"rank 0"
    assert sorted(tmp_path.iterdir()) == [target]


def test_the_file_gets_the_permissions_open_would_give(tmp_path: Path) -> None:
    with open(tmp_path / "plain", "wb"):
        pass
    with atomic_write(tmp_path / "atomic"):
        pass
    assert os.stat(tmp_path / "atomic").st_mode == os.stat(tmp_path / "plain").st_mode


def test_a_missing_directory_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), atomic_write(tmp_path / "absent" / "out.bin") as f:
        f.write(b"never")
    assert list(tmp_path.iterdir()) == []


def test_the_directory_is_synced_after_the_rename(tmp_path: Path, monkeypatch) -> None:
    import data.atomic as atomic

    synced = []
    monkeypatch.setattr(atomic, "fsync_directory", lambda d: synced.append((Path(d), target.exists())))
    target = tmp_path / "out.bin"
    with atomic.atomic_write(target) as f:
        f.write(b"x")
    assert synced == [(tmp_path, True)]  # the directory, once the new name is in it
    atomic.fsync_directory(tmp_path)  # the real one works on this platform
