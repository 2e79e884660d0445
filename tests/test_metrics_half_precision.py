"""Every metric takes torch's half-precision tensors (float16 and bfloat16) as it takes float32 ones."""

import numpy as np
import pytest
import torch

from fedistill.metrics.instances import aji, instances_from_semantic, instances_from_three_class, object_dice
from fedistill.metrics.reconstruction import ReconstructionScores, nmse, psnr, ssim
from fedistill.metrics.segmentation import SegmentationScores, dice, hd95

HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF)
def test_masks_and_instance_maps_in_half_precision(dtype: torch.dtype) -> None:
    truth = torch.zeros(16, 16)
    truth[2:7, 2:7], truth[9:14, 8:13] = 1, 2
    prediction = torch.zeros(16, 16)
    prediction[3:8, 2:7], prediction[9:14, 9:14] = 1, 2
    for f in (dice, hd95):
        assert f(truth > 0, prediction > 0) == f((truth > 0).to(dtype), (prediction > 0).to(dtype))
    for f in (aji, object_dice):
        assert f(truth, prediction) == f(truth.to(dtype), prediction.to(dtype))
    scores = SegmentationScores()
    scores.update((truth > 0).to(dtype)[None], (prediction > 0).to(dtype)[None])
    assert scores.summary()["mean_dice"] == dice(truth > 0, prediction > 0)


@pytest.mark.parametrize("dtype", HALF)
def test_probabilities_in_half_precision(dtype: torch.dtype) -> None:
    probabilities = torch.zeros(3, 16, 16)
    probabilities[0] = 1.0
    probabilities[:, 3:8, 3:8] = torch.tensor([0.0, 0.75, 0.25])[:, None, None]
    expected = instances_from_three_class(*probabilities)
    np.testing.assert_array_equal(instances_from_three_class(*probabilities.to(dtype)), expected)
    np.testing.assert_array_equal(instances_from_semantic(probabilities[1].to(dtype)), expected)


@pytest.mark.parametrize("dtype", HALF)
def test_reconstructions_in_half_precision(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    target = torch.rand(2, 16, 16, generator=generator).to(dtype)
    prediction = (target.float() + 0.05 * torch.randn(2, 16, 16, generator=generator)).to(dtype)
    exact = target.float(), prediction.float()
    for f in (ssim, psnr, nmse):
        assert f(target, prediction) == f(*exact)
    scores = ReconstructionScores()
    scores.update(target, prediction, subjects="s1")
    assert scores.summary()["ssim"] == pytest.approx(ssim(*exact))
