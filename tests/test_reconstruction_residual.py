"""The reconstruction task's residual, output scale and data consistency: a net learns a correction to the
zero-filled image, in units of that slice's spread, and the measured k-space lines are put back into its
output."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.mri.kspace import data_consistency, fft2c
from fedistill.errors import ConfigError
from fedistill.tasks.reconstruction import Corrected, Reconstruction

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


def test_defaults_are_residual_with_data_consistency_in_the_slice_s_units():
    task = Reconstruction()
    assert task.residual and task.data_consistency and task.output_scale == "slice"
    assert task.options()["residual"] is True and task.options()["data_consistency"] is True
    assert task.options()["output_scale"] == "slice"


def test_a_bad_output_scale_names_the_choices():
    with pytest.raises(ConfigError, match=r"task\.output_scale must be one of slice, none, got 'max'"):
        Reconstruction(output_scale="max")


@pytest.mark.parametrize("residual", [True, False])
def test_the_net_s_output_is_in_units_of_its_input_slice_s_std(residual):
    data = _slices(seed=3)
    task = Reconstruction(residual=residual, data_consistency=False)
    inputs, target = _one_batch(task, data)
    net = nn.Conv2d(1, 1, 3, padding=1)
    with torch.no_grad():
        out = net(inputs)
        std = inputs.std(dim=(1, 2, 3), keepdim=True)
        base = inputs if residual else inputs.mean(dim=(1, 2, 3), keepdim=True)
        assert torch.allclose(task.predict(net, inputs), base + std * out, atol=1e-6)
        # a slice ten times brighter gets a ten times larger correction from a net blind to the scale
        assert torch.allclose(task.corrected(10 * inputs, out), 10 * task.corrected(inputs, out), atol=1e-5)
        # the distillation target: the net output that `corrected` turns into the true image
        assert torch.allclose(task.corrected(inputs, task.net_output_for(inputs, target)), target, atol=1e-5)
        empty = torch.zeros(1, 1, 16, 16)  # a slice with nothing in it keeps its (zero) input
        assert torch.equal(task.corrected(empty, torch.zeros_like(empty)), torch.zeros_like(empty))
    unscaled = dataclasses.replace(task, output_scale="none")
    assert torch.equal(unscaled.corrected(inputs, out), inputs + out if residual else out)


def test_a_net_that_outputs_zeros_returns_the_zero_filled_image_with_residual():
    data = _slices()
    task = Reconstruction(data_consistency=False)
    inputs, _ = _one_batch(task, data)
    assert isinstance(inputs, torch.Tensor)
    assert torch.equal(task.predict(Zeros(), inputs), inputs)
    plain = dataclasses.replace(task, residual=False, output_scale="none")  # the net's output itself
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


def test_the_exported_module_carries_the_residual_and_the_output_scale():
    net = nn.Conv2d(1, 1, 3, padding=1)
    x = torch.rand(2, 1, 16, 16)
    task = Reconstruction()
    with torch.no_grad():
        assert torch.equal(task.standalone(net)(x), task.corrected(x, net(x)))
        assert torch.equal(Reconstruction(output_scale="none").standalone(net)(x), x + net(x))
        assert Reconstruction(residual=False, output_scale="none").standalone(net) is net
    assert isinstance(task.standalone(net), Corrected)
