"""FedIOD's `site_looks`: with the per-client mixture on segmentation, G draws every image from its mask
through one net, and each site's images come out through that site's own colour map. The sites share
what a mask says (same mask and noise, same image before the maps), the map is the stated formula, a
site's map learns only from that site's samples, and the option is refused where it cannot apply."""

import copy
from types import SimpleNamespace

import pytest
import torch

from fedistill.algorithms.fediod import FedIODOptions
from fedistill.algorithms.fediod.options import resolve_options
from fedistill.config import RunConfig, build_config
from fedistill.errors import ConfigError
from fedistill.models.pix2pix import LOOK_STEP, build_conditional_generator
from fedistill.seeding import torch_generator
from test_fediod_dense import SEGMENTATION, _dense_parts

INFO = SimpleNamespace(name="tiny", image_size=16, channels=3, mean=(0.5,) * 3, std=(0.25,) * 3)


def _generator(looks: int = 3):
    torch.manual_seed(0)
    return build_conditional_generator(INFO, 2 + looks, noise_channels=1, width=4, blocks=1, looks=looks)


def _condition(owners: list[int], looks: int = 3) -> torch.Tensor:
    condition = torch.zeros(len(owners), 2 + looks, 16, 16)
    condition[:, 1, 4:10, 5:12] = 1.0  # one nucleus
    condition[:, 0] = 1.0 - condition[:, 1]
    for i, owner in enumerate(owners):
        condition[i, 2 + owner] = 1.0
    return condition


def test_every_site_starts_from_the_same_image_of_a_mask():
    g = _generator().eval()
    condition, noise = _condition([0, 1, 2]), torch.randn(1, 1, 16, 16).expand(3, -1, -1, -1)
    with torch.no_grad():
        images = g.forward_unit(condition, noise)
    assert torch.equal(images[0], images[1]) and torch.equal(images[1], images[2])
    assert g.model[1].in_channels == 2 + 1  # the net sees the mask and the noise, not the site


def test_a_sites_colour_map_is_its_matrix_and_offset_on_the_image():
    g = _generator().eval()
    condition, noise = _condition([0, 1, 2]), torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        plain = g.forward_unit(condition, noise)
        g.look_matrix[1] = torch.tensor([[-0.1, 0.0, 0.0], [0.02, 0.0, 0.0], [0.0, 0.0, 0.05]])
        g.look_bias[1] = torch.tensor([0.1, -0.02, 0.0])
        coloured = g.forward_unit(condition, noise)
    matrix = torch.eye(3) + LOOK_STEP * g.look_matrix[1]
    expected = torch.einsum("ij,jhw->ihw", matrix, plain[1]) + LOOK_STEP * g.look_bias[1][:, None, None]
    assert torch.allclose(coloured[1], expected, atol=1e-6)
    # site 1's first channel keeps none of its own signal (1 - 10 x 0.1 = 0), only the offset 10 x 0.1
    assert torch.allclose(coloured[1, 0], torch.full_like(coloured[1, 0], 1.0), atol=1e-6)
    assert torch.equal(coloured[0], plain[0]) and torch.equal(coloured[2], plain[2])
    normalised = g(condition, noise)
    assert torch.allclose(normalised, (coloured - 0.5) / 0.25, atol=1e-5)


def test_a_sites_map_learns_only_from_its_own_samples():
    g = _generator()
    image = g.forward_unit(_condition([0, 0, 2]), torch.randn(3, 1, 16, 16))
    image.square().mean().backward()
    assert g.look_matrix.grad[1].abs().sum() == 0 and g.look_bias.grad[1].abs().sum() == 0
    assert g.look_matrix.grad[0].abs().sum() > 0 and g.look_bias.grad[2].abs().sum() > 0


def test_looks_must_leave_a_mask_to_draw_from():
    with pytest.raises(ConfigError, match="must leave the mask"):
        build_conditional_generator(INFO, 3, width=4, blocks=1, looks=3)


def _config(**fediod) -> RunConfig:
    layer = copy.deepcopy(SEGMENTATION)
    layer["fediod"].update(fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def test_site_looks_needs_the_per_client_mixture():
    with pytest.raises(ConfigError, match=r"set fediod\.generator_mixture = 'per-client' too"):
        FedIODOptions(site_looks=True, preset="paper").validate()
    config = _config(site_looks=True, generator_mixture="shared")
    with pytest.raises(ConfigError, match=r"generator_mixture = 'per-client' too"):
        resolve_options(config, FedIODOptions(site_looks=True), per_pixel=True, mask_shapes_images=True)


def test_the_lean_default_gives_mask_shaped_images_a_share_per_site_in_its_own_colours():
    """Nuclei (masks that lay out the image): the lean preset takes the per-site mixture with looks; a
    user's own mixture keeps the preset's looks out; two-class lesions keep one shared G."""
    nuclei = resolve_options(_config(), FedIODOptions(), per_pixel=True, mask_shapes_images=True)
    assert (nuclei.generator_mixture, nuclei.site_looks, nuclei.truth_weight) == ("per-client", True, 0.75)
    assert nuclei.look_trials == 4  # each site's colours tried both ways (look_trials.py)
    config = _config(generator_mixture="shared")
    own = resolve_options(
        config, FedIODOptions(generator_mixture="shared"), per_pixel=True, mask_shapes_images=True
    )
    assert (own.generator_mixture, own.site_looks, own.look_trials) == ("shared", False, 0)
    lesions = resolve_options(_config(), FedIODOptions(), per_pixel=True, two_class_pixels=True)
    assert (lesions.generator_mixture, lesions.site_looks, lesions.look_trials) == ("shared", False, 0)


@pytest.mark.parametrize(("per_pixel", "image_outputs"), [(False, False), (True, True)])
def test_site_looks_is_refused_where_g_draws_no_mask_or_a_colour_is_the_target(per_pixel, image_outputs):
    config = _config(site_looks=True, generator_mixture="per-client")
    options = FedIODOptions(site_looks=True, generator_mixture="per-client")
    with pytest.raises(ConfigError, match="site_looks colours the images"):
        resolve_options(config, options, per_pixel=per_pixel, image_outputs=image_outputs)


def test_a_generator_step_with_site_looks_trains_each_sites_map():
    config = _config(site_looks=True, generator_mixture="per-client")
    _, server, fleet = _dense_parts(config)
    g = server.generator
    assert g.looks == config.clients
    draw = server._draw(8, torch_generator(0, "latent", 0))
    assert torch.equal(draw.latent[:, -g.looks :, 0, 0].argmax(1), draw.owner)
    before = g.look_matrix.detach().clone()
    metrics = server.distillation_step(fleet)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    assert not torch.equal(g.look_matrix.detach(), before)
