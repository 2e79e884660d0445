"""Two choices of the paper's per-pixel experiments, offered as options and off by default:
`fediod.reconstruction_condition = "contour"` conditions G and every D_k on the outline of the brain's
foreground instead of the filled mask (the paper's "contour of the foreground of the brain"), and
`fediod.distill_augment` crops, turns and flips the student's segmentation batches together with their
per-pixel targets. Each is checked by hand on small tensors, refused where it does not apply, and run
end to end on the semi-synthetic demo data at the smallest budgets."""

import copy

import pytest
import torch

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
