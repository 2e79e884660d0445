"""Sites that are not sampled hold no model: memory grows with the sampled clients, not with the
federation (issue 40). A model built afresh each round trains to the same bits as one kept alive."""

import os
import subprocess
import sys

import pytest
import torch

from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.classic.local_model import LocalModel
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared.training import new_model
from fedistill.config import RunConfig, build_config, options_for
from fedistill.engine.setup import client_contexts, prepare_data
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import Message
from fedistill.transports.inprocess import InProcessFleet

SMALL = {"clients": 20, "rounds": 1, "model": "mlp", "batch_size": 16, "fraction": 0.2}


def _clients(algorithm: str, **changes):
    config = build_config(RunConfig(), SMALL, {"algorithm": algorithm, **changes})
    alg = get_algorithm(algorithm)
    options = options_for(config, algorithm, alg.options)
    data = prepare_data(config)
    contexts = client_contexts(config, alg, options, data)
    return config, alg, options, data, {ctx.client_id: alg.client(ctx) for ctx in contexts}


@pytest.mark.parametrize(
    ("algorithm", "changes"), [("fedavg", {}), ("feddf", {"feddf": {"steps": 4, "eval_every_steps": 2}})]
)
def test_idle_clients_hold_no_model_before_or_after_a_sampled_round(algorithm, changes):
    config, alg, options, data, clients = _clients(algorithm, **changes)
    assert not any(c.local.held for c in clients.values())  # building the federation builds no model
    server = alg.server(
        ServerContext(
            data.dataset.info,
            config,
            options,
            len(clients),
            lambda model: {"accuracy": 0.0, "loss": 0.0},
            validation=data.dataset.train.subset(data.split.server_val),
        )
    )
    fleet = InProcessFleet(clients, Ledger(None))
    fleet.round = 1
    held_while_training = []
    for client in clients.values():  # record how many sites hold a model while each one trains
        train = client._train
        client._train = lambda m, train=train: (
            held_while_training.append(sum(c.local.held for c in clients.values())),
            train(m),
        )[1]
    metrics = server.run_round(fleet, 1)
    assert metrics["clients"] == 4  # 20% of 20 sampled
    assert held_while_training == [0, 0, 0, 0]  # none was built ahead of its round ...
    assert not any(c.local.held for c in clients.values())  # ... and none is kept after it


def _request(state: dict[str, torch.Tensor], round: int) -> Message:
    config = {"round": round, "prox_mu": 0.01, "evaluate_local": True}
    return Message.build("train", arrays={"parameters": state}, scalars={"config": config})


def test_a_model_built_each_round_trains_to_the_bits_of_a_kept_one(monkeypatch):
    config, _, _, data, clients = _clients("fedavg")
    rebuilt, kept = clients[3], _clients("fedavg")[4][3]
    monkeypatch.setattr(kept.local, "release", lambda: None)  # the old behaviour: the model stays
    start = new_model(config, data.dataset.info).state_dict()
    later = {k: v + 0.01 if v.is_floating_point() else v for k, v in start.items()}
    for round, state in ((1, start), (2, later)):
        a, b = rebuilt.handle(_request(state, round)), kept.handle(_request(state, round))
        assert a.scalars == b.scalars
        for name, value in a.tensors("parameters").items():
            assert torch.equal(value, b.tensors("parameters")[name]), name
    assert kept.local.held and not rebuilt.local.held


def test_local_model_builds_on_use_and_records_specs():
    config = build_config(RunConfig(), SMALL, {})
    info = prepare_data(config).dataset.info
    local = LocalModel(config, info)
    specs = local.specs  # building records the specs, which outlive the model
    local.release()
    assert not local.held and local.specs is specs
    assert set(specs) == set(new_model(config, info).state_dict())


@pytest.mark.slow
def test_a_thousand_mnist_clients_run_a_fedavg_round_in_little_memory(shared_data, tmp_path):
    command = [sys.executable, "-m", "fedistill.cli", "run", "--quiet", "--algorithm", "fedavg",
               "--dataset", "mnist", "--data-dir", str(shared_data), "--model", "lenet5",
               "--clients", "1000", "--rounds", "1", "--out", str(tmp_path), "--name", "k1000",
               "--set", "threads=1", "--set", "fraction=0.1"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = process.stderr.read() if process.stderr else b""
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, stderr.decode()[-2000:]
    peak_mib = usage.ru_maxrss / 1024
    assert peak_mib < 1536, f"peak RSS {peak_mib:.0f} MiB at 1,000 clients"  # 4 GiB is the goal
    assert (tmp_path / "k1000" / "fedavg" / "summary.json").is_file()
