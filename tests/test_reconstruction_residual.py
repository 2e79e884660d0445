"""The reconstruction task's residual and data consistency: a net learns a correction to the zero-filled
image, and the measured k-space lines are put back into its output."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.mri.kspace import data_consistency, fft2c
from fedistill.tasks.reconstruction import Reconstruction, WithResidual

INFO = DatasetInfo("toy-mri", 1, 16, 1, (0.0,), (1.0,), task="reconstruction")


class Zeros(nn.Module):
    """A net that has learnt nothing: its correction is zero everywhere."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def _slices(n: int = 6, seed: int = 0) -> ImageSet:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 16, 16, generator=generator)
    return ImageSet(x / x.amax(dim=(1, 2, 3), keepdim=True), torch.ones(n, 16, 16, dtype=torch.int64))


def _one_batch(task: Reconstruction, data: ImageSet) -> tuple[object, torch.Tensor]:
    return next(iter(task.batches(data, INFO, len(data), shuffle=False, generator=None, augment=False)))


def test_defaults_are_residual_with_data_consistency():
    task = Reconstruction()
    assert task.residual and task.data_consistency
    assert task.options()["residual"] is True and task.options()["data_consistency"] is True


def test_a_net_that_outputs_zeros_returns_the_zero_filled_image_with_residual():
    data = _slices()
    task = Reconstruction(data_consistency=False)
    inputs, _ = _one_batch(task, data)
    assert isinstance(inputs, torch.Tensor)
    assert torch.equal(task.predict(Zeros(), inputs), inputs)
    plain = dataclasses.replace(task, residual=False)  # today's behaviour: the net's output itself
    assert torch.equal(plain.predict(Zeros(), inputs), torch.zeros_like(inputs))


@pytest.mark.parametrize("residual", [True, False])
def test_data_consistency_puts_the_measurement_back_on_the_measured_lines(residual):
    data = _slices(seed=1)
    task = Reconstruction(residual=residual)
    (zero_filled, kspace, mask), _ = _one_batch(task, data)
    net = nn.Conv2d(1, 1, 3, padding=1)  # a net whose output is neither zero nor the input
    torch.manual_seed(0)
    with torch.no_grad():
        out = task.predict(net, (zero_filled, kspace, mask))
        without = task.corrected(zero_filled, net(zero_filled))
    measured = mask.expand_as(zero_filled).bool()  # each slice's own mask, its columns over every row
    assert 0 < int(measured.sum()) < measured.numel()
    # a magnitude output has no phase: its k-space is that of the complex image whose magnitude it is
    complex_out = data_consistency(without, kspace, mask, magnitude=False)
    assert torch.allclose(complex_out.abs(), out, atol=1e-6)
    k, kspace = fft2c(complex_out), kspace.to(torch.complex64)
    assert torch.allclose(k[measured], kspace[measured], atol=1e-5)
    assert not torch.allclose(k[~measured], kspace[~measured], atol=1e-3)  # the net's lines elsewhere


def test_data_consistency_of_the_zero_filled_image_keeps_the_measured_lines():
    data = _slices(seed=2)
    task = Reconstruction()
    (zero_filled, kspace, mask), target = _one_batch(task, data)
    out = task.predict(Zeros(), (zero_filled, kspace, mask))
    assert out.shape == target.shape and torch.isfinite(out).all()
    # with residual and a zero correction the net's image is the zero-filled one; DC keeps it close
    assert float((out - zero_filled).abs().mean()) < 0.05


def test_the_exported_module_carries_the_residual():
    net = nn.Conv2d(1, 1, 3, padding=1)
    x = torch.rand(2, 1, 16, 16)
    with torch.no_grad():
        assert torch.equal(Reconstruction().standalone(net)(x), x + net(x))
        assert Reconstruction(residual=False).standalone(net) is net
    assert isinstance(Reconstruction().standalone(net), WithResidual)
