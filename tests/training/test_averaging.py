"""Checkpoint averaging: element-wise mean of the weights, training state dropped."""

import pytest
import torch

from training.average import average_checkpoints


def _checkpoint(path, scale: float, step: int) -> None:
    state = {
        "model.w": torch.full((2, 3), scale),
        "model.b": torch.tensor([scale, -scale]),
        "steps": torch.tensor(step),
    }
    torch.save({"state_dict": state, "hyper_parameters": {"scale": scale}, "optimizer_states": [{}]}, path)


def test_average_is_the_elementwise_mean_and_drops_training_state(tmp_path):
    paths = [tmp_path / f"{i}.ckpt" for i in range(3)]
    for i, p in enumerate(paths):
        _checkpoint(p, scale=float(i + 1), step=10 * i)
    out = average_checkpoints(paths, tmp_path / "avg.ckpt")
    avg = torch.load(out, weights_only=True)
    torch.testing.assert_close(avg["state_dict"]["model.w"], torch.full((2, 3), 2.0))
    torch.testing.assert_close(avg["state_dict"]["model.b"], torch.tensor([2.0, -2.0]))
    assert avg["state_dict"]["steps"].item() == 20  # integers are taken from the last, not averaged
    assert avg["hyper_parameters"] == {"scale": 3.0}
    assert "optimizer_states" not in avg
    assert avg["averaged_from"] == [str(p) for p in paths]


def test_mismatched_shapes_and_empty_lists_are_errors(tmp_path):
    _checkpoint(tmp_path / "a.ckpt", 1.0, 0)
    torch.save({"state_dict": {"model.w": torch.zeros(3, 2)}}, tmp_path / "b.ckpt")
    with pytest.raises(ValueError, match="model.w has shape"):
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"], tmp_path / "avg.ckpt")
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([], tmp_path / "avg.ckpt")


def test_a_failed_average_leaves_no_file_or_the_previous_one(tmp_path, monkeypatch):
    paths = [tmp_path / f"{i}.ckpt" for i in range(2)]
    for i, p in enumerate(paths):
        _checkpoint(p, scale=float(i + 1), step=i)
    save = torch.save

    def save_half_then_fail(obj, f):
        save(obj, f)
        f.seek(f.tell() // 2)
        f.truncate()
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    out = tmp_path / "avg.ckpt"
    with pytest.raises(OSError, match="No space"):
        average_checkpoints(paths, out)
    assert sorted(tmp_path.iterdir()) == paths  # no averaged.ckpt, no temporary file
    monkeypatch.setattr(torch, "save", save)
    average_checkpoints(paths[:1], out)
    before = out.read_bytes()
    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with pytest.raises(OSError, match="No space"):
        average_checkpoints(paths, out)
    assert out.read_bytes() == before
    assert sorted(tmp_path.iterdir()) == sorted([*paths, out])
