"""FedIOD's per-step site sampling (`fediod.sites_per_step`): by default every G-step asks every site and the
run is the one before the option existed; with k, each G-step asks exactly k sites, and sites never asked
hold no discriminator."""

import copy

import pytest
import torch

from algorithm_helpers import TINY_FEDIOD, fediod_parts
from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.federation.ledger import DOWN, UP, Ledger, read_ledger
from fedistill.transports.inprocess import InProcessFleet

SITES = 5
STEP_TYPES = ("query.generate", "query.backprop")


def _config(**fediod) -> RunConfig:
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["clients"] = SITES
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def _run(tmp_path, name: str, **fediod) -> tuple[list[dict], dict]:
    run_suite(_config(**fediod), tmp_path / name, progress=False)
    run = tmp_path / name / "fediod"
    student = torch.load(next((run / "models").glob("student*")), weights_only=True)
    return read_ledger(run / "ledger.jsonl"), student


def _sites_per_step(records: list[dict], kind: str) -> dict[int, set[int]]:
    """Per G-step, the sites that answered `kind`."""
    steps: dict[int, set[int]] = {}
    for r in records:
        if r["type"] == kind and r["direction"] == UP and r["status"] == "ok":
            steps.setdefault(r["step"], set()).add(r["client"])
    return steps


def test_zero_asks_every_site_and_equals_asking_all_of_them(tmp_path):
    """sites_per_step = 0 (the default) and = K are the same run: the same ledger, byte for byte, and the
    same student, bit for bit; every G-step asks every site."""
    default, student = _run(tmp_path, "default")
    every, student_every = _run(tmp_path, "every", sites_per_step=SITES)
    assert default == every
    assert student.keys() == student_every.keys()
    assert all(torch.equal(student[k], student_every[k]) for k in student)
    for kind in STEP_TYPES:
        steps = _sites_per_step(default, kind)
        assert len(steps) == 2 * 2  # 2 epochs x 2 G-steps
        assert all(sites == set(range(SITES)) for sites in steps.values())


def test_each_generator_step_asks_exactly_k_sites(tmp_path):
    records, _ = _run(tmp_path, "sampled", sites_per_step=2)
    for kind in STEP_TYPES:
        steps = _sites_per_step(records, kind)
        assert len(steps) == 2 * 2
        assert all(len(sites) == 2 for sites in steps.values())
    generate, backprop = (_sites_per_step(records, kind) for kind in STEP_TYPES)
    assert generate == backprop  # the sites asked for a batch are those asked for its gradient
    assert len({frozenset(s) for s in generate.values()}) > 1  # drawn anew at every step
    asked = {r["client"] for r in records if r["direction"] == DOWN and r["type"] in STEP_TYPES}
    assert asked == set().union(*generate.values())
    again, _ = _run(tmp_path, "again", sites_per_step=2)
    assert _sites_per_step(again, "query.generate") == generate  # the server's seeded draw


def test_sites_not_yet_asked_hold_no_discriminator():
    clients, server, _ = fediod_parts(_config(sites_per_step=1))
    assert not any(c.site_d.held for c in clients.values())  # building the federation builds no D_k
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    server.distillation_step(fleet)
    held = [cid for cid, c in clients.items() if c.site_d.held]
    assert len(held) == 1
    assert all(c.pending is None for c in clients.values())  # no site keeps a G-step's graph


@pytest.mark.parametrize(("value", "expected"), [("-1", ">= 0"), (str(SITES + 1), "exceeds the 5 clients")])
def test_bad_values_end_in_one_line(tmp_path, capsys, value, expected):
    argv = ["run", "--algorithm", "fediod", "--clients", str(SITES), "--rounds", "1", "--model", "mlp"]
    code = main([*argv, "--quiet", "--out", str(tmp_path), "--set", f"fediod.sites_per_step={value}"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("fedistill: error: ") and "sites_per_step" in err and expected in err
