"""AsynDGAN on segmentation: a site's input-gradient is the true gradient of its GAN + lambda * L1 terms on
its own samples after its D-step, G's step assembles them into the gradient of the whole objective, the
ledger shows masks up once per site and never a parameter, S learns from G's pairs, and a resumed run
ends exactly as an uninterrupted one."""

import copy

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from algorithm_helpers import SMALL_LESIONS, check_resume_after_crash, make_client, run_recording
from conftest import SHARED_DATA
from fedistill import devices
from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.fediod import draws
from fedistill.algorithms.medical.asyndgan import AsynDGANServer
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared import site_shares
from fedistill.algorithms.shared.training import evaluate_model, new_model, task_of
from fedistill.config import RunConfig, build_config, options_for
from fedistill.data.transforms import to_float
from fedistill.engine.launch import run_suite
from fedistill.engine.rundir import read_jsonl
from fedistill.engine.setup import client_contexts, prepare_data, validate_setup
from fedistill.errors import ConfigError
from fedistill.federation.ledger import UP, Ledger, read_ledger
from fedistill.federation.messages import Message
from fedistill.models.perceptual import load_vgg16_features, vgg16_feature_shapes
from fedistill.models.pix2pix import one_hot_mask
from fedistill.seeding import torch_generator
from fedistill.transports.inprocess import InProcessFleet

SEGMENTATION = {
    **SMALL_LESIONS,
    "rounds": 2,
    "optimizer": "adam",
    "lr": 2e-3,
    "task": {"hd95": False},
    "asyndgan": {
        "iters_per_epoch": 2,
        "synthetic_batch_size": 4,
        "generator_width": 4,
        "generator_blocks": 1,
        "discriminator_width": 4,
        "discriminator_layers": 2,
        "segmenter_steps": 2,
    },
}


def _config(**changes) -> RunConfig:
    layer = copy.deepcopy(SEGMENTATION)
    layer["asyndgan"].update(changes.pop("asyndgan", {}))
    return build_config(RunConfig(), layer | changes, {"algorithm": "asyndgan"})


def _unit(x: torch.Tensor, info) -> torch.Tensor:
    return x * torch.tensor(info.std).view(1, -1, 1, 1) + torch.tensor(info.mean).view(1, -1, 1, 1)


def test_a_sites_input_gradient_is_autograd_of_its_gan_and_l1_terms_after_its_d_step():
    """Site 0 gets 3 synthetic images drawn from its masks 4, 0 and 2. By hand: one Adam step of D_k on
    BCE(D(m, real), 1) / 2 + BCE(D(m, x), 0) / 2, then d/dx [BCE(D'(m, x), 1) + 100 * mean |x - real|]
    with images in [-1, 1] (pix2pix's); the reply must be that gradient, and D_k the stepped copy."""
    config = _config()
    client = make_client(config, "asyndgan", 0)
    client.handle(Message.build("query.masks", scalars={"config": {"limit": 0}}))
    info = client.ctx.info
    pair = torch.tensor([4, 0, 2])
    masks = client.sent[pair]
    x = torch.randn(3, 1, 32, 32, generator=torch.Generator().manual_seed(1))
    request = Message.build(
        "query.adversarial",
        arrays={"synthetic-inputs": {"x": x, "pair": pair}, "label-masks": {"m": masks.to(torch.uint8)}},
        scalars={"config": {"step": 0, "lr_discriminator": 1e-3, "w_l1": 100.0}},
    )
    d = copy.deepcopy(client.discriminator)
    d_optimizer = torch.optim.Adam(d.parameters(), lr=1e-3, betas=(0.5, 0.999))
    reply = client.handle(request)

    real = to_float(client.ctx.train.x[client.uploaded[pair]], info)
    condition = F.one_hot(masks, 2).permute(0, 3, 1, 2).float()
    real_logits, fake_logits = d(condition, real), d(condition, x)
    d_loss = 0.5 * F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
    d_loss = d_loss + 0.5 * F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
    d_optimizer.zero_grad()
    d_loss.backward()
    d_optimizer.step()
    xg = x.clone().requires_grad_(True)
    logits = d(condition, xg)
    gan = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
    l1 = ((2 * _unit(xg, info) - 1) - (2 * _unit(real, info) - 1)).abs().mean()
    (want,) = torch.autograd.grad(gan + 100.0 * l1, xg)

    torch.testing.assert_close(reply.tensor("input-gradients", "x"), want, rtol=1e-5, atol=1e-7)
    for got, stepped in zip(client.discriminator.parameters(), d.parameters(), strict=True):
        torch.testing.assert_close(got, stepped)
    assert reply.scalar("metrics", "d_loss") == pytest.approx(d_loss.item(), rel=1e-5)
    assert set(reply.arrays) == {"input-gradients"}


def _parts(config: RunConfig):
    method = get_algorithm("asyndgan")
    options = options_for(config, "asyndgan", method.options)
    data = prepare_data(config)
    clients = {ctx.client_id: method.client(ctx) for ctx in client_contexts(config, method, options, data)}
    test, info = data.dataset.test, data.dataset.info
    task = task_of(config, info)
    server = AsynDGANServer(
        ServerContext(info, config, options, len(clients), lambda m: evaluate_model(m, test, info, task=task))
    )
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    return clients, server, fleet


def test_the_generator_step_is_the_gradient_of_every_sites_terms_weighted_by_pi():
    """G's gradient from the replies equals autograd through G of sum_k pi_k * site k's mean terms on its
    own samples against its D_k after that step's D-step: pi_k = n_k / n, not the site's share of the
    batch of 5 (2 and 3 samples, 0.4 and 0.6, where pi is 12/44 and 32/44)."""
    config = _config(asyndgan={"synthetic_batch_size": 5, "noise_channels": 1})
    clients, server, fleet = _parts(config)
    generator = copy.deepcopy(server.generator)
    step = server.step
    server.generator_step(fleet, 2e-4)
    got = [p.grad.clone() for p in server.generator.parameters()]

    rng = torch_generator(config.seed, "asyndgan-draw", step)
    owner = draws.owners(server._weights(), 5, torch_generator(config.seed, "site-shares", step))
    masks, pair = draws.from_uploads(server.pools, owner, rng)
    server.generator = generator  # the same draw, noise and dropout through the unstepped copy
    x = server._generate(masks, rng, "g-step", step)
    loss = torch.zeros(())
    for i, k in enumerate(sorted(clients)):
        client, mine = clients[k], owner == i
        real = to_float(client.ctx.train.x[client.uploaded[pair[mine]]], client.ctx.info)
        gan, l1, _ = client.generator_terms(x[mine], one_hot_mask(masks[mine], 2), real)
        loss = loss + float(server._weights()[i]) * (gan + 100.0 * l1)
    want = torch.autograd.grad(loss, list(generator.parameters()))
    assert torch.bincount(owner).tolist() == [2, 3]  # pi = (12, 32) / 44 of 5
    torch.testing.assert_close(server._weights(), torch.tensor([12.0, 32.0]) / 44)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)  # gradients up to ~5 here


def test_masks_go_up_once_per_site_then_only_input_gradients_and_metrics(tmp_path):
    summaries, seen = run_recording(_config(), tmp_path)
    summary = summaries["asyndgan"]
    up = summary["communication"][UP]["per_kind"]
    assert set(up) == {"label-masks", "input-gradients", "metrics"} and up.get("parameters", 0) == 0
    records = read_ledger(tmp_path / "asyndgan" / "ledger.jsonl")
    masks_up = [r["client"] for r in records if r["direction"] == UP and "label-masks" in r["kinds"]]
    assert sorted(masks_up) == [0, 1]  # once per site
    sent = [m for m in seen["asyndgan"] if m.direction == UP]
    assert {m.type for m in sent} == {"query.masks", "query.adversarial", "evaluate.segmenter"}
    steps = [m for m in sent if m.type == "query.adversarial"]
    assert len(steps) == 2 * 2 * 2 and all(m.arrays == {"input-gradients": {"x"}} for m in steps)
    down = [m for m in seen["asyndgan"] if m.direction != UP and "parameters" in m.arrays]
    assert {m.type for m in down} == {"evaluate.segmenter"}  # S comes down to be scored, never goes up
    assert summary["headline"] == "test_dice" and "test_dice" in summary["final"]
    assert (tmp_path / "asyndgan" / "plots" / "synthetic_epoch_0002.png").is_file()


def test_the_segmenter_learns_from_gs_pairs(tmp_path):
    """On the demo lesions, S trained on G's pairs only (selected on the sites' validation splits) beats an
    untrained S on the test set, and its loss on G's pairs falls."""
    config = _config(
        rounds=3,
        model_options={"width": 8, "depth": 2},
        asyndgan={"iters_per_epoch": 10, "segmenter_steps": 20, "generator_width": 8, "generator_blocks": 2},
    )
    summary = run_suite(config, tmp_path, progress=False)[0]
    losses = [r["loss_segmenter"] for r in read_jsonl(tmp_path / "asyndgan" / "metrics.jsonl")]
    assert losses[-1] < losses[0]
    data = prepare_data(config)
    task = task_of(config, data.dataset.info)
    untrained = evaluate_model(
        new_model(config, data.dataset.info), data.dataset.test, data.dataset.info, task=task
    )
    assert summary["final"]["test_dice"] > untrained["dice"] + 0.1


def test_a_resumed_run_ends_exactly_as_an_uninterrupted_one(tmp_path):
    check_resume_after_crash(_config(rounds=3), AsynDGANServer, tmp_path, crash_round=2)


def test_a_site_whose_reply_is_invalid_is_dropped_and_g_goes_on(tmp_path, monkeypatch):
    original = InProcessFleet.__init__

    def init(self, clients, ledger, **kwargs):
        original(self, clients, ledger, **kwargs)
        client = self._clients[1]
        honest = client.handle

        def handle(message: Message) -> Message:
            reply = honest(message)
            if reply.type != "query.adversarial":
                return reply
            grad = reply.tensor("input-gradients", "x")
            return Message.build(reply.type, {"input-gradients": {"x": grad[:, :, :-1]}}, reply.scalars)

        client.handle = handle

    monkeypatch.setattr(InProcessFleet, "__init__", init)
    summary = run_suite(_config(), tmp_path, progress=False)[0]
    assert (
        "invalid reply" in summary["dropped_clients"]["1"] and "expected" in summary["dropped_clients"]["1"]
    )
    invalid = [r for r in read_ledger(tmp_path / "asyndgan" / "ledger.jsonl") if r["status"] == "invalid"]
    assert {r["client"] for r in invalid} == {1} and "test_dice" in summary["final"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"w_l1": -1.0}, "asyndgan.w_l1"),
        ({"lr_generator": 0.0}, "asyndgan.lr_generator"),
        ({"beta1": 1.0}, "asyndgan.beta1"),
        ({"site_shares": "size"}, "asyndgan.site_shares"),
        ({"schedule": "cosine"}, "asyndgan.schedule"),
        ({"iters_per_epoch": "all"}, "asyndgan.iters_per_epoch"),
        ({"segmenter_start": 0}, "asyndgan.segmenter_start"),
        ({"generator_width": 0}, "asyndgan.generator_width"),
        ({"w_perceptual": 1.0}, "asyndgan.vgg16_weights"),
    ],
)
def test_bad_options_are_refused_naming_the_option(change, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        options_for(_config(asyndgan=change), "asyndgan", get_algorithm("asyndgan").options)


def test_impossible_settings_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match=r"synthetic_batch_size = 1 is below the number of sites \(2\)"):
        _parts(_config(asyndgan={"synthetic_batch_size": 1}))
    with pytest.raises(ConfigError, match=r"segmenter_start = 3 is after the last round \(rounds = 2\)"):
        _parts(_config(asyndgan={"segmenter_start": 3}))
    with pytest.raises(ConfigError, match="val_fraction > 0"):
        _parts(_config(val_fraction=0.0))
    with pytest.raises(ConfigError, match="asyndgan"):
        run_suite(build_config(RunConfig(), {"clients": 2, "rounds": 1}, {"algorithm": "asyndgan"}), tmp_path)


def test_on_nuclei_g_is_conditioned_on_the_three_pixel_classes_s_learns():
    """Instance segmentation: a site uploads background / inside / contour maps (S's targets, which keep
    touching nuclei apart), so G and every D_k take three condition channels."""
    if not (SHARED_DATA / "nuclei" / "fluorescence_instances.tif").is_file():
        pytest.skip(f"nuclei files not found under {SHARED_DATA}")
    config = _config(
        dataset="nuclei-synthetic-sites",
        data_dir=str(SHARED_DATA),
        val_fraction=0.3,
        clients=3,
        **{
            "nuclei-synthetic-sites": {
                "image_size": 64,
                "patch_size": 32,
                "train_images": 2,
                "test_images": 1,
            }
        },
        asyndgan={"synthetic_batch_size": 3},
    )
    clients, server, fleet = _parts(config)
    assert server.generator.condition_channels == 3 and clients[0].discriminator.condition_channels == 3
    pool = server.pools[0]
    assert set(pool.unique().tolist()) == {0, 1, 2}
    client = clients[0]
    targets = task_of(config, client.ctx.info).pixel_targets(client.ctx.train.y[client.uploaded])
    assert torch.equal(pool, targets)
    server.generator_step(fleet, 2e-4)
    assert server.train_segmenter(1) > 0


def test_the_released_codes_perceptual_term_adds_its_own_gradient(tmp_path):
    """With `w_perceptual` on, a site's reply gains w * d/dx of the mean over relu1_2..relu4_3 of the
    feature MSE between G's image and the real one (both in [0, 1]), on VGG-16 weights the site holds."""
    gen = torch.Generator().manual_seed(0)
    weights = {k: 0.05 * torch.randn(s, generator=gen) for k, s in vgg16_feature_shapes().items()}
    save_file(weights, tmp_path / "vgg16.safetensors")
    replies = []
    for w in (0.0, 0.5):
        options = {"w_perceptual": w, "vgg16_weights": str(tmp_path / "vgg16.safetensors")}
        client = make_client(_config(asyndgan=options), "asyndgan", 1)
        client.handle(Message.build("query.masks", scalars={"config": {"limit": 0}}))
        pair = torch.tensor([3, 1])
        x = torch.randn(2, 1, 32, 32, generator=torch.Generator().manual_seed(2))
        settings = {"step": 0, "lr_discriminator": 1e-3, "w_l1": 100.0, "w_perceptual": w}
        arrays = {
            "synthetic-inputs": {"x": x, "pair": pair},
            "label-masks": {"m": client.sent[pair].to(torch.uint8)},
        }
        reply = client.handle(Message.build("query.adversarial", arrays=arrays, scalars={"config": settings}))
        replies.append(reply.tensor("input-gradients", "x"))
    info = client.ctx.info
    vgg = load_vgg16_features(tmp_path / "vgg16.safetensors")
    real = _unit(to_float(client.ctx.train.x[client.uploaded[pair]], info), info)
    xg = x.clone().requires_grad_(True)
    terms = [F.mse_loss(a, b) for a, b in zip(vgg(_unit(xg, info)), vgg(real), strict=True)]
    (want,) = torch.autograd.grad(0.5 * torch.stack(terms).mean(), xg)
    torch.testing.assert_close(replies[1] - replies[0], want, rtol=1e-3, atol=1e-6)


def test_the_perceptual_features_live_on_the_run_device(tmp_path, monkeypatch):
    """The VGG-16 features a site loads on first use move to the run's device, where G's images and D_k
    are: they stayed on the CPU, so a GPU run with `w_perceptual` stopped at its first G-step. `meta`
    stands in for the card."""
    weights = {k: torch.zeros(s) for k, s in vgg16_feature_shapes().items()}
    save_file(weights, tmp_path / "vgg16.safetensors")
    options = {"w_perceptual": 0.5, "vgg16_weights": str(tmp_path / "vgg16.safetensors")}
    client = make_client(_config(asyndgan=options), "asyndgan", 0)
    monkeypatch.setattr(devices, "_current", torch.device("meta"))
    client.discriminator.to("meta")
    x, real = torch.zeros(2, 1, 32, 32, device="meta"), torch.zeros(2, 1, 32, 32, device="meta")
    condition = torch.zeros(2, client.classes, 32, 32, device="meta")
    *_, perceptual = client.generator_terms(x, condition, real)
    assert perceptual.device.type == "meta"


def test_masks_read_back_from_a_checkpoint_go_to_the_runs_device(monkeypatch):
    """A checkpoint reads back on the CPU; the uploaded masks stayed there, so a run resumed on a GPU fed
    G a condition on the CPU at its first G-step. `meta` stands in for the card."""
    _, server, _ = _parts(_config())
    state = server.state_dict()
    monkeypatch.setattr(devices, "_current", torch.device("meta"))
    server.load_state_dict(state)
    assert [pool.device.type for pool in server.pools] == ["meta", "meta"]


def test_the_segmenters_masks_are_drawn_uniformly_over_every_upload():
    """S's pairs: every uploaded mask equally likely, so a site's share of the draws is its share of the
    uploads (a small site is not over-drawn by a minimum per site)."""
    pools = [torch.zeros(1000, 2, 2, dtype=torch.int64), torch.ones(10, 2, 2, dtype=torch.int64)]
    pools[0][:, 0, 0] = torch.arange(1000)
    masks = site_shares.uniform_over_uploads(pools, 20000, torch.Generator().manual_seed(0))
    small = masks[:, 1, 1] == 1
    assert masks.shape == (20000, 2, 2) and masks.dtype == torch.int64
    assert abs(float(small.float().mean()) - 10 / 1010) < 0.004  # ~198 draws; a per-site minimum gives more
    drawn = torch.bincount(masks[~small][:, 0, 0], minlength=1000)
    assert int(drawn.min()) > 0 and int(drawn.max()) < 60  # about 19.8 each


def test_a_batch_smaller_than_the_sites_still_draws_every_site_in_proportion():
    """Two samples for four sites: with a generator the leftover slots are drawn, so each site's mean count
    is its quota pi_k x 2 (before, and still without one, the two largest fractional parts won every
    time and two sites' masks were never drawn); a batch that the minimum of one each fills is unchanged."""
    pi = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rng = torch.Generator().manual_seed(0)
    draws = torch.stack([site_shares.shares(pi, 2, rng) for _ in range(4000)])
    assert int(draws.sum(1).min()) == int(draws.sum(1).max()) == 2 and int(draws.max()) == 1
    assert torch.allclose(draws.double().mean(0), pi.double() * 2, atol=0.03)
    assert torch.equal(site_shares.shares(pi, 2), torch.tensor([0, 0, 1, 1]))
    uniform = torch.full((10,), 0.1)
    assert torch.equal(site_shares.shares(uniform, 10, rng), torch.ones(10, dtype=torch.int64))
    assert torch.equal(
        site_shares.owners(pi, 7, rng).bincount(minlength=4).clamp(max=1), torch.ones(4).long()
    )


def test_the_linear_schedule_is_pix2pixs_constant_half_then_a_linear_fall():
    """pix2pix's linear policy over the rounds: 1 for the first ceil(R / 2) rounds, then 1 - j / (R // 2 + 1)
    in the j-th of the other R // 2, so the last round still learns (1 / (R // 2 + 1)); `constant` is 1."""
    from fedistill.algorithms.medical.asyndgan.options import lr_factor

    assert [lr_factor("linear", r, 4) for r in range(1, 5)] == pytest.approx([1, 1, 2 / 3, 1 / 3])
    assert [lr_factor("linear", r, 5) for r in range(1, 6)] == pytest.approx([1, 1, 1, 2 / 3, 1 / 3])
    assert lr_factor("linear", 200, 200) == pytest.approx(1 / 101)  # niter = niter_decay = 100
    assert lr_factor("linear", 1, 1) == 1.0
    assert [lr_factor("constant", r, 4) for r in range(1, 5)] == [1.0] * 4


def test_a_synthetic_batch_smaller_than_the_federation_is_refused_before_the_run_folder():
    """Every G-step draws a mask per site: the run's setup says so, before it writes anything."""
    below = r"^asyndgan\.synthetic_batch_size = 1 is below the number of sites \(2\)"
    with pytest.raises(ConfigError, match=below):
        validate_setup(_config(asyndgan={"synthetic_batch_size": 1}))
