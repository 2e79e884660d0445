"""Checkpoints: exact round trips of nested state, atomic replacement, no pickle."""

import pytest
import torch

from fedistill.engine.checkpoint import (
    DamagedCheckpoint,
    latest_checkpoint,
    read_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)


def test_nested_state_round_trips_exactly(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "round": 3,
        "name": "x",
        "none": None,
    }
    write_checkpoint(tmp_path, "round_00003", {"client_000": state, "runner": {"round": 3}})
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == "round_00003"
    loaded = read_checkpoint(path)
    assert loaded["runner"] == {"round": 3}
    restored = loaded["client_000"]
    for key, value in state["model"].items():
        assert torch.equal(restored["model"][key], value)
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(restored["optimizer"])
    assert torch.equal(
        fresh.state_dict()["state"][0]["momentum_buffer"],
        optimizer.state_dict()["state"][0]["momentum_buffer"],
    )
    assert restored["round"] == 3 and restored["name"] == "x" and restored["none"] is None


def test_the_two_newest_checkpoints_are_kept(tmp_path):
    """The one before the newest is the fallback when the newest turns out damaged on resume."""
    for round in (1, 2, 3):
        write_checkpoint(tmp_path, f"round_{round:05d}", {"runner": {"round": round}})
    assert latest_checkpoint(tmp_path).name == "round_00003"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["round_00002", "round_00003"]
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.pkl"))


def test_clients_that_hold_nothing_cost_no_file_and_read_back_empty(tmp_path):
    """A thousand idle clients (never sampled, or stateless) must not cost two files each."""
    runner = {"round": 1, "ledger": 0, "metrics": 1, "elapsed": 0.5}
    parts = {"runner": runner, "server": {}, "client_000": {"model": {"w": torch.ones(2)}}}
    parts |= {f"client_{cid:03d}": {} for cid in range(1, 50)}
    path = write_checkpoint(tmp_path, "round_00001", parts)
    written = sorted(p.name for p in path.iterdir())
    assert written == [
        "client_000.json",
        "client_000.safetensors",
        "empty-parts.json",
        "manifest.json",
        "runner.json",
        "runner.safetensors",
    ]
    loaded = verify_checkpoint(path)
    assert list(loaded) == sorted(parts)
    assert all(loaded[name] == {} for name in parts if name not in ("runner", "client_000"))
    assert torch.equal(loaded["client_000"]["model"]["w"], torch.ones(2))
    (path / "empty-parts.json").write_text('["server"]')  # the list is in the manifest like every part
    with pytest.raises(DamagedCheckpoint):
        verify_checkpoint(path)
