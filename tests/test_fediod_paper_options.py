"""Two choices of the paper's per-pixel experiments, offered as options and off by default:
`fediod.reconstruction_condition = "contour"` conditions G and every D_k on the outline of the brain's
foreground instead of the filled mask (the paper's "contour of the foreground of the brain"), and
`fediod.distill_augment` crops, turns and flips the student's segmentation batches together with their
per-pixel targets. Each is checked by hand on small tensors, refused where it does not apply, and run
end to end on the semi-synthetic demo data at the smallest budgets."""

import copy

import pytest
import torch

from fedistill.algorithms.fediod.distill_augment import CROP_SHARE, augment_batch, crop_side
from fedistill.config import RunConfig, build_config
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError
from fedistill.tasks.conditions import foreground_contour
from test_fediod_dense import RECONSTRUCTION, SEGMENTATION, _dense_parts


def _config(base: dict, **fediod) -> RunConfig:
    layer = copy.deepcopy(base)
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def _ring(size: int, top: int, bottom: int) -> torch.Tensor:
    """The one-pixel ring of the square [top, bottom) x [top, bottom) in a size x size image."""
    ring = torch.zeros(size, size, dtype=torch.int64)
    ring[top:bottom, top:bottom] = 1
    ring[top + 1 : bottom - 1, top + 1 : bottom - 1] = 0
    return ring


# --- the contour -----------------------------------------------------------------------------------


def test_the_contour_of_a_filled_square_is_its_one_pixel_ring():
    square = torch.zeros(10, 10, dtype=torch.int64)
    square[2:8, 2:8] = 1
    contour = foreground_contour(square)
    assert torch.equal(contour, _ring(10, 2, 8))
    assert int(contour.sum()) == 20  # 6 x 6 less its 4 x 4 inside
    assert contour.dtype == torch.int64


def test_the_contour_closes_at_the_image_edge_and_keeps_thin_shapes_whole():
    full = torch.ones(1, 5, 5, dtype=torch.int64)  # a batch of one mask filling the image
    assert torch.equal(foreground_contour(full)[0], _ring(5, 0, 5))
    line = torch.zeros(6, 6, dtype=torch.int64)
    line[3, 1:5] = 1  # one pixel wide: all of it is outline
    assert torch.equal(foreground_contour(line), line)
    assert int(foreground_contour(torch.zeros(4, 4)).sum()) == 0


def test_the_contour_reads_any_positive_value_as_foreground_and_keeps_the_batch_shape():
    masks = torch.zeros(3, 8, 8)
    masks[1, 1:7, 1:7] = 0.25  # a brain of any intensity, as stored targets may be
    out = foreground_contour(masks)
    assert out.shape == (3, 8, 8)
    assert int(out[0].sum()) == 0 and int(out[2].sum()) == 0
    assert torch.equal(out[1], _ring(8, 1, 7))


# --- reconstruction_condition --------------------------------------------------------------------


def test_an_unknown_condition_is_refused_naming_the_accepted_ones(tmp_path):
    with pytest.raises(
        ConfigError, match=r"reconstruction_condition must be one of mask, contour; got 'edge'"
    ):
        run_suite(_config(RECONSTRUCTION, reconstruction_condition="edge"), tmp_path / "r", progress=False)


def test_the_contour_is_refused_where_g_draws_no_brain(tmp_path):
    classification = build_config(
        RunConfig(),
        {"clients": 2, "fediod": {"reconstruction_condition": "contour"}},
        {"algorithm": "fediod"},
    )
    segmentation = _config(SEGMENTATION, reconstruction_condition="contour")
    for config in (classification, segmentation):
        with pytest.raises(ConfigError, match=r"reconstruction_condition = 'contour'.*reconstruction"):
            run_suite(config, tmp_path / "r", progress=False)


def test_with_the_contour_every_mask_g_and_d_k_see_is_an_outline():
    """The masks the sites upload, the masks each D_k pairs with its real images, and the server's prior
    masks are all the outline of the brain's foreground: each is its own contour, and it is the contour of
    the site's filled foreground."""
    clients, server, _ = _dense_parts(_config(RECONSTRUCTION, reconstruction_condition="contour"))
    assert server.view.condition.description == "the contour of the brain's foreground mask"
    for pool in server.mask_pools:
        assert int(pool.sum()) > 0
        assert torch.equal(foreground_contour(pool), pool.to(torch.int64))
    client = clients[min(clients)]
    targets = client.ctx.train.y[:4]
    assert torch.equal(client.view.condition_of(targets), foreground_contour(targets > 0))
    _, masks = client._real_batch(0, 4)
    assert torch.equal(foreground_contour(masks), masks)
    from fedistill.algorithms.fediod.draws import prior_masks

    prior = prior_masks(server.view, 3, torch.Generator().manual_seed(0))
    assert int(prior.sum()) > 0 and torch.equal(foreground_contour(prior), prior)


def test_the_filled_mask_stays_the_default():
    clients, server, _ = _dense_parts(_config(RECONSTRUCTION))
    client = clients[min(clients)]
    targets = client.ctx.train.y[:4]
    assert torch.equal(client.view.condition_of(targets), (targets > 0).to(torch.int64))
    assert server.view.condition.description == "the brain's foreground mask"


def test_a_reconstruction_runs_end_to_end_on_the_contour(tmp_path):
    config = _config(RECONSTRUCTION, reconstruction_condition="contour")
    summary = run_suite(config, tmp_path / "c", progress=False)[0]
    assert 0.0 < summary["final"]["test_ssim"] <= 1.0


# --- distill_augment -------------------------------------------------------------------------------


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_crop_is_the_papers_224_of_240_pixels():
    assert CROP_SHARE == 224 / 240
    assert crop_side(240) == 224
    assert crop_side(32) == 30  # the demos' images
    assert crop_side(1) == 1


def test_targets_that_are_a_function_of_the_image_stay_that_function():
    """Logits moved with their pixels: a target map that is an affine function of the image (which
    bilinear resizing, flips and quarter turns all commute with) is the same function of the augmented
    image, pixel for pixel."""
    x = torch.rand(16, 3, 32, 32, generator=_generator(1))
    targets = 2.0 * x[:, :2] - 1.0
    out_x, out_targets = augment_batch(x, targets, _generator())
    assert out_x.shape == x.shape and out_targets.shape == targets.shape
    torch.testing.assert_close(out_targets, 2.0 * out_x[:, :2] - 1.0)
    assert not torch.equal(out_x, x)


def test_class_columns_stay_classes_on_the_pixels_they_label():
    """A class column (the mask G drew from) is resized by nearest neighbour: its values stay the class
    ids, and wherever the augmented image is one block's value (away from the blurred block edges) the
    class there is that block's."""
    blocks = torch.arange(16).reshape(4, 4).repeat_interleave(8, 0).repeat_interleave(8, 1)  # 32 x 32
    classes = torch.stack([blocks.roll(i, dims=i % 2) for i in range(8)]).float()  # (8, 32, 32)
    x = torch.cat([classes[:, None], torch.rand(8, 2, 32, 32, generator=_generator(2))], dim=1)
    targets = torch.cat([torch.randn(8, 2, 32, 32, generator=_generator(3)), classes[:, None]], dim=1)
    out_x, out_targets = augment_batch(x, targets, _generator(4), hard_columns=1)
    hard = out_targets[:, 2]
    assert set(hard.unique().tolist()) <= set(range(16))
    inside = (out_x[:, 0] - out_x[:, 0].round()).abs() < 1e-5
    assert inside.float().mean() > 0.5
    assert torch.equal(hard[inside], out_x[:, 0][inside].round())


def test_the_same_seed_gives_the_same_augmentation():
    x = torch.rand(6, 3, 16, 16, generator=_generator(5))
    targets = torch.randn(6, 2, 16, 16, generator=_generator(6))
    first = augment_batch(x, targets, _generator(7))
    again = augment_batch(x, targets, _generator(7))
    other = augment_batch(x, targets, _generator(8))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def _augment_config(**fediod) -> RunConfig:
    lean = {"student_steps": 0, "pool_size": 64, "pool_steps": 2, "pool_generator_batch": True}
    return _config(SEGMENTATION, **lean, **fediod)


def test_only_the_students_training_changes_and_the_pool_keeps_g_s_images():
    """The augmentation acts on the student's batches after the sites have labelled G's images: the pool
    keeps the images and targets as they were, and the student trains on something else."""
    stepped = []
    for augment in (False, True):
        _, server, fleet = _dense_parts(_augment_config(distill_augment=augment))
        server.distillation_step(fleet)
        stepped.append(server)
    plain, augmented = stepped
    assert torch.equal(plain.pool.x, augmented.pool.x)
    assert torch.equal(plain.pool.targets, augmented.pool.targets)
    weights = [server.student.state_dict() for server in stepped]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_augmentation_is_refused_where_it_does_not_apply(tmp_path):
    classification = build_config(
        RunConfig(), {"clients": 2, "fediod": {"distill_augment": True}}, {"algorithm": "fediod"}
    )
    reconstruction = _config(RECONSTRUCTION, distill_augment=True)
    for config in (classification, reconstruction):
        with pytest.raises(ConfigError, match=r"distill_augment .*it is for segmentation"):
            run_suite(config, tmp_path / "r", progress=False)
    with pytest.raises(ConfigError, match="distill_augment must be true or false"):
        run_suite(_config(SEGMENTATION, distill_augment="yes"), tmp_path / "s", progress=False)


def test_a_segmentation_runs_end_to_end_with_the_augmentation_and_reproduces(tmp_path):
    """Seeded from the run's seed: two runs give the same student, and the sites send the same bytes as
    without the augmentation (it adds no message)."""
    finals, sent = [], []
    for name, augment in (("a", True), ("b", True), ("plain", False)):
        config = _config(SEGMENTATION, distill_augment=augment, truth_weight=0.5)
        summary = run_suite(config, tmp_path / name, progress=False)[0]
        finals.append(summary["final"])
        sent.append(summary["communication"])
    assert 0.0 <= finals[0]["test_dice"] <= 1.0
    assert finals[0]["test_dice"] == finals[1]["test_dice"]
    assert sent[0] == sent[2]
