"""FedIOD beyond classification: segmentation (G conditioned on label masks, per-pixel logits) and MRI
reconstruction (G conditioned on foreground masks, teachers on undersampled images). Nothing but what the
ledger names crosses the boundary, no parameter ever leaves a client, the gradient G assembles from the
replies is the true one, and Eq. 8's per-pixel weights match a hand-computed case."""

import copy
import json
import logging

import pytest
import torch

from algorithm_helpers import SMALL_LESIONS, fediod_parts
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod import wire as wire_module
from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo
from fedistill.data.transforms import to_float
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError
from fedistill.federation.ledger import DOWN, UP, Ledger, read_ledger
from fedistill.models.perceptual import PerceptualLoss, encoder_features
from fedistill.seeding import torch_generator
from fedistill.tasks import InstanceSegmentation, SemanticSegmentation
from fedistill.transports.inprocess import InProcessFleet

SEGMENTATION = {
    **SMALL_LESIONS,
    "rounds": 2,
    "optimizer": "adam",
    "lr": 2e-3,
    "task": {"hd95": False},
    "fediod": {
        "teacher_epochs": 1,
        "iters_per_epoch": 2,
        "synthetic_batch_size": 4,
        "student_steps": 1,
        "generator_width": 4,
        "generator_blocks": 1,
        "noise_channels": 1,
        "discriminator_width": 4,
        "discriminator_layers": 2,
    },
}
RECONSTRUCTION = {
    **SEGMENTATION,
    "dataset": "mni152-t1",
    "mni152-t1": {"image_size": 32, "sites": 2},
    "model": "unet-fastmri",
    "model_options": {"chans": 4, "num_pool_layers": 2},
    "task": {},
}
del RECONSTRUCTION["mni152-synthetic-lesions"]


def _config(base: dict, **fediod) -> RunConfig:
    layer = copy.deepcopy(base)
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


@pytest.mark.parametrize(
    ("base", "source", "masks_up"),
    [(SEGMENTATION, "clients", True), (SEGMENTATION, "prior", False), (RECONSTRUCTION, "clients", True)],
    ids=["segmentation-client-masks", "segmentation-prior-masks", "reconstruction"],
)
def test_no_parameter_leaves_a_client_and_masks_travel_only_when_uploaded(tmp_path, base, source, masks_up):
    summary = run_suite(_config(base, mask_source=source), tmp_path / "s", progress=False)[0]
    up = summary["communication"][UP]["per_kind"]
    assert up.get("parameters", 0) == 0
    assert ("label-masks" in up) == masks_up
    records = read_ledger(tmp_path / "s" / "fediod" / "ledger.jsonl")
    sent = {kind for r in records if r["direction"] == UP for kind in r["kinds"]}
    assert sent <= {
        "logits",
        "discriminator-outputs",
        "input-gradients",
        "metrics",
        "label-statistics",
        "label-masks",
    }
    headline = "test_ssim" if base is RECONSTRUCTION else "test_dice"
    assert summary["headline"] == headline and headline in summary["final"]
    ensemble = summary["final"][f"ensemble_{headline.removeprefix('test_')}"]
    assert ("fraction_of_ensemble" in summary["final"]) == (ensemble > 0)


@pytest.mark.parametrize("base", [SEGMENTATION, RECONSTRUCTION], ids=["segmentation", "reconstruction"])
def test_the_default_on_dense_tasks_is_lean_the_sites_label_only_the_generator_batches(tmp_path, base):
    """Per-pixel tasks default to the lean preset: no `query.student` crosses, S still learns (from G's own
    batches in the pool), and a two-class segmentation's sites send one logit per pixel; the paper's
    exchanges (`preset = "paper"`, S-steps on fresh samples) send more of both."""

    def config(**fediod) -> RunConfig:
        layer = copy.deepcopy(base)
        layer["fediod"].pop("student_steps")
        layer["fediod"].update(wire="float32", **fediod)
        return build_config(RunConfig(), layer, {"algorithm": "fediod"})

    def run(name: str, **fediod) -> tuple[dict, list[dict]]:
        summary = run_suite(config(**fediod), tmp_path / name, progress=False)[0]
        return summary, read_ledger(tmp_path / name / "fediod" / "ledger.jsonl")

    lean, lean_records = run("lean")
    paper, paper_records = run("paper", preset="paper", student_steps=1)
    assert not any(r["type"] == "query.student" for r in lean_records)
    assert any(r["type"] == "query.student" for r in paper_records)
    _, server, _ = _dense_parts(config())
    assert server.options.preset == "lean" and server.options.pool_generator_batch
    two_classes = base is SEGMENTATION
    assert server.options.pixel_logits == ("margin" if two_classes else "all")
    # reconstruction: the teachers' mean, so the sites send no Eq. 8 ratios (segmentation keeps Eq. 8)
    assert server.options.ensemble_weighting == ("eq8" if two_classes else "uniform")
    # reconstruction: half of each target is the image G drew, replayed 16 times per G-step; the lesions'
    # small masks: a pool of 2,500 replayed 5 times per G-step
    replayed = (server.options.truth_weight, server.options.pool_size, server.options.pool_steps)
    assert replayed == ((0.0, 2500, 5) if two_classes else (0.5, 1000, 16))
    assert server.options.wire == "float32"  # the preset's one-byte wire yields to the user's
    ratios = [r for r in lean_records if r["direction"] == UP and "discriminator-outputs" in r["kinds"]]
    assert bool(ratios) == two_classes
    logits = [
        r["kinds"]["logits"] for r in lean_records if r["direction"] == UP and r["type"] == "query.generate"
    ]
    paper_logits = [
        r["kinds"]["logits"] for r in paper_records if r["direction"] == UP and r["type"] == "query.generate"
    ]
    # a G-step's reply: every class's logits (paper) against the margin (lean, two classes)
    assert paper_logits[0] == logits[0] * (2 if two_classes else 1)
    kinds = [summary["communication"][UP]["per_kind"]["logits"] for summary in (lean, paper)]
    assert kinds[0] < kinds[1]  # and no S-step samples to label
    up = lean["communication"][UP]["total_bytes"]
    assert up < paper["communication"][UP]["total_bytes"]
    assert lean["final"]["selected_epoch"] >= 1 and lean["final"]


def test_auto_teacher_logits_stay_raw_on_a_dense_task_and_ask_for_no_label_counts(tmp_path):
    config = build_config(
        _config(SEGMENTATION, teacher_logits="auto", ensemble_weighting="uniform"), {"rounds": 1}
    )
    summary = run_suite(config, tmp_path / "s", progress=False)[0]
    assert "label-statistics" not in summary["communication"][UP]["per_kind"]
    assert "teacher_logits_centred" not in summary["final"]
    _, server, _ = _dense_parts(config)
    assert server.teacher_logits == "raw"


@pytest.mark.parametrize("mode", ["scaled", "centred", "log-probabilities"])
def test_class_logit_calibration_on_image_outputs_is_refused_before_any_work(tmp_path, mode):
    """A reconstruction's outputs are images: a softmax over their one channel is 0 everywhere, so
    log-probabilities (or a rescaling meant for class logits) would silently erase the ensemble."""
    with pytest.raises(ConfigError, match=f"teacher_logits = '{mode}' calibrates class logits"):
        run_suite(_config(RECONSTRUCTION, teacher_logits=mode), tmp_path, progress=False)
    assert not (tmp_path / "fediod" / "ledger.jsonl").exists()


def test_owner_queries_on_reconstruction_is_refused_before_any_work(tmp_path):
    """Each site would get its rows of G's batch but number their undersampling masks from the batch's
    start, so its teacher would label other inputs than the student learns from."""
    options = dict(owner_queries=True, ensemble_weighting="owner", generator_mixture="per-client",
                   use_unique=False, student_steps=0, pool_generator_batch=True, pool_steps=2)  # fmt: skip
    with pytest.raises(ConfigError, match="owner_queries sends each site only its rows"):
        run_suite(_config(RECONSTRUCTION, **options), tmp_path, progress=False)
    assert not (tmp_path / "fediod" / "ledger.jsonl").exists()


def _dense_parts(config: RunConfig):
    clients, server, _ = fediod_parts(config)
    fleet = InProcessFleet(clients, Ledger(None))
    server.setup(fleet)
    return clients, server, fleet


@pytest.mark.parametrize(
    ("base", "pixel_logits"),
    [(SEGMENTATION, "all"), (SEGMENTATION, "margin"), (RECONSTRUCTION, "all")],
    ids=["segmentation", "segmentation-margin", "reconstruction"],
)
def test_the_dense_generator_gradient_equals_autograd_through_every_model(base, pixel_logits):
    """G's gradient assembled from the clients' input-gradients equals autograd of the whole loss: each
    site's L_gan on its own (mask, image) pairs, its per-pixel entropy, the per-pixel JSD and the student's
    per-pixel mimicry of the Eq. 8-weighted ensemble (on undersampled images for reconstruction); with
    `pixel_logits = "margin"` the ensemble is built from each teacher's (0, z_1 - z_0)."""
    config = _config(  # full-precision messages: exact only without the compact wire's rounding
        base,
        w_adv=0.5,
        w_unique=1.2,
        w_conf=0.8,
        w_perceptual=0.7,
        ensemble_weighting="eq8",
        wire="float32",
        pixel_logits=pixel_logits,
    )
    clients, server, fleet = _dense_parts(config)
    generator, student = copy.deepcopy(server.generator), copy.deepcopy(server.student)
    step = server.step
    server.distillation_step(fleet)
    got = [p.grad.clone() for p in server.generator.parameters()]

    options, view = server.options, server.view
    ids = sorted(clients)
    draw, rng = server.step_draw(step, ids)
    noise = generator.sample_noise(draw.latent, rng)
    x = generator(draw.latent, noise)
    pi = server.federation.pi(ids)
    index = server._mask_index(step, 0)
    outputs, loss = [], torch.zeros(())
    for i, k in enumerate(ids):
        client, mine = clients[k], draw.owner == i
        z = client.teacher(view.model_input(x, index))
        outputs.append(view.received_logits(view.sent_logits(z)))
        fake = client.discriminator(view.one_hot(draw.masks), x)
        loss = loss + options.w_gan * pi[i] * L.generator_gan_loss(fake[mine])
        loss = loss + options.w_conf * pi[i] * L.entropy(view.rows(z[mine])).mean()
        pairs = client.uploaded[draw.pair[mine]]
        real = to_float(client.ctx.train.x[pairs], client.ctx.info)
        perceptual = PerceptualLoss(encoder_features(client.teacher))(x[mine], real)
        loss = loss + options.w_perceptual * pi[i] * perceptual
    rows = view.stacked_rows(torch.stack(outputs))
    pixel_view = view.with_ratio_resolution("pixel")  # Eq. 8's ratios at every pixel, however they travel
    with torch.no_grad():
        ratio = torch.stack(
            [
                pixel_view.pixel_ratio(
                    clients[k].discriminator(view.one_hot(draw.masks), x), clients[k].real_mean
                )
                for k in ids
            ]
        ).reshape(len(ids), -1)
    weights = L.importance_weights(server.federation.share(ids, view.outputs), ratio)
    loss = loss + options.w_unique * L.unique_loss(rows, pi) + options.w_balance * L.balance_loss(rows, pi)
    ensemble = L.ensemble_logits(rows, weights)
    loss = loss - options.w_adv * L.mimic_loss(view.rows(student(view.model_input(x, index))), ensemble)
    want = torch.autograd.grad(loss, list(generator.parameters()))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_eq8_per_pixel_weights_on_a_hand_computed_case():
    """Two sites, one 2x2 image whose left and right columns each fall in one patch, two classes.

    Site 0 holds 30 background and 10 tumour pixels, site 1 10 and 30: shares (0.75, 0.25) for
    background and (0.25, 0.75) for tumour. Site 0's D judges the left patch realistic (score 0.8, its
    real mean 0.4: ratio 2) and the right one not (0.2: ratio 0.5); site 1 the opposite. At a left pixel
    the tumour weights are 0.25*2 : 0.75*0.5 = 0.5 : 0.375."""
    info = DatasetInfo("toy", 1, 2, 2, (0.0,), (1.0,), task="semantic-segmentation")
    view = TaskView(SemanticSegmentation(), info, 0)
    logit = torch.logit(torch.tensor([[0.8, 0.2], [0.8, 0.2]]))  # a 2x2 patch map: left / right columns
    ratio = torch.stack(
        [view.pixel_ratio(logit.view(1, 1, 2, 2), 0.4), view.pixel_ratio(logit.flip(1).view(1, 1, 2, 2), 0.4)]
    ).reshape(2, -1)
    torch.testing.assert_close(ratio, torch.tensor([[2.0, 0.5, 2.0, 0.5], [0.5, 2.0, 0.5, 2.0]]))
    share = L.class_share(torch.tensor([[30.0, 10.0], [10.0, 30.0]]))
    weights = L.importance_weights(share, ratio)  # (K, pixels, classes)
    left_tumour = torch.tensor([0.25 * 2, 0.75 * 0.5])
    torch.testing.assert_close(weights[:, 0, 1], left_tumour / left_tumour.sum())
    right_background = torch.tensor([0.75 * 0.5, 0.25 * 2])
    torch.testing.assert_close(weights[:, 1, 0], right_background / right_background.sum())
    torch.testing.assert_close(weights.sum(0), torch.ones(4, 2))


def test_a_site_refuses_masks_with_classes_its_condition_lacks():
    """A mask value past the condition's classes failed inside the one-hot (on a GPU, a device-side
    assert) instead of naming the message that carried it."""
    from fedistill.algorithms.fediod.generate_request import condition_masks
    from fedistill.errors import FederationError
    from fedistill.federation.messages import Message

    info = DatasetInfo("toy", 1, 4, 2, (0.0,), (1.0,), task="semantic-segmentation")
    view = TaskView(SemanticSegmentation(), info, 0)
    masks = torch.zeros(2, 4, 4, dtype=torch.uint8)
    ok = Message.build("query.student", arrays={"label-masks": {"m": masks}})
    assert torch.equal(condition_masks(ok, "m", 2, view, info), masks.long())
    masks[1, 2, 3] = 5
    bad = Message.build("query.student", arrays={"label-masks": {"m": masks}})
    with pytest.raises(FederationError, match=r"label-masks.* 5, .* 2 classes \(0\.\.1\)"):
        condition_masks(bad, "m", 2, view, info)


@pytest.mark.parametrize("resolution", ["pixel", "patch"])
def test_the_per_pixel_density_ratio_has_classifications_floor(resolution):
    """Eq. 8's denominator E[D_k(m', x')] is floored at `DENSITY_RATIO_FLOOR` on every task: a D_k that
    calls every real pair fake does not weigh its site a hundred times more on a per-pixel task."""
    info = DatasetInfo("toy", 1, 2, 2, (0.0,), (1.0,), task="semantic-segmentation")
    view = TaskView(SemanticSegmentation(), info, 0).with_ratio_resolution(resolution)
    logits = torch.full((1, 1, 2, 2), -3.0)
    expected = L.density_ratio(torch.sigmoid(torch.tensor([-3.0])), 1e-9)  # classification's ratio
    torch.testing.assert_close(view.pixel_ratio(logits, 1e-9), expected.expand(1, 2, 2))


def test_the_per_client_mixture_tells_a_conditional_generator_each_samples_site():
    """`generator_mixture = "per-client"` on a per-pixel task: G's condition is the mask's one-hot followed
    by constant one-hot planes of the site the mask is for, and G reads them (another site, another image)."""
    config = _config(SEGMENTATION, generator_mixture="per-client")
    _, server, fleet = _dense_parts(config)
    draw = server._draw(8, torch_generator(0, "latent", 0))
    classes = server.view.condition_classes
    assert draw.latent.shape[1] == classes + 2
    assert torch.equal(draw.latent[:, :classes], server.view.one_hot(draw.masks))
    planes = draw.latent[:, classes:]
    assert torch.equal(planes[:, :, 0, 0].argmax(1), draw.owner)
    assert torch.equal(planes.amin((2, 3)), planes.amax((2, 3)))  # constant over the image
    swapped = draw.latent.clone()
    swapped[:, classes:] = swapped[:, classes:].flip(1)
    server.generator.eval()
    noise = server.generator.sample_noise(draw.latent, torch_generator(0, "noise", 0))
    with torch.no_grad():
        assert not torch.equal(server.generator(draw.latent, noise), server.generator(swapped, noise))
    server.generator.train()
    metrics = server.distillation_step(fleet)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))


def test_a_margin_halves_the_logits_and_keeps_each_teachers_softmax(tmp_path):
    """`pixel_logits = "margin"` on two-class segmentation: the sites send one value per pixel instead of
    two (half the logits' and output-gradients' bytes, float32 wire), the server's (0, z_1 - z_0) has the
    teacher's softmax, and a task without classes per pixel is refused in one line."""
    view = TaskView(SemanticSegmentation(), DatasetInfo("toy", 1, 4, 2, (0.5,), (0.25,)), 0)
    margin = view.with_sent_outputs("patch", "margin")
    z = torch.randn(3, 2, 4, 4)
    sent = margin.sent_logits(z)
    assert sent.shape == (3, 1, 4, 4) == margin.sent_shape(3)
    torch.testing.assert_close(margin.received_logits(sent).softmax(1), z.softmax(1))
    stacked = torch.stack([sent, 2 * sent])  # the server's (K, B, 1, H, W)
    assert margin.received_logits(stacked).shape == (2, 3, 2, 4, 4)
    stage2 = {}  # the logits sites send and the output-gradients they get back in stage 2
    for mode in ("all", "margin"):
        config = _config(SEGMENTATION, wire="float32", pixel_logits=mode, ensemble_weighting="uniform")
        summary = run_suite(config, tmp_path / mode, progress=False)[0]
        assert 0.0 <= summary["final"]["test_dice"] <= 1.0
        records = read_ledger(tmp_path / mode / "fediod" / "ledger.jsonl")
        queries = [r["kinds"] for r in records if r["type"].startswith("query.")]
        for kind in ("logits", "output-gradients"):
            stage2[mode, kind] = sum(kinds.get(kind, 0) for kinds in queries)
    for kind in ("logits", "output-gradients"):
        assert stage2["margin", kind] / stage2["all", kind] == pytest.approx(0.5, rel=0.01)
    with pytest.raises(ConfigError, match="needs classes per pixel"):
        run_suite(_config(RECONSTRUCTION, pixel_logits="margin"), tmp_path / "r", progress=False)


def test_margins_over_the_background_keep_a_three_class_softmax():
    """On nuclei (background, inside, contour) the margins are z_1 - z_0 and z_2 - z_0: two values per
    pixel instead of three, and the server's (0, z_1 - z_0, z_2 - z_0) has the teacher's softmax."""
    view = TaskView(
        InstanceSegmentation(),
        DatasetInfo("toy", 3, 4, 2, (0.5,) * 3, (0.25,) * 3, task="instance-segmentation"),
        0,
    )
    margin = view.with_sent_outputs("patch", "margin")
    z = torch.randn(5, 3, 4, 4)
    sent = margin.sent_logits(z)
    assert sent.shape == (5, 2, 4, 4) == margin.sent_shape(5)
    torch.testing.assert_close(sent, z[:, 1:] - z[:, :1])
    received = margin.received_logits(torch.stack([sent, sent]))  # the server's (K, B, 2, H, W)
    assert received.shape == (2, 5, 3, 4, 4)
    torch.testing.assert_close(received[0].softmax(1), z.softmax(1))


@pytest.mark.parametrize("base", [SEGMENTATION, RECONSTRUCTION], ids=["segmentation", "reconstruction"])
def test_the_generators_batch_trains_the_student_from_the_pool_per_pixel(base):
    """`pool_generator_batch` on a per-pixel task keeps each of G's samples with its per-pixel ensemble
    targets (one row per pixel, as the S-steps keep theirs), and with `student_steps = 0` the student learns
    from the pool alone: the sites label nothing beyond G's batch."""
    config = _config(base, student_steps=0, pool_size=64, pool_steps=2, pool_generator_batch=True)
    _, server, fleet = _dense_parts(config)
    before = copy.deepcopy(server.student.state_dict())
    server.distillation_step(fleet)
    b, size = server.options.synthetic_batch_size, server.view.info.image_size
    assert server.carried is None and len(server.pool) == b
    assert server.pool.targets.shape[:2] == (b, size * size)
    assert server.pool.x.shape[0] == b
    assert any(not torch.equal(before[k], v) for k, v in server.student.state_dict().items())


def test_truth_weight_teaches_the_student_the_image_g_drew_on_reconstruction(tmp_path):
    """G draws the fully sampled image and the sites see its undersampled version, so with
    `truth_weight = 1` the student's target is the exact correction back to G's image; 0.5 is the mean of
    that and the teachers' ensemble. Classification, whose G draws from noise, has no truth: refused."""
    targets = {}
    for weight in (0.0, 0.5, 1.0):
        config = _config(
            RECONSTRUCTION,
            student_steps=0,
            pool_size=64,
            pool_steps=1,
            pool_generator_batch=True,
            truth_weight=weight,
        )
        _, server, fleet = _dense_parts(config)
        with torch.no_grad():  # G's batch of step 0, drawn as the step draws it
            draw, latent = server.step_draw(0, server.step_sites(0))
            drawn = server._generate(draw, latent)
        server.distillation_step(fleet)
        targets[weight] = server.pool.targets.clone()
        if weight == 1.0:
            zero_filled = server.view.model_input(drawn, server._mask_index(0, 0))
            assert torch.allclose(server.pool.x, zero_filled, atol=1e-6)
            # the correction back to G's image, in units of each zero-filled slice's std (`output_scale`)
            std = zero_filled.std(dim=(1, 2, 3), keepdim=True)
            truth = server.view.rows((drawn - zero_filled) / std).reshape(targets[1.0].shape)
            assert torch.allclose(targets[1.0], truth, atol=1e-5)
            correction = server.view.unrows(truth.reshape(-1, 1), drawn.shape)
            image = server.view.task.corrected(server.pool.x, correction)
            assert torch.allclose(image, drawn, atol=1e-6)  # the corrected input is G's image
    assert not torch.allclose(targets[0.0], targets[1.0], atol=1e-3)  # the ensemble is not the truth
    assert torch.allclose(targets[0.5], (targets[0.0] + targets[1.0]) / 2, atol=1e-6)
    classification = build_config(
        RunConfig(), {"clients": 2, "fediod": {"truth_weight": 0.5}}, {"algorithm": "fediod"}
    )
    with pytest.raises(ConfigError, match="on classification G draws from noise"):
        run_suite(classification, tmp_path / "c", progress=False)
    with pytest.raises(ConfigError, match=r"truth_weight is a weight in \[0, 1\]"):
        run_suite(_config(RECONSTRUCTION, truth_weight=1.5), tmp_path / "r", progress=False)


def test_truth_weight_on_segmentation_scores_the_student_against_g_s_own_masks():
    """On segmentation G draws each image from a label mask, so the server knows the image's label: with
    `truth_weight = w` the pool keeps the mask's class of every pixel beside the ensemble's logits, and the
    student's loss is (1 - w) L_mimic + w times the task's own loss against those classes."""
    config = _config(
        SEGMENTATION,
        student_steps=0,
        pool_size=64,
        pool_steps=1,
        pool_generator_batch=True,
        truth_weight=0.25,
    )
    _, server, fleet = _dense_parts(config)
    with torch.no_grad():  # G's masks of step 0, drawn as the step draws them
        masks = server.step_draw(0, server.step_sites(0))[0].masks
    server.distillation_step(fleet)
    targets = server.pool.targets  # (B, pixels, classes + 1)
    columns = server.view.outputs
    assert targets.shape == (len(masks), masks[0].numel(), columns + 1)
    assert torch.equal(targets[..., columns].long(), masks.reshape(len(masks), -1).long())
    assert masks.max() > 0  # the check above sees a lesion
    rows = targets.reshape(-1, columns + 1)
    out = torch.randn(len(masks), columns, *masks.shape[1:], requires_grad=True)
    loss = server._target_loss(out, rows)
    mimic = L.mimic_loss(server.view.rows(out), rows[:, :columns], mode="l2")
    task_loss = server.view.task.loss(out, masks.long())
    assert torch.allclose(loss, 0.75 * mimic + 0.25 * task_loss)
    plain = _config(SEGMENTATION, student_steps=0, pool_size=64, pool_steps=1, pool_generator_batch=True)
    _, server, fleet = _dense_parts(plain)
    server.distillation_step(fleet)
    assert server.pool.targets.shape[-1] == columns  # without it the pool keeps the ensemble alone


def test_a_nuclei_mask_labels_each_nucleus_with_its_inside_and_contour():
    """The nuclei condition is a foreground: its truth is one instance per connected nucleus, learnt as
    background, inside and contour."""
    from fedistill.tasks import InstanceSegmentation

    mask = torch.zeros(1, 8, 8, dtype=torch.int64)
    mask[0, 1:4, 1:4] = 1
    mask[0, 4:7, 4:7] = 1
    condition = InstanceSegmentation.condition
    instances = condition.target_of(mask)
    assert set(instances.unique().tolist()) == {0, 1, 2}
    assert torch.equal(condition.of(instances), mask)
    classes = InstanceSegmentation().pixel_targets(instances)
    assert classes[0, 2, 2] == 1 and classes[0, 1, 1] == 2 and classes[0, 5, 5] == 1 and classes[0, 0, 0] == 0
    assert int((classes == 2).sum()) == 16  # each 3 x 3 nucleus: 8 contour pixels around 1 inside
    # nuclei lay out the image, so the lean preset teaches their masks; a lesion mask does not
    assert condition.shapes_the_image and not SemanticSegmentation.condition.shapes_the_image


def test_two_class_masks_travel_as_bits_and_change_nothing_but_their_bytes(tmp_path, monkeypatch):
    """Under `compact` the label masks (each site's upload, then G's masks with every G-step's request)
    travel at one bit a pixel: about an eighth of their bytes, and the same run, epoch by epoch."""
    packed = run_suite(_config(SEGMENTATION, wire="compact"), tmp_path / "bits", progress=False)[0]
    monkeypatch.delitem(wire_module.COMPACT, "label-masks")
    plain = run_suite(_config(SEGMENTATION, wire="compact"), tmp_path / "bytes", progress=False)[0]
    ledgers = {name: read_ledger(tmp_path / name / "fediod" / "ledger.jsonl") for name in ("bits", "bytes")}
    with_masks = {
        name: [r for r in records if "label-masks" in r["kinds"]] for name, records in ledgers.items()
    }
    assert {r["type"] for r in with_masks["bits"]} == {"query.masks", "query.generate", "query.student"}
    assert all(r["encodings"]["label-masks"] == "bits" for r in with_masks["bits"])
    assert not any("label-masks" in r.get("encodings", {}) for r in with_masks["bytes"])
    for direction in (UP, DOWN):
        ratio = (packed["communication"][direction]["per_kind"]["label-masks"]
                 / plain["communication"][direction]["per_kind"]["label-masks"])  # fmt: skip
        assert 0.125 <= ratio < 0.15, (direction, ratio)  # 1 bit instead of 8, and 3 shape numbers a tensor
    rows = {name: (tmp_path / name / "fediod" / "metrics.jsonl").read_text().splitlines() for name in ledgers}
    dice = {name: [json.loads(row)["test_dice"] for row in lines] for name, lines in rows.items()}
    assert dice["bits"] == dice["bytes"] and len(dice["bits"]) == 2


def test_the_log_names_what_the_preset_set_and_not_what_the_user_did(caplog):
    """The lean preset resolves at run time; the run's log lists the keys it changed, so a run folder
    says which settings the run took. Keys the user set stay theirs and are not listed."""
    with caplog.at_level("INFO", logger="fedistill.algorithms.fediod.server"):
        fediod_parts(_config(SEGMENTATION))  # student_steps = 1 is the user's
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("FedIOD preset")]
    assert line.startswith("FedIOD preset 'lean' (auto): ")
    assert "pixel_logits = 'margin'" in line and "pool_generator_batch = True" in line
    assert "student_steps" not in line and "preset =" not in line


def test_with_sites_per_step_g_draws_only_for_the_asked_sites_so_each_sample_has_its_judge():
    """A G-step's samples belong to the sites it asks: a sample drawn for a site that is not asked has no
    discriminator to judge it (before: owners over all sites, so with 2 of 4 asked about half went
    unjudged, and an asked site that owned none judged the whole batch)."""
    layer = copy.deepcopy(SEGMENTATION)
    layer["clients"] = 4
    layer["mni152-synthetic-lesions"] = {"image_size": 32, "train_subjects": 8, "test_subjects": 2}
    layer["fediod"].update(sites_per_step=2, synthetic_batch_size=6, wire="float32")
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    _, server, fleet = _dense_parts(config)
    every = server.federation.clients
    for step in range(4):
        asked = server.step_sites(step)
        draw = server._draw(6, torch_generator(0, "latent", step), asked, torch_generator(0, "shares", step))
        assert {every[int(o)] for o in draw.owner} == set(asked)  # only asked sites, each at least once
        for sample, owner in enumerate(draw.owner.tolist()):  # each mask from its owner's uploads
            assert torch.equal(draw.masks[sample], server.mask_pools[owner][int(draw.pair[sample])].long())
    metrics = server.distillation_step(fleet)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))


def test_a_site_g_drew_nothing_for_only_labels_its_discriminator_neither_judges_nor_learns():
    """Two samples for four sites: the two sites that own none this step keep D_k as it was and add no
    GAN or entropy term (before, they judged, and trained on, the other sites' masks)."""
    layer = copy.deepcopy(SEGMENTATION)
    layer["clients"] = 4
    layer["fediod"].update(synthetic_batch_size=2, wire="float32", student_steps=0, pool_generator_batch=True)
    config = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    clients, server, fleet = _dense_parts(config)
    before = {
        cid: {n: t.detach().clone() for n, t in c.discriminator.named_parameters()}
        for cid, c in clients.items()
    }
    draw = server._draw(2, torch_generator(config.seed, "latent", 0), server.step_sites(0),
                        torch_generator(config.seed, "site-shares", 0))  # fmt: skip
    owners = {server.federation.clients[int(o)] for o in draw.owner}
    server.distillation_step(fleet)
    for cid, client in clients.items():
        after = dict(client.discriminator.named_parameters())
        assert all(torch.equal(before[cid][n], after[n]) for n in after) == (cid not in owners)
    assert len(owners) <= 2


@pytest.mark.parametrize(("source", "named"), [("clients", True), ("prior", False)])
def test_dp_on_a_per_pixel_task_names_the_label_masks_it_leaves_unnoised(caplog, source, named):
    """With mask_source = "clients" each site uploads its training label masks as they are: DP covers
    none of that, and the run says so when it starts."""
    caplog.set_level(logging.INFO, logger="fedistill")
    config = _config(SEGMENTATION, mask_source=source, dp_enabled=True, dp_noise_multiplier=1.0)
    fediod_parts(config)
    assert "FedIOD with DP" in caplog.text
    assert ("training label masks" in caplog.text) == named


def _resolved_for_reconstruction(**fediod):
    from fedistill.algorithms.fediod import FedIODOptions, resolve_options
    from fedistill.config import options_for

    config = build_config(RunConfig(), {"fediod": fediod})
    options = options_for(config, "fediod", FedIODOptions)
    return resolve_options(config, options, per_pixel=True, image_outputs=True)


@pytest.mark.parametrize("mode", ["kl", "kl-official"])
def test_softmax_mimicry_on_image_outputs_is_refused(mode):
    """A reconstruction's outputs have one value a pixel: its softmax is 1, so a KL L_mimic is 0 whatever
    the student outputs and the student would never learn; set by the user or by a preset."""
    s, a = torch.randn(6, 1), torch.randn(6, 1)
    assert float(L.mimic_loss(s, a, mode=mode, tau=3.0)) == 0.0  # the term that would vanish
    with pytest.raises(ConfigError, match=f"mimic = '{mode}' compares softmaxes"):
        _resolved_for_reconstruction(mimic=mode)
    preset = "stable" if mode == "kl" else "official-code"
    nets = {"teachers": "unet-fastmri", "student": "unet-fastmri"} if preset == "official-code" else {}
    with pytest.raises(ConfigError, match=f"fediod.preset = '{preset}' sets .*mimic = '{mode}'"):
        _resolved_for_reconstruction(preset=preset, selection="last", **nets)
    assert _resolved_for_reconstruction(preset=preset, mimic="l2", selection="last", **nets).mimic == "l2"
    assert _resolved_for_reconstruction().mimic == "l2"


@pytest.mark.parametrize("combine", ["median", "trimmed-mean"])
def test_probability_combines_on_image_outputs_are_refused(combine):
    """The median and trimmed mean combine softmaxes, 1 at every pixel of an image output: every target
    would be the zero correction."""
    with pytest.raises(ConfigError, match=f"ensemble_combine = '{combine}' combines the sites'"):
        _resolved_for_reconstruction(ensemble_combine=combine)


def test_collapse_patience_on_a_per_pixel_task_is_refused():
    """The collapse check measures one class's share of G's samples, which a per-pixel task never
    measures (G draws from masks): a patience there would never stop the run."""
    from fedistill.algorithms.fediod import FedIODOptions, resolve_options
    from fedistill.config import options_for

    config = build_config(RunConfig(), {"fediod": {"collapse_patience": 2}})
    options = options_for(config, "fediod", FedIODOptions)
    with pytest.raises(ConfigError, match=r"collapse_patience .* classification"):
        resolve_options(config, options, per_pixel=True, two_class_pixels=True)
    assert resolve_options(config, options, per_pixel=False).collapse_patience == 2


@pytest.mark.parametrize(("key", "value"), [("latent_dim", 16), ("generator_upsamples", 1)])
def test_noise_generator_keys_on_a_per_pixel_task_are_refused(key, value):
    """A per-pixel task's G is pix2pix's ResNet generator on the mask: the noise generator's latent length
    and upsamplings would be accepted and never used."""
    from fedistill.algorithms.fediod import FedIODOptions, resolve_options
    from fedistill.config import options_for

    config = build_config(RunConfig(), {"fediod": {key: value}})
    options = options_for(config, "fediod", FedIODOptions)
    with pytest.raises(ConfigError, match=f"fediod.{key} shapes the generator of classification"):
        resolve_options(config, options, per_pixel=True, image_outputs=True)
    assert getattr(resolve_options(config, options, per_pixel=False), key) == value


@pytest.mark.parametrize(("key", "value"), [("w_perceptual", 0.5), ("mask_pool", 10)])
def test_upload_keys_with_prior_masks_are_refused(key, value):
    """The perceptual term pairs G(m) with the real image of an uploaded mask m, and `mask_pool` bounds the
    upload: with masks from the server's prior no site uploads any, so either would be accepted unused."""
    from fedistill.algorithms.fediod import FedIODOptions, resolve_options
    from fedistill.config import options_for

    def resolved(**fediod):
        config = build_config(RunConfig(), {"fediod": fediod})
        options = options_for(config, "fediod", FedIODOptions)
        return resolve_options(config, options, per_pixel=True, two_class_pixels=True)

    with pytest.raises(ConfigError, match=f"fediod.{key} .*mask_source = 'prior'"):
        resolved(mask_source="prior", **{key: value})
    assert getattr(resolved(mask_source="clients", **{key: value}), key) == value
    assert resolved(mask_source="prior").w_perceptual == 1.0  # the default stays, unused, unrefused
    # a ready config names the default weight: switching its mask source alone still runs
    assert resolved(mask_source="prior", w_perceptual=1.0).mask_source == "prior"
    assert resolved(mask_source="prior", **{key: 0}).mask_source == "prior"


def test_the_official_code_preset_on_a_per_pixel_task_names_its_classification_nets(tmp_path):
    """The released code's preset sets wide ResNet-8 teachers and student, classifiers: on a segmentation
    the run stops naming the preset and the keys to set, not a model the user never wrote; with the keys
    set it runs."""
    with pytest.raises(ConfigError, match=r"preset = 'official-code' sets fediod\.teachers, fediod\.student"):
        run_suite(_config(SEGMENTATION, preset="official-code"), tmp_path / "a", progress=False)
    assert not (tmp_path / "a" / "fediod" / "ledger.jsonl").exists()
    from fedistill.algorithms.fediod import FedIODOptions, resolve_options
    from fedistill.config import options_for

    config = _config(SEGMENTATION, preset="official-code", teachers="unet", student="unet")
    options = resolve_options(config, options_for(config, "fediod", FedIODOptions), per_pixel=True)
    assert (options.teachers, options.student, options.mimic) == ("unet", "unet", "kl-official")


def test_a_discriminator_too_deep_for_the_images_is_refused_before_stage_1(tmp_path):
    """D_k is built at a site's first G-step: a PatchGAN too deep for the images stopped the run there, after
    every teacher had trained, as the sites' failed replies; it now stops at set-up naming the option."""
    with pytest.raises(ConfigError, match=r"fediod\.discriminator_layers = 6 .* at least 192"):
        run_suite(_config(SEGMENTATION, discriminator_layers=6), tmp_path, progress=False)
    assert not (tmp_path / "fediod" / "ledger.jsonl").exists()
