"""Checkpoints: exact round trips of nested state, atomic replacement, no pickle."""

import torch

from fedistill.engine.checkpoint import latest_checkpoint, read_checkpoint, write_checkpoint


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
