"""`fediod.student_recolour`: the student trains on a share of G's segmentation images in a random new look
(channels shuffled, per-channel contrast and offset, half of them inverted) under their unchanged targets. The
transform is what it says, the pool and every message stay as without it, and it is refused where a
colour can decide the target."""

import copy

import pytest
import torch

from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo
from fedistill.data.transforms import random_recolour
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError
from test_fediod_dense import RECONSTRUCTION, SEGMENTATION, _dense_parts

INFO = DatasetInfo("toy", 3, 5, 2, (0.6, 0.5, 0.4), (0.2, 0.25, 0.3), task="semantic-segmentation")


def _fit(out: torch.Tensor, u: torch.Tensor) -> tuple[float, float, float]:
    """The contrast k, offset o and largest residual of the least-squares line out = 1/2 + k (u - 1/2) + o."""
    a = torch.stack([u.flatten() - 0.5, torch.ones(u.numel(), dtype=u.dtype)], dim=1)
    solution = torch.linalg.lstsq(a, (out.flatten() - 0.5)[:, None]).solution[:, 0]
    residual = (a @ solution - (out.flatten() - 0.5)).abs().max()
    return float(solution[0]), float(solution[1]), float(residual)


def test_each_chosen_image_is_its_own_channels_shuffled_contrasted_shifted_and_half_inverted():
    """In pixel units: each output channel is one input channel under 1/2 + k (u - 1/2) + o, |k| in
    [1/2, 2], the same sign of k across an image, and about half the images inverted (k < 0)."""
    mean, std = torch.tensor(INFO.mean)[:, None, None], torch.tensor(INFO.std)[:, None, None]
    units = 0.4 + 0.2 * torch.rand(400, 3, 5, 5, generator=torch.Generator().manual_seed(2))
    out = random_recolour((units - mean) / std, INFO, 1.0, torch.Generator().manual_seed(0))
    out_units = out * std + mean
    inverted = 0
    for image, recoloured in zip(units, out_units, strict=True):
        sources, signs = [], []
        for channel in recoloured:
            if channel.min() <= 1e-6 or channel.max() >= 1 - 1e-6:
                continue  # clipped: the line no longer holds on every pixel
            fits = [_fit(channel, source) for source in image]
            k = min(range(3), key=lambda i: fits[i][2])
            contrast, _, residual = fits[k]
            assert residual < 1e-5
            assert 0.5 - 1e-4 <= abs(contrast) <= 2.0 + 1e-4
            sources.append(k)
            signs.append(contrast < 0)
        assert len(set(sources)) == len(sources)  # the channels shuffled, none twice
        assert len(set(signs)) <= 1  # the whole image inverted or none of it
        inverted += bool(signs and signs[0])
    assert 150 <= inverted <= 250  # about half
    assert float(out_units.min()) >= -1e-6 and float(out_units.max()) <= 1.0 + 1e-6  # pixels stay in [0, 1]


def test_a_share_of_the_images_changes_and_the_rest_stay_bit_for_bit():
    x = torch.randn(1000, 3, 4, 4)
    out = random_recolour(x, INFO, 0.3, torch.Generator().manual_seed(1))
    changed = (out != x).flatten(1).any(dim=1)
    assert 240 <= int(changed.sum()) <= 360
    assert torch.equal(out[~changed], x[~changed])
    again = random_recolour(x, INFO, 0.3, torch.Generator().manual_seed(1))
    assert torch.equal(out, again)  # the draws come from the generator alone
    assert random_recolour(x, INFO, 0.0, torch.Generator().manual_seed(1)) is x


def _config(**fediod) -> RunConfig:
    layer = copy.deepcopy(SEGMENTATION)
    layer["fediod"].update(student_steps=0, pool_size=64, pool_steps=2, pool_generator_batch=True, **fediod)
    return build_config(RunConfig(), layer, {"algorithm": "fediod"})


def _stepped(config: RunConfig):
    _, server, fleet = _dense_parts(config)
    server.distillation_step(fleet)
    return server


def test_the_pool_keeps_g_s_images_and_only_the_students_training_changes():
    plain, recoloured = _stepped(_config()), _stepped(_config(student_recolour=1.0))
    assert torch.equal(plain.pool.x, recoloured.pool.x)
    assert torch.equal(plain.pool.targets, recoloured.pool.targets)
    weights = [server.student.state_dict() for server in (plain, recoloured)]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_sites_send_the_same_bytes_with_and_without_it(tmp_path):
    sent = []
    for name, share in (("plain", 0.0), ("recoloured", 0.5)):
        summary = run_suite(_config(student_recolour=share), tmp_path / name, progress=False)[0]
        sent.append(summary["communication"])
    assert sent[0] == sent[1]


def test_it_is_refused_where_a_colour_can_decide_the_target(tmp_path):
    classification = build_config(
        RunConfig(), {"clients": 2, "fediod": {"student_recolour": 0.5}}, {"algorithm": "fediod"}
    )
    layer = copy.deepcopy(RECONSTRUCTION)
    layer["fediod"]["student_recolour"] = 0.5
    reconstruction = build_config(RunConfig(), layer, {"algorithm": "fediod"})
    for config in (classification, reconstruction):
        with pytest.raises(ConfigError, match="it is for segmentation"):
            run_suite(config, tmp_path / "r", progress=False)
    with pytest.raises(ConfigError, match=r"student_recolour is a share in \[0, 1\]"):
        run_suite(_config(student_recolour=1.5), tmp_path / "s", progress=False)
