"""FL-MRCM: the source site's alignment step on a hand-computed case and in the code's order (D's step,
then the net's against the updated D); only the target site sends latent features and every site sends
parameters; an invalid feature reply stops the round with the target named; a crashed run resumes
exactly (the discriminators' state included); and clear errors for impossible settings."""

import copy
import math

import numpy as np
import pytest
import torch

from algorithm_helpers import check_resume_after_crash, make_client
from fedistill.algorithms.medical.flmrcm import FLMRCMClient, FLMRCMServer
from fedistill.algorithms.medical.flmrcm_alignment import (
    FeatureDiscriminator,
    alignment_loss,
    discriminator_loss,
    latent_size,
    latent_vectors,
    source_step,
)
from fedistill.algorithms.shared.training import new_model
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo
from fedistill.engine.launch import run_suite
from fedistill.engine.setup import validate_setup
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.ledger import DOWN, UP, read_ledger
from fedistill.federation.messages import Message
from fedistill.models.fastmri_unet import FastMRIUnet
from fedistill.tasks.reconstruction import Reconstruction

TINY = {
    "dataset": "mni152-t1",
    "mni152-t1": {"image_size": 32, "sites": 3},
    "model": "unet-fastmri",
    "model_options": {"chans": 4, "num_pool_layers": 2},
    "partition": "natural",
    "clients": 3,
    "rounds": 2,
    "batch_size": 8,
    "local_steps": 2,
    "optimizer": "adam",
    "lr": 2e-3,
    "flmrcm": {"feature_batches": 2, "discriminator_width": 8},
}


def _config(**changes) -> RunConfig:
    return build_config(RunConfig(), copy.deepcopy(TINY), {"algorithm": "flmrcm", **changes})


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _hand_made_discriminator() -> FeatureDiscriminator:
    """dim 2, width 1: h = leaky(z_0); logits = leaky((h, -h))."""
    d = FeatureDiscriminator(2, 1)
    with torch.no_grad():
        d.fc1.weight.copy_(torch.tensor([[1.0, 0.0]]))
        d.fc1.bias.zero_()
        d.fc2.weight.copy_(torch.tensor([[1.0], [-1.0]]))
        d.fc2.bias.zero_()
    return d


def test_alignment_and_discriminator_losses_on_a_hand_computed_case():
    d = _hand_made_discriminator()
    z_s = torch.tensor([[2.0, 5.0]], requires_grad=True)  # h = 2, logits (2, -0.4)
    z_t = torch.tensor([[-1.0, 3.0]])  # h = -0.2, logits (-0.04, 0.2)
    assert torch.allclose(d(z_s), torch.tensor([[2.0, -0.4]])) and torch.allclose(
        d(z_t), torch.tensor([[-0.04, 0.2]])
    )
    # BCE(l, 1) = softplus(-l), BCE(l, 0) = softplus(l); each domain term is the mean over both logits
    adv = alignment_loss(d, z_s, z_t)  # source coded (1, 0), target (0, 1)
    expected = 0.5 * (0.5 * (_softplus(-2) + _softplus(-0.4)) + 0.5 * (_softplus(-0.04) + _softplus(-0.2)))
    assert adv.item() == pytest.approx(expected, rel=1e-6)
    d_loss = discriminator_loss(d, z_s, z_t)  # the codes swapped
    expected_d = 0.5 * (0.5 * (_softplus(2) + _softplus(0.4)) + 0.5 * (_softplus(0.04) + _softplus(0.2)))
    assert d_loss.item() == pytest.approx(expected_d, rel=1e-6)
    # d L_adv / d z_s = 1/4 (-sigmoid(-l1) dl1/dh + sigmoid(l2) dl2/dh) dh/dz, dl1/dh = 1, dl2/dh = -0.2
    (grad,) = torch.autograd.grad(adv, z_s)
    by_hand = 0.25 * (-_sigmoid(-2) + _sigmoid(-0.4) * -0.2)
    assert torch.allclose(grad, torch.tensor([[by_hand, 0.0]]), atol=1e-7)
    assert by_hand < 0  # the step raises h: the source's logits move towards what D gives the target


def test_source_step_trains_d_first_then_the_net_against_the_updated_d():
    torch.manual_seed(0)
    task = Reconstruction()
    net = FastMRIUnet(1, 1, chans=2, num_pool_layers=1)
    x, y = torch.rand(2, 1, 8, 8), torch.rand(2, 1, 8, 8)
    z_t = torch.randn(3, 16)  # bottleneck 4 channels, pooled 2×2
    d = FeatureDiscriminator(16, 3)
    net_ref, d_ref, lr, weight = copy.deepcopy(net), copy.deepcopy(d), 0.1, 0.7

    with net_ref.bottleneck_features() as captured:
        outputs = task.corrected(x, net_ref(x))  # the task's residual and output scale
    z_s = latent_vectors(captured[-1])
    d_grads = torch.autograd.grad(discriminator_loss(d_ref, z_s.detach(), z_t), list(d_ref.parameters()))
    with torch.no_grad():
        for p, g in zip(d_ref.parameters(), d_grads, strict=True):
            p -= lr * g
    total = task.loss(outputs, y) + weight * alignment_loss(d_ref, z_s, z_t)
    net_grads = torch.autograd.grad(total, list(net_ref.parameters()))

    before = [p.detach().clone() for p in net.parameters()]
    sgd, d_sgd = torch.optim.SGD(net.parameters(), lr=lr), torch.optim.SGD(d.parameters(), lr=lr)
    losses = source_step(net, d, sgd, d_sgd, task, x, y, z_t, weight)
    for p, q in zip(d.parameters(), d_ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-7)
    for p, p0, g in zip(net.parameters(), before, net_grads, strict=True):
        assert torch.allclose(p, p0 - lr * g, atol=1e-6)
    assert losses.alignment == pytest.approx(alignment_loss(d_ref, z_s, z_t).item(), rel=1e-5)
    assert all(p.requires_grad for p in d.parameters())  # frozen only for the net's step


def test_only_the_target_sends_latent_features_and_every_site_its_parameters(tmp_path):
    summary = run_suite(_config(), tmp_path, progress=False)[0]
    assert {"test_ssim", "test_psnr"} <= set(summary["final"]) and summary["headline"] == "test_ssim"
    assert 0 < summary["final"]["test_ssim"] <= 1
    records = read_ledger(tmp_path / "flmrcm" / "ledger.jsonl")
    target, sources = 2, {0, 1}  # target_site = -1: the last client

    def clients(direction: str, kind: str) -> set[int]:
        return {r["client"] for r in records if r["direction"] == direction and kind in r["kinds"]}

    assert clients(UP, "latent-features") == {target}
    assert clients(DOWN, "latent-features") == sources
    assert clients(UP, "parameters") == {0, 1, 2}
    assert {r["client"] for r in records if r["type"] == "query.latent_features"} == {target}
    up = {kind for r in records if r["direction"] == UP for kind in r["kinds"]}
    assert up == {"parameters", "latent-features", "metrics"}
    per_round = [
        r["kinds"]["latent-features"]
        for r in records
        if r["direction"] == UP and "latent-features" in r["kinds"]
    ]
    assert per_round == [2 * 8 * 64 * 4] * 2  # 2 batches of 8 vectors of 4 · 16 float32, each round


def test_sites_hold_no_model_outside_their_own_work():
    """A site holds its U-Net only while it trains (FedAvg's rule, so an unsampled source costs no memory):
    building the federation and answering the feature query left every site holding one."""
    config = _config()
    source, target = make_client(config, "flmrcm", 0), make_client(config, "flmrcm", 2)
    assert not source.local.held and not target.local.held
    state = new_model(config, target.ctx.info).state_dict()
    query = Message.build(
        "query.latent_features", arrays={"parameters": state}, scalars={"config": {"round": 1, "batches": 1}}
    )
    rows = target.handle(query).array("latent-features", "features")
    assert rows.shape == (8, 64) and not target.local.held


def test_the_latent_size_probe_runs_on_the_models_device():
    """The blank image that sizes the latent vectors goes where the model is: it was made on the CPU, so
    on a GPU every site and the server stopped while being built. `meta` stands in for the card."""
    net = FastMRIUnet(1, 1, chans=4, num_pool_layers=2).to("meta")
    seen = []
    net.register_forward_pre_hook(lambda _module, inputs: seen.append(inputs[0].device.type))
    info = DatasetInfo("slices", 1, 32, 2, (0.0,), (1.0,), task="reconstruction")
    assert latent_size(net, info) == 4 * 4 * 4  # the bottleneck's 16 channels pooled to 2 x 2
    assert seen == ["meta"]


def test_an_invalid_feature_reply_stops_the_round_naming_the_target(tmp_path, monkeypatch):
    honest = FLMRCMClient.latent_features

    def wrong_width(self, message: Message) -> Message:
        rows = honest(self, message).array("latent-features", "features")
        return Message.build(
            message.type, arrays={"latent-features": {"features": np.zeros((len(rows), 3), np.float32)}}
        )

    monkeypatch.setattr(FLMRCMClient, "latent_features", wrong_width)
    with pytest.raises(FederationError, match=r"latent features \(target site 0\).*invalid reply"):
        run_suite(_config(flmrcm={"target_site": 0, "feature_batches": 1}), tmp_path, progress=False)


def test_a_crashed_run_resumes_exactly(tmp_path):
    config = _config(flmrcm={"target_site": 0, "feature_batches": 1, "discriminator_width": 8})
    check_resume_after_crash(config, FLMRCMServer, tmp_path, crash_round=2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"flmrcm": {"target_site": 3}}, "target_site = 3 names no client"),
        ({"flmrcm": {"target_site": -2}}, "target_site must be a client index or -1"),
        ({"flmrcm": {"dp_enabled": True, "dp_noise_multiplier": 1.0}}, "latent features would leave"),
        ({"flmrcm": {"adversarial_weight": -1.0}}, "adversarial_weight must be a finite number >= 0"),
        ({"flmrcm": {"feature_batches": -1}}, "feature_batches must be >= 0"),
        ({"clients": 1, "partition": "iid"}, "at least one source site"),
    ],
)
def test_impossible_settings_fail_with_a_clear_message(changes, message):
    with pytest.raises(ConfigError, match=message):
        make_client(_config(**changes), "flmrcm")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"flmrcm": {"target_site": 3}}, r"^flmrcm\.target_site = 3 names no client: there are 3"),
        ({"clients": 1, "partition": "iid"}, r"^flmrcm needs a target site and at least one source site"),
    ],
)
def test_a_target_the_federation_lacks_is_refused_before_the_run_folder(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate_setup(_config(**changes))
