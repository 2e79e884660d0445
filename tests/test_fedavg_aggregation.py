"""FedAvg's server update on hand-computed cases: the sample-weighted mean of what the clients send
(batch-norm statistics included), FedAvgM's momentum on the pseudo-gradient (Hsu et al. 2019), and
FedProx's proximal term."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.classic.fedavg import FedAvgServer
from fedistill.algorithms.classic.fedavg_options import FedAvgMOptions, FedAvgOptions
from fedistill.algorithms.shared.training import LocalTraining, new_model, train_local
from fedistill.cli import main
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.engine.setup import validate_setup
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import Message
from fedistill.transports.inprocess import InProcessFleet

DIGITS = DatasetInfo("digits", 1, 8, 10, (0.5,), (0.25,))
#: lenet-fedmdcg has BatchNorm: its running statistics and batch counters travel with the weights
CONFIG = build_config(RunConfig(), {"clients": 3, "model": "lenet-fedmdcg", "eval_every": 100}, {})


class FixedClient(ClientLogic):
    """Answers `train` with every floating-point entry of the state set to `value` (batch counters to
    `batches`) and `samples` as its sample count."""

    def __init__(self, value: float, samples: int, batches: int) -> None:
        self.value, self.samples, self.batches = value, samples, batches

    @handles("train")
    def train(self, message: Message) -> Message:
        state = {
            k: torch.full_like(v, self.value) if v.is_floating_point() else torch.full_like(v, self.batches)
            for k, v in message.tensors("parameters").items()
        }
        metrics = {"num_samples": self.samples, "train_loss": 0.0, "steps": 1}
        return Message.build("train", arrays={"parameters": state}, scalars={"metrics": metrics})


def server_after(options: FedAvgOptions, rounds: int) -> FedAvgServer:
    """A FedAvg server after `rounds` rounds with three clients sending 1, 4 and -2 of 1, 2 and 5 samples."""
    clients = {0: FixedClient(1.0, 1, 10), 1: FixedClient(4.0, 2, 20), 2: FixedClient(-2.0, 5, 50)}
    server = FedAvgServer(ServerContext(DIGITS, CONFIG, options, 3, lambda m: {}))
    fleet = InProcessFleet(clients, Ledger(None))
    for round in range(1, rounds + 1):
        server.run_round(fleet, round)
    return server


def floats(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if v.is_floating_point()}


def test_fedavg_weights_each_client_by_its_samples_batch_norm_statistics_included():
    server = server_after(FedAvgOptions(plausibility_checks=False), rounds=1)
    state = server.model.state_dict()
    assert any(k.endswith("running_var") for k in state)
    for name, value in floats(server.model).items():  # (1·1 + 2·4 + 5·(-2)) / 8
        torch.testing.assert_close(value, torch.full_like(value, -1 / 8), msg=name)
    counters = [v for k, v in state.items() if k.endswith("num_batches_tracked")]
    assert counters and all(int(c) == 10 for c in counters)  # the first client's, not averaged


def test_uniform_weighting_ignores_the_sample_counts():
    server = server_after(FedAvgOptions(weighting="uniform", plausibility_checks=False), rounds=1)
    for name, value in floats(server.model).items():  # (1 + 4 - 2) / 3
        torch.testing.assert_close(value, torch.full_like(value, 1.0), msg=name)


def test_fedavgm_steps_along_the_averaged_update_with_momentum():
    """v = beta v + (avg - w), w = w + lr v, on the parameters; running statistics are replaced by
    their average. With w0 the initial weights, avg = -1/8, beta = 0.5, lr = 2:
    round 1: v1 = avg - w0, w1 = w0 + 2 v1 = 2 avg - w0;
    round 2: v2 = 0.5 v1 + (avg - w1) = 0.5 (avg - w0) - avg + w0 = 0.5 (w0 - avg),
             w2 = w1 + 2 v2 = 2 avg - w0 + w0 - avg = avg."""
    options = FedAvgMOptions(server_momentum=0.5, server_lr=2.0, plausibility_checks=False)
    w0 = dict(new_model(CONFIG, DIGITS).named_parameters())
    avg = -1 / 8
    one = server_after(options, rounds=1)
    for name, value in one.model.named_parameters():
        torch.testing.assert_close(value.detach(), 2 * avg - w0[name].detach(), msg=name)
    for name, value in one.model.named_buffers():
        if value.is_floating_point():
            torch.testing.assert_close(value, torch.full_like(value, avg), msg=name)
    two = server_after(options, rounds=2)
    for name, value in two.model.named_parameters():
        torch.testing.assert_close(value.detach(), torch.full_like(value, avg), msg=name)
        torch.testing.assert_close(two.momentum[name], 0.5 * (w0[name].detach() - avg), msg=name)


@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_fedprox_adds_mu_times_the_distance_to_the_received_weights_to_the_gradient(mu):
    """Two SGD steps (lr 0.1) of a bias-only model whose data loss has zero gradient (constant input
    0 -> logits = bias, uniform labels over a balanced batch keep the cross-entropy gradient at
    softmax(b) - 1/C): the proximal term mu/2 ||w - w0||^2 adds mu (w - w0), which is 0 at the first step
    and pulls back at the second."""
    model = nn.Linear(1, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(torch.tensor([1.0, -1.0]))
    data = ImageSet(torch.zeros(2, 1, 1, 1, dtype=torch.uint8), torch.tensor([0, 1]))
    info = DatasetInfo("two", 1, 1, 2, (0.0,), (1.0,))
    flat = nn.Sequential(nn.Flatten(1), model)
    spec = LocalTraining(
        epochs=0,
        steps=2,
        batch_size=2,
        optimizer="sgd",
        lr=0.1,
        momentum=0.0,
        weight_decay=0.0,
        augment=False,
    )
    train_local(flat, data, info, spec, torch.Generator().manual_seed(0), prox_mu=mu)
    b0 = torch.tensor([1.0, -1.0])
    b = b0.clone()
    for _ in range(2):
        grad = torch.softmax(b, 0) - 0.5 + mu * (b - b0)
        b = b - 0.1 * grad
    torch.testing.assert_close(model.bias.detach(), b)


@pytest.mark.parametrize("key", ["mu", "server_lr"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_proximal_weight_or_server_rate_that_is_not_a_finite_number_is_refused(key, value):
    """NaN passed `mu < 0` and `server_lr <= 0` alike, and only showed later as a diverged run."""
    with pytest.raises(ConfigError, match=rf"^fedavgm\.{key} must be .*finite, got {value}"):
        FedAvgMOptions(**{key: value}).validate()


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedavgm"])
def test_drop_worst_without_a_validation_split_is_refused_before_the_run_folder(tmp_path, capsys, name):
    argv = ["run", "--algorithm", name, "--clients", "2", "--rounds", "1", "--quiet", "--out", str(tmp_path)]
    config = tmp_path / "run.toml"
    config.write_text(f"val_fraction = 0.0\n[{name}]\ndrop_worst = true\n", encoding="utf-8")
    assert main([*argv, "--config", str(config), "--name", "a"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    why = "needs the server's validation split: set val_fraction > 0"
    assert err == [f"fedistill: error: {name}.drop_worst {why}"]
    assert not (tmp_path / "a").exists()


def test_drop_worst_on_a_per_pixel_task_is_refused_before_the_run_folder():
    config = build_config(
        RunConfig(),
        {
            "algorithm": "flmrcm",
            "dataset": "mni152-t1",
            "mni152-t1": {"image_size": 32, "sites": 2},
            "model": "unet-fastmri",
            "partition": "natural",
            "clients": 2,
            "flmrcm": {"drop_worst": True},
        },
    )
    with pytest.raises(ConfigError, match=r"^flmrcm\.drop_worst ranks models by validation accuracy"):
        validate_setup(config)
