"""`fediod.sites_together`: in-process sites that answer a G-step in one batched call give each site the
messages, state and ledger rows it would have alone, up to float rounding."""

import copy

import pytest
import torch

from algorithm_helpers import TINY_FEDIOD, fediod_parts
from fedistill.algorithms.fediod import FedIODClient
from fedistill.config import RunConfig, build_config
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import Message
from fedistill.transports.inprocess import InProcessFleet

# the stable preset on a BatchNorm teacher: batch-norm matching, S-step inputs riding along, Eq. 8 ratios;
# full-precision messages: 8-bit synthetic images would turn a last-bit difference of G into a whole
# quantisation step of an input pixel, which no float tolerance on the next step's answers can bound
STABLE = {"preset": "stable", "w_bn": 10.0, "ensemble_weighting": "eq8", "pool_steps": 2, "wire": "float32"}


def _parts(together: bool, model: str = "small-cnn", **fediod):
    layer = copy.deepcopy(TINY_FEDIOD)
    layer["model"] = model
    layer["fediod"] |= STABLE | fediod | {"sites_together": together}
    clients, server, _ = fediod_parts(build_config(RunConfig(), layer, {"algorithm": "fediod"}))
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    return clients, server, fleet


def _recorded(clients):
    """Every reply each site gives, in order, by wrapping its handlers."""
    replies: dict[int, list[Message]] = {cid: [] for cid in clients}
    for cid, client in clients.items():
        for name in ("generate", "backprop"):
            handler = getattr(client, name)

            def wrapped(message, handler=handler, cid=cid):
                reply = handler(message)
                replies[cid].append(reply)
                return reply

            setattr(client, name, wrapped)
    return replies


def _spy_together(monkeypatch):
    calls = []
    original = FedIODClient.handle_together.__func__

    def spy(cls, clients, messages):
        answers = original(cls, clients, messages)
        calls.append((messages[0].type, len(clients)))
        for client, answer in zip(clients, answers, strict=True):  # the same record as alone
            client.answered.append(answer)
        return answers

    monkeypatch.setattr(FedIODClient, "handle_together", classmethod(spy))
    return calls


def _start_from(server, clients, other_server, other_clients) -> None:
    """Give the other run this run's server and sites, so that a step is compared from the same start.

    Why: G's Adam moves a weight by up to its learning rate whatever the gradient's size, so a last-bit
    difference in one step's near-zero gradient becomes a visible change of G's samples in the next; how
    large depends on the CPU's kernels. Each step must still match step by step."""
    other_server.load_state_dict(copy.deepcopy(server.state_dict()))
    for cid, client in clients.items():
        other_clients[cid].load_state_dict(copy.deepcopy(client.state_dict()))


# small-cnn: BatchNorm teachers; lenet5: none (no batch-norm term); resnet8: residual blocks
@pytest.mark.parametrize("model", ["small-cnn", "lenet5", "resnet8"])
def test_sites_answering_together_send_what_they_would_alone(monkeypatch, model):
    alone_clients, alone_server, alone_fleet = _parts(False, model)
    together_clients, together_server, together_fleet = _parts(True, model)
    alone = _recorded(alone_clients)
    for client in together_clients.values():
        client.answered = []
    calls = _spy_together(monkeypatch)
    for step in range(3):  # the second and third steps carry the previous step's S-step inputs
        if step:
            _start_from(alone_server, alone_clients, together_server, together_clients)
        alone_server.distillation_step(alone_fleet)
        together_server.distillation_step(together_fleet)
    assert ("query.generate", 3) in calls and ("query.backprop", 3) in calls
    for cid, client in together_clients.items():
        assert [m.type for m in client.answered] == [m.type for m in alone[cid]]
        for ours, theirs in zip(client.answered, alone[cid], strict=True):
            assert ours.arrays.keys() == theirs.arrays.keys()
            for kind, named in theirs.arrays.items():
                assert named.keys() == ours.arrays[kind].keys()
                for name in named:
                    a, b = ours.tensor(kind, name), theirs.tensor(kind, name)
                    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-3, atol=1e-4), (kind, name)
            for name, value in theirs.scalars.get("metrics", {}).items():
                assert ours.scalar("metrics", name) == pytest.approx(value, rel=1e-4, abs=1e-5)
        mine, its = client.state_dict(), alone_clients[cid].state_dict()
        assert client.real_mean == pytest.approx(its["real_mean"], rel=1e-5)
        for name, value in its["discriminator"].items():  # D_k's weights and running statistics
            assert torch.allclose(mine["discriminator"][name].float(), value.float(), rtol=1e-4, atol=1e-5), (
                name
            )
    assert alone_fleet.ledger.totals.summary() == together_fleet.ledger.totals.summary()
    assert alone_fleet.ledger._pending == together_fleet.ledger._pending  # every record, in order
    # G's weights after the last step, taken from the same start: Adam moves each by up to about its
    # learning rate, however small the gradient, so where a gradient is near 0 a rounding-level difference
    # may move a weight by that much, either way; the bulk of the weights must agree to rounding
    pairs = zip(alone_server.generator.parameters(), together_server.generator.parameters(), strict=True)
    gaps = torch.cat([(a - b).detach().abs().flatten() for a, b in pairs])
    assert float(gaps.max()) <= 3 * alone_server.options.lr_generator
    assert float(gaps.mean()) < 1e-5


def test_a_site_asked_alone_after_answering_together_gets_its_own_gradient():
    clients, server, fleet = _parts(True)
    server.distillation_step(fleet)  # leaves nothing pending
    sites = list(clients.values())
    request = Message.build(
        "query.generate",
        arrays={"synthetic-inputs": {"x": torch.rand(16, 1, 8, 8)}},
        scalars={
            "config": {
                "want_ratio": False,
                "step": 5,
                "lr_discriminator": 1e-4,
                "c_gan": 0.3,
                "c_conf": 0.3,
                "tau": 3.0,
                "gan_loss": "non-saturating",
                "c_bn": 3.0,
            }
        },
    )
    FedIODClient.handle_together(sites, [request] * len(sites))
    g = torch.randn(16, 10)
    back = Message.build("query.backprop", arrays={"output-gradients": {"z": g}})
    first = sites[0].handle(back)  # alone: the shared graph stays for the others
    rest = FedIODClient.handle_together(sites[1:], [back] * (len(sites) - 1))
    assert first.tensor("input-gradients", "x").shape == (16, 1, 8, 8)
    assert all(site.pending is None for site in sites) and len(rest) == len(sites) - 1


def test_sites_together_stays_off_where_it_does_not_apply():
    clients, _, _ = _parts(True, dp_enabled=True, dp_noise_multiplier=1.0)
    message = Message.build("query.generate", arrays={"synthetic-inputs": {"x": torch.rand(16, 1, 8, 8)}})
    assert all(client.together_key(message) is None for client in clients.values())
    clients, _, _ = _parts(False)
    assert all(client.together_key(message) is None for client in clients.values())
