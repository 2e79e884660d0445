"""MRI reconstruction metrics: fastMRI's per-volume conventions, checked on volumes with known answers."""

import math

import numpy as np
import pytest
import torch
from skimage.metrics import structural_similarity

from fedistill.metrics.reconstruction import ReconstructionScores, error_map, nmse, psnr, ssim


def _volume(seed: int, slices: int = 3, size: int = 24) -> np.ndarray:
    """A smooth non-negative volume whose maximum is exactly 1."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[:size, :size] / size
    volume = np.stack([0.5 + 0.4 * np.sin(3 * rows + k) * np.cos(2 * cols - k) for k in range(slices)])
    volume = volume + 0.05 * rng.random(volume.shape)
    return volume / volume.max()


def _noisy(volume: np.ndarray, sigma: float) -> np.ndarray:
    """``volume`` plus ``±sigma`` in a checkerboard: the MSE is exactly ``sigma²``."""
    signs = np.indices(volume.shape).sum(axis=0) % 2 * 2 - 1
    return volume + sigma * signs


def test_identical_volumes_score_perfectly():
    volume = _volume(0)
    assert ssim(volume, volume) == pytest.approx(1.0)
    assert psnr(volume, volume) == math.inf
    assert nmse(volume, volume) == 0.0
    np.testing.assert_array_equal(error_map(volume, volume), np.zeros_like(volume))


def test_psnr_of_a_known_noise_level_and_nmse_by_hand():
    volume = _volume(1)
    assert psnr(volume, _noisy(volume, 0.01)) == pytest.approx(40.0)  # 10 log10(1 / 0.01²)
    assert psnr(volume, _noisy(volume, 0.01), data_range=2.0) == pytest.approx(40.0 + 20 * math.log10(2))
    assert nmse(volume, 0.9 * volume) == pytest.approx(0.01)
    np.testing.assert_allclose(error_map(volume, _noisy(volume, 0.01)), 0.01)


def test_ssim_follows_fastmri_evaluation():
    target, prediction = _volume(2), _noisy(_volume(2), 0.05)
    # fastMRI's evaluate.py: 2-D SSIM per slice, scikit-image defaults, data range = the volume's maximum.
    expected = np.mean(
        [
            structural_similarity(t, p, data_range=target.max())
            for t, p in zip(target, prediction, strict=True)
        ]
    )
    assert ssim(target, prediction) == pytest.approx(expected)
    assert ssim(torch.from_numpy(target), torch.from_numpy(prediction)) == pytest.approx(expected)
    assert 0 < expected < 1


def test_scaling_a_volume_changes_nothing_but_a_fixed_range_would():
    target, prediction = _volume(3), _noisy(_volume(3), 0.03)
    scores = ReconstructionScores()
    scores.update(target, prediction, subjects=["a"] * 3, sources="brats-t1")
    scores.update(7.5 * target, 7.5 * prediction, subjects=["b"] * 3, sources="brats-t1")
    a, b = scores.per_volume()
    assert b.data_range == pytest.approx(7.5 * a.data_range, rel=1e-6)
    assert (b.ssim, b.psnr, b.nmse) == pytest.approx((a.ssim, a.psnr, a.nmse), rel=1e-5)
    # The same pair on a fixed scale of 1 instead of each volume's own maximum: a different SSIM.
    assert ssim(7.5 * target, 7.5 * prediction, data_range=1.0) != pytest.approx(a.ssim, rel=1e-3)


def test_a_slice_is_scored_against_its_volume_maximum():
    volume = _volume(4)
    volume[0] *= 0.2  # a dim slice in a bright volume
    prediction = _noisy(volume, 0.02)
    per_slice_range = ssim(volume[0], prediction[0])  # data range = the dim slice's own maximum
    volume_range = ssim(volume[0], prediction[0], data_range=volume.max())
    assert volume_range != pytest.approx(per_slice_range, rel=1e-3)
    scores = ReconstructionScores()
    scores.update(volume, prediction, subjects=[0, 0, 0])
    assert scores.summary()["ssim"] == pytest.approx(ssim(volume, prediction), rel=1e-5)
    assert scores.summary()["ssim"] == pytest.approx(
        np.mean([ssim(t, p, data_range=volume.max()) for t, p in zip(volume, prediction, strict=True)]),
        rel=1e-5,
    )


def test_scores_group_slices_into_volumes_and_average_volumes_per_source():
    volumes = {
        ("ixi-t2", "s1"): _volume(5, slices=1),
        ("ixi-t2", "s2"): _volume(6),
        ("fastmri", 7): _volume(7),
    }
    predictions = {key: _noisy(v, 0.02 * (i + 1)) for i, (key, v) in enumerate(volumes.items())}
    slices = [(key, k) for key, v in volumes.items() for k in range(v.shape[0])]
    order = np.random.default_rng(0).permutation(len(slices))  # slices arrive shuffled, in small batches
    scores = ReconstructionScores()
    for batch in np.array_split(order, 3):
        keys = [slices[i] for i in batch]
        scores.update(
            torch.from_numpy(np.stack([volumes[key][k] for key, k in keys]))[:, None],
            np.stack([predictions[key][k] for key, k in keys])[:, None],
            subjects=[key[1] for key, _ in keys],
            sources=[key[0] for key, _ in keys],
        )

    assert len(scores.per_volume()) == 3
    by_source = scores.by_source()
    assert list(by_source) == ["fastmri", "ixi-t2"]
    ixi = [("ixi-t2", "s1"), ("ixi-t2", "s2")]
    assert by_source["ixi-t2"]["volumes"] == 2 and by_source["ixi-t2"]["slices"] == 4
    # Each volume counts once, whatever its number of slices.
    for name, metric in [("ssim", ssim), ("psnr", psnr), ("nmse", nmse)]:
        expected = np.mean([metric(volumes[key], predictions[key]) for key in ixi])
        assert by_source["ixi-t2"][name] == pytest.approx(expected, rel=1e-5)
    assert scores.summary()["volumes"] == 3


def test_one_subject_names_the_whole_batch_like_one_source():
    volume = _volume(9)  # 3 slices
    prediction = _noisy(volume, 0.05)
    for subject in ("ab1", 7, np.int64(7), torch.tensor(7)):
        # a string was split into its characters: 3 one-slice "volumes" 'a', 'b', '1'
        scores = ReconstructionScores()
        scores.update(volume, prediction, subjects=subject, sources="ixi-t1")
        (only,) = scores.per_volume()
        assert only.slices == 3 and only.subject == subject
        assert only.ssim == pytest.approx(ssim(volume, prediction))


def test_one_source_names_the_whole_batch_whatever_form_it_takes():
    volume = _volume(11)  # 3 slices
    for source in (3, np.int64(3), torch.tensor(3), np.array(3), np.array("3"), np.str_("3")):
        # a number raised "'int' object is not iterable", a 0-d array "iteration over a 0-d array"
        scores = ReconstructionScores()
        scores.update(volume, volume, subjects="s1", sources=source)
        assert list(scores.by_source()) == ["3"] and type(scores.per_volume()[0].source) is str
        assert scores.by_source()["3"]["slices"] == 3


def test_mistakes_are_named():
    volume = _volume(8)
    with pytest.raises(ValueError, match="differ in shape"):
        ssim(volume, volume[:2])
    with pytest.raises(ValueError, match="all zero"):
        psnr(np.zeros((8, 8)), np.ones((8, 8)))
    with pytest.raises(ValueError, match="all zero"):
        nmse(np.zeros((8, 8)), np.ones((8, 8)))
    with pytest.raises(ValueError, match="SSIM window"):
        ssim(volume[:, :5, :5], volume[:, :5, :5])
    scores = ReconstructionScores()
    with pytest.raises(ValueError, match="subjects"):
        scores.update(volume, volume, subjects=["a"])
    with pytest.raises(ValueError, match="no slices"):
        scores.summary()
    scores.update(np.zeros_like(volume), volume, subjects=["empty"] * 3, sources="ixi-t1")
    with pytest.raises(ValueError, match="volume 'empty' of source 'ixi-t1'"):
        scores.summary()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("where", ["targets", "predictions"])
def test_a_batch_with_nan_or_inf_is_refused_when_it_comes(bad, where):
    """A NaN target used to surface only at summary(), as 'is the target all zero or negative?'."""
    batches = {"targets": _volume(10), "predictions": _volume(10)}
    batches[where][1, 2, 3] = bad
    scores = ReconstructionScores()
    with pytest.raises(ValueError, match=rf"^{where} hold NaN or infinite values \(first in slice 1 "):
        scores.update(batches["targets"], batches["predictions"], subjects="s1", sources="ixi-t1")
