"""MRI reconstruction data: k-space helpers, fastMRI-style masks, the file loaders, the stand-ins."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np
import pytest
import torch

from conftest import SHARED_DATA
from fedistill.data.mri import ENTRIES, fastmri
from fedistill.data.mri.brain_sites import load_brain_t1_sites
from fedistill.data.mri.brats import load_brats_mri
from fedistill.data.mri.cross_site import load_mri_cross_site
from fedistill.data.mri.fastmri import load_fastmri_brain
from fedistill.data.mri.foreground import foreground_mask
from fedistill.data.mri.ixi import load_ixi
from fedistill.data.mri.kspace import data_consistency, fft2c, ifft2c, undersample, zero_filled
from fedistill.data.mri.masks import (
    EquispacedExactMaskFunc,
    EquispacedMaskFunc,
    RandomMaskFunc,
    SliceMasks,
    center_lines,
    mask_function,
)
from fedistill.data.mri.mni152 import load_mni152_t1
from fedistill.data.mri.nifti import read_slices
from fedistill.data.mri.split import slab_split
from fedistill.errors import ConfigError, DataError

# ---------------------------------------------------------------- k-space


def test_fft_round_trip_is_unitary_and_centred():
    x = torch.rand(3, 1, 24, 20, generator=torch.Generator().manual_seed(0))
    k = fft2c(x)
    assert torch.allclose(ifft2c(k).real, x, atol=1e-6) and ifft2c(k).imag.abs().max() < 1e-6
    assert torch.allclose(k.abs().pow(2).sum((-2, -1)), x.pow(2).sum((-2, -1)), rtol=1e-5)  # Parseval
    ones = fft2c(torch.ones(24, 20))
    assert ones[12, 10].real == pytest.approx((24 * 20) ** 0.5, rel=1e-6)  # DC at the centre
    assert float(ones.abs().sum()) == pytest.approx(float(ones[12, 10].abs()), rel=1e-5)


def test_fully_sampled_zero_filled_is_the_magnitude():
    x = torch.randn(2, 1, 16, 18, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(zero_filled(x, torch.ones(18)), x.abs(), atol=1e-6)
    measured, image = undersample(x, torch.zeros(18).index_fill_(0, torch.tensor([9]), 1.0))
    assert measured[..., :9].abs().max() == 0 and measured[..., 10:].abs().max() == 0
    assert image.shape == x.shape and image.dtype == torch.float32


@pytest.mark.parametrize("kind", ["random", "equispaced"])
@pytest.mark.parametrize(("center", "acc"), [(0.08, 4), (0.04, 8)])
def test_masks_sample_one_over_acceleration_with_the_centre(kind, center, acc):
    func, n = mask_function(kind, (center,), (acc,)), 320
    centre = center_lines(n, round(n * center))
    fractions = []
    for seed in range(200):
        m = func(n, seed)
        assert m.shape == (n,) and m.dtype == torch.float32 and set(m.unique().tolist()) <= {0.0, 1.0}
        assert m[centre].min() == 1 and int(m[centre].sum()) == round(n * center)
        fractions.append(float(m.mean()))
    assert np.mean(fractions) == pytest.approx(1 / acc, rel=0.03)
    if kind == "equispaced":  # not random in number: every mask close to the budget
        assert max(abs(f - 1 / acc) for f in fractions) < 3 / n


def test_masks_equal_fastmri_for_the_same_seed():
    """Indices fastMRI 0.3.0 returns (RandomMaskFunc, EquispacedMaskFractionFunc, EquiSpacedMaskFunc)."""
    assert RandomMaskFunc((0.08, 0.04), (4, 8))(48, (1, 2)).nonzero().flatten().tolist() == [23, 24, 27, 40]
    assert EquispacedMaskFunc((0.08,), (4,))(48, 5).nonzero().flatten().tolist() == [
        *(3, 8, 14, 20, 22, 23, 24, 25, 30, 36, 42)
    ]
    assert EquispacedExactMaskFunc((0.08,), (4,))(48, 5).nonzero().flatten().tolist() == [
        *(3, 7, 11, 15, 19, 22, 23, 24, 25, 27, 31, 35, 39, 43, 47)
    ]


def test_equispaced_spacing():
    n, acc, center = 320, 4, 0.08
    num_low = round(n * center)
    spacing = acc * (num_low - n) / (num_low * acc - n)
    centre = set(range(n)[center_lines(n, num_low)])
    for seed in range(10):
        cols = EquispacedMaskFunc((center,), (acc,))(n, seed).nonzero().flatten().tolist()
        outer = [c for c in cols if c not in centre]
        gaps = {b - a for a, b in itertools.pairwise(outer) if not centre & set(range(a, b))}
        assert gaps <= {int(np.floor(spacing)), int(np.ceil(spacing))}  # the adjusted spacing, rounded
        exact = EquispacedExactMaskFunc((center,), (acc,))(n, seed).nonzero().flatten().tolist()
        outer = [c for c in exact if c not in centre]
        assert outer[0] < acc and set(outer) == set(range(outer[0], n, acc)) - centre


@pytest.mark.parametrize(("n", "center", "acc"), [(32, 0.24, 4), (12, 0.24, 4), (11, 0.24, 4), (5, 0.3, 3)])
def test_equispaced_mask_is_the_centre_when_the_centre_fills_the_budget(n, center, acc):
    num_low = round(n * center)
    assert num_low * acc >= n  # the adjusted spacing would be infinite or negative
    mask = EquispacedMaskFunc((center,), (acc,))(n, 0)
    assert mask.nonzero().flatten().tolist() == list(range(n))[center_lines(n, num_low)]
    assert torch.equal(mask, RandomMaskFunc((center,), (acc,))(n, 0))  # no outer column either


def test_slice_masks_seeded_per_slice_or_fixed():
    func = RandomMaskFunc((0.08,), (4,))
    per = SliceMasks(func, "per-slice", seed=3)
    a, b = per([0, 1, 2, 7], 64), SliceMasks(func, "per-slice", seed=3)([0, 1, 2, 7], 64)
    assert a.shape == (4, 1, 1, 64) and torch.equal(a, b)
    assert len({tuple(m.flatten().tolist()) for m in a}) == 4  # different across slices
    assert torch.equal(per([7], 64)[0], a[3])  # a slice's mask does not depend on the batch
    assert not torch.equal(SliceMasks(func, "per-slice", seed=4)([0], 64), a[:1])
    fixed = SliceMasks(func, "fixed", seed=3)([0, 1, 5], 64)
    assert torch.equal(fixed[0], fixed[1]) and torch.equal(fixed[0], fixed[2])
    assert torch.equal(fixed[0, 0, 0], func(64, 3))
    x = torch.rand(4, 1, 8, 64)
    assert zero_filled(x, a).shape == x.shape
    with pytest.raises(ConfigError, match="mask mode"):
        SliceMasks(func, "per-volume")


def test_mask_settings_are_checked():
    with pytest.raises(ConfigError, match="equal length"):
        RandomMaskFunc((0.08, 0.04), (4,))
    with pytest.raises(ConfigError, match="inside the budget"):
        RandomMaskFunc((0.3,), (4,))
    with pytest.raises(ConfigError, match="acceleration must be > 1"):
        EquispacedMaskFunc((0.08,), (1,))
    with pytest.raises(ConfigError, match="did you mean 'random'"):
        mask_function("randm")


def test_data_consistency_restores_measured_lines():
    g = torch.Generator().manual_seed(2)
    target, prediction = torch.rand(2, 1, 16, 32, generator=g), torch.rand(2, 1, 16, 32, generator=g)
    mask = SliceMasks(RandomMaskFunc((0.08,), (4,)), seed=1)([0, 1], 32)
    measured, _ = undersample(target, mask)
    k = fft2c(data_consistency(prediction, measured, mask, magnitude=False))
    on = mask.expand_as(k).bool()
    assert torch.allclose(k[on], measured[on], atol=1e-5)
    assert torch.allclose(k[~on], fft2c(prediction)[~on], atol=1e-5)
    soft = fft2c(data_consistency(prediction, measured, mask, weight=0.25, magnitude=False))
    assert torch.allclose(soft[on], (0.75 * fft2c(prediction) + 0.25 * measured)[on], atol=1e-5)
    assert data_consistency(prediction, measured, mask).dtype == torch.float32
    full = torch.ones(32)
    assert torch.allclose(data_consistency(prediction, fft2c(target), full), target, atol=1e-5)
    with pytest.raises(ValueError, match="weight"):
        data_consistency(prediction, measured, mask, weight=0.0)


def test_data_consistency_is_a_projection_before_the_magnitude():
    """Hard data consistency on complex images (even and odd sizes): the zero-filled image comes back
    unchanged and a second pass changes nothing. The magnitude (the default output) breaks both, as its
    docstring says: the measured lines move once the phase is dropped."""
    g = torch.Generator().manual_seed(5)
    for h, w in ((16, 20), (15, 21)):
        target, prediction = torch.rand(2, 1, h, w, generator=g), torch.rand(2, 1, h, w, generator=g)
        mask = SliceMasks(RandomMaskFunc((0.1,), (4,)), seed=2)([0, 1], w)
        measured, zero_filled_magnitude = undersample(target, mask)
        zero_filled_image = ifft2c(measured)
        kept = data_consistency(zero_filled_image, measured, mask, magnitude=False)
        assert torch.allclose(kept, zero_filled_image, atol=1e-6)
        once = data_consistency(prediction, measured, mask, magnitude=False)
        assert torch.allclose(data_consistency(once, measured, mask, magnitude=False), once, atol=1e-6)
        assert torch.allclose(zero_filled_image.abs(), zero_filled_magnitude, atol=1e-6)
        magnitude = data_consistency(zero_filled_magnitude, measured, mask)
        assert not torch.allclose(magnitude, zero_filled_magnitude, atol=1e-3)


def test_k_space_shapes_that_do_not_fit_are_named():
    """A measurement or a mask for another image size or batch failed as a bare broadcasting error."""
    prediction = torch.rand(2, 1, 8, 8)
    measured = fft2c(torch.rand(2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"measured k-space \(2, 1, 8, 9\) .* prediction \(2, 1, 8, 8\)"):
        data_consistency(prediction, fft2c(torch.rand(2, 1, 8, 9)), torch.ones(8))
    with pytest.raises(ValueError, match=r"measured k-space \(3, 1, 8, 8\) .* prediction \(2, 1, 8, 8\)"):
        data_consistency(prediction, fft2c(torch.rand(3, 1, 8, 8)), torch.ones(8))
    with pytest.raises(
        ValueError, match=r"mask \(3, 1, 1, 8\) does not broadcast over k-space \(2, 1, 8, 8\)"
    ):
        data_consistency(prediction, measured, torch.ones(3, 1, 1, 8))
    with pytest.raises(ValueError, match=r"mask \(3, 1, 1, 8\) does not broadcast"):
        undersample(prediction, torch.ones(3, 1, 1, 8))


# ---------------------------------------------------------------- foreground, split


def test_foreground_is_one_filled_object():
    yy, xx = np.mgrid[:64, :64]
    r = np.hypot(yy - 32, xx - 32)
    image = np.where(r < 26, 0.8, 0.0) * (r >= 22) + np.where(r < 18, 0.5, 0.0)  # scalp ring, dark gap, brain
    image[2, 2] = 1.0  # a speck
    mask = foreground_mask(image.astype(np.float32), level=0.8)
    assert mask[32, 32] and mask[32, 32 + 20] and not mask[2, 2] and not mask[32, 60]
    assert np.pi * 25**2 < int(mask.sum()) < np.pi * 28**2  # the smoothed edge may add a pixel


def test_slab_split_keeps_test_slices_away_from_training():
    pos = np.arange(120, dtype=float)
    train, test = slab_split(pos)
    assert len(test) == 32 and not set(train) & set(test)
    assert np.abs(pos[train][:, None] - pos[test][None, :]).min() > 4
    assert pos[test].min() >= 16 and pos[test].max() > 80  # test spread over the volume


# ---------------------------------------------------------------- file loaders

AFFINE = np.diag([1.0, 1.0, 1.0, 1.0])


def _head(shape: tuple[int, int, int], seed: int, skull: bool = True) -> np.ndarray:
    """A test volume (X, Y, Z): an ellipsoid 'head' with a textured interior, positive values."""
    rng = np.random.default_rng(seed)
    grid = np.meshgrid(*(np.linspace(-1, 1, n) for n in shape), indexing="ij")
    r = np.sqrt(sum((g / a) ** 2 for g, a in zip(grid, (0.8, 0.9, 0.95), strict=True)))
    inside = 300 + 200 * np.cos(6 * grid[0]) * np.sin(5 * grid[1]) + 20 * rng.random(shape)
    vol = np.where(r < 0.85, inside, 0.0)
    if skull:
        vol = vol + np.where((r >= 0.88) & (r < 1.0), 500.0, 0.0)
    return vol.astype(np.float32)


def _nifti(path: Path, volume: np.ndarray, affine: np.ndarray = AFFINE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(volume, affine), str(path))
    return path


def _np_ifft2c(k: np.ndarray) -> np.ndarray:
    axes = (-2, -1)
    return np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(k, axes=axes), norm="ortho", axes=axes), axes=axes)


def _np_fft2c(x: np.ndarray) -> np.ndarray:
    axes = (-2, -1)
    return np.fft.fftshift(np.fft.fft2(np.fft.ifftshift(x, axes=axes), norm="ortho", axes=axes), axes=axes)


def _fastmri_file(path: Path, seed: int, acquisition: str = "AXT1", coils: int = 4, **extra) -> np.ndarray:
    """A fastMRI-layout file (slices, coils, 64, 32) from a test head; returns its RSS image volume."""
    head = _head((64, 32, 5), seed).transpose(2, 0, 1)  # (S, H, W): readout 64 rows, 32 phase columns
    rng = np.random.default_rng(seed)
    if coils:
        phase = np.exp(1j * rng.uniform(0, 2 * np.pi, (1, coils, 1, 1)))
        sens = (0.5 + rng.random((1, coils, 64, 32))) * phase
        images = head[:, None] * sens
    else:
        images = head * np.exp(1j * rng.uniform(0, 2 * np.pi))
    kspace = _np_fft2c(images).astype(np.complex64)
    rss = np.sqrt((np.abs(_np_ifft2c(kspace)) ** 2).sum(1)) if coils else np.abs(_np_ifft2c(kspace))
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("kspace", data=kspace)
        f.create_dataset("reconstruction_rss" if coils else "reconstruction_esc", data=rss[:, 16:48])
        f.attrs["acquisition"] = acquisition
        f.attrs["max"] = float(rss.max())
        for key, value in extra.items():
            f.create_dataset(key, data=value)
    return rss


def _check_recon(ds, size: int, whole_test_volumes: bool = True) -> None:
    for part in (ds.train, ds.test):
        assert part.x.dtype == torch.float32 and part.x.shape[1:] == (1, size, size)
        assert part.y.dtype == torch.int64 and part.y.shape == (len(part), size, size)
        assert float(part.x.min()) >= 0 and 0.5 < float(part.x.max()) <= 1
        assert set(part.y.unique().tolist()) == {0, 1}
    assert float(ds.train.x.max()) == pytest.approx(1.0)
    assert ds.info.task == "reconstruction" and ds.info.channels == 1 and ds.info.image_size == size
    assert len(ds.test_meta["subject"]) == len(ds.test) == len(ds.test_meta["slice"])
    if whole_test_volumes:  # every test volume scaled to maximum 1 (the stand-ins test on part of one)
        for s in np.unique(ds.test_meta["subject"]):
            peak = float(ds.test.x[torch.from_numpy(ds.test_meta["subject"] == s)].max())
            assert peak == pytest.approx(1.0)


def test_fastmri_multicoil_rss_and_file_targets(tmp_path, monkeypatch):
    monkeypatch.setattr(fastmri, "TARGET_SIZE", 32)  # the test files are 64x32; fastMRI's are 640x320
    rss = _fastmri_file(tmp_path / "train" / "a.h5", 1)
    _fastmri_file(tmp_path / "train" / "b.h5", 2, acquisition="AXT2")
    _fastmri_file(tmp_path / "train" / "c.h5", 3, acquisition="AXT1POST")
    _fastmri_file(tmp_path / "val" / "d.h5", 4)
    ds = load_fastmri_brain(tmp_path, image_size=None)
    _check_recon(ds, 32)
    assert len(ds.train) == 10 and len(ds.test) == 5  # the AXT2 file is not T1
    expected = rss[:, 16:48] / rss[:, 16:48].max()  # centre crop of the readout, per-volume maximum 1
    assert np.allclose(ds.train.x[:5, 0].numpy(), expected, atol=1e-5)
    from_file = load_fastmri_brain(tmp_path, image_size=None, target="file")
    assert np.allclose(from_file.train.x.numpy(), ds.train.x.numpy(), atol=1e-5)
    assert ds.train_groups is None and ds.test_meta["subject"].tolist() == [0] * 5
    assert load_fastmri_brain(tmp_path, image_size=16, max_volumes=1).train.x.shape == (5, 1, 16, 16)
    with pytest.raises(DataError, match="AXT2"):
        load_fastmri_brain(tmp_path, contrast="t2")  # val has no T2 file: the error lists what is there


def test_fastmri_single_coil_and_bad_files(tmp_path, monkeypatch):
    monkeypatch.setattr(fastmri, "TARGET_SIZE", 32)
    image = _fastmri_file(tmp_path / "train" / "a.h5", 5, coils=0)
    _fastmri_file(tmp_path / "val" / "b.h5", 6, coils=0)
    ds = load_fastmri_brain(tmp_path, image_size=None)
    assert np.allclose(ds.train.x[:, 0].numpy(), image[:, 16:48] / image[:, 16:48].max(), atol=1e-5)
    # single-coil files also hold the multi-coil data's RSS; their stored target is the ESC image
    _fastmri_file(tmp_path / "train" / "a.h5", 5, coils=0, reconstruction_rss=np.ones((5, 32, 32)))
    from_file = load_fastmri_brain(tmp_path, image_size=None, target="file")
    assert np.allclose(from_file.train.x.numpy(), ds.train.x.numpy(), atol=1e-5)
    _fastmri_file(tmp_path / "val" / "c.h5", 7, mask=np.ones(32))
    with pytest.raises(DataError, match=r"c\.h5 holds undersampled k-space"):
        load_fastmri_brain(tmp_path)
    with h5py.File(tmp_path / "val" / "c.h5", "w") as f:  # a 2-D target, k-space without coils
        f.create_dataset("reconstruction_rss", data=np.ones((32, 32), dtype=np.float32))
        f.create_dataset("kspace", data=np.zeros((2, 0, 64, 32), dtype=np.complex64))
        f.attrs["acquisition"] = "AXT1"
    with pytest.raises(DataError, match=r"c\.h5: `reconstruction_rss` must be a real \(slices, H, W\)"):
        load_fastmri_brain(tmp_path, target="file")
    with pytest.raises(DataError, match=r"c\.h5: `kspace` \(2, 0, 64, 32\) is empty"):
        load_fastmri_brain(tmp_path)
    kspace = np.ones((2, 64, 32), dtype=np.complex64)
    kspace[1, 5, 7] = np.nan  # one corrupt sample spreads over its slice's image
    _fastmri_file(tmp_path / "val" / "c.h5", 7, coils=0)
    with h5py.File(tmp_path / "val" / "c.h5", "r+") as f:
        del f["kspace"]
        f.create_dataset("kspace", data=kspace)
    with pytest.raises(DataError, match=r"c\.h5: the volume holds NaN or infinite values"):
        load_fastmri_brain(tmp_path)
    (tmp_path / "val" / "c.h5").write_bytes(b"not hdf5")
    with pytest.raises(DataError, match=r"cannot read HDF5 file .*c\.h5"):
        load_fastmri_brain(tmp_path)


def test_ixi_subjects_sites_and_contrast(tmp_path):
    subjects = ["IXI002-Guys-0828", "IXI012-HH-1211", "IXI013-HH-1212", "IXI016-IOP-0756", "IXI017-Guys-0698"]
    for i, s in enumerate(subjects):
        _nifti(tmp_path / "IXI-T1" / f"{s}-T1.nii.gz", _head((40, 48, 30), i))
        if i < 3:
            _nifti(tmp_path / "IXI-T2" / f"{s}-T2.nii.gz", _head((40, 48, 30), 10 + i))
    ds = load_ixi(tmp_path, image_size=32, test_fraction=0.2)
    _check_recon(ds, 32)
    assert ds.info.name == "ixi-t1" and ds.group_names == ("Guys", "HH", "IOP")
    assert len(np.unique(ds.test_meta["subject"])) == 1
    assert set(np.unique(ds.train_groups)) | set(np.unique(ds.test_groups)) == {0, 1, 2}
    all_slices = load_ixi(tmp_path, image_size=32, slices="all", test_fraction=0.2)
    assert len(all_slices.train) == 4 * 30 and len(ds.train) < len(all_slices.train)  # brain slices only
    t2 = load_ixi(tmp_path, contrast="t2", image_size=None, test_fraction=0.3)
    assert len(t2.train) + len(t2.test) <= 3 * 30 and t2.train.x.shape[-1] == 48  # padded to square
    with pytest.raises(ConfigError, match="does not take option"):
        load_ixi(tmp_path, colour="red")
    with pytest.raises(ConfigError, match="contrast"):
        load_ixi(tmp_path, contrast="pd")


def test_axial_slices_do_not_depend_on_the_stored_orientation(tmp_path):
    vol = _head((20, 24, 16), 0)
    ras = _nifti(tmp_path / "ras.nii.gz", vol)
    # the same volume stored as (S, R, A) voxel axes, superior axis flipped: another orientation on disk
    stored = np.ascontiguousarray(vol.transpose(2, 0, 1)[::-1])
    affine = np.array([[0, 1, 0, 0], [0, 0, 1, 0], [-1, 0, 0, 15], [0, 0, 0, 1]], dtype=float)
    other = _nifti(tmp_path / "other.nii.gz", stored, affine)
    a, b = read_slices(ras), read_slices(other)
    assert a.slices.shape == (16, 24, 20) and np.array_equal(a.slices, b.slices)
    assert read_slices(other, "stored").slices.shape == (24, 16, 20)


def _brats(root: Path, split: str, n: int, first: int) -> None:
    for i in range(first, first + n):
        subject = f"BraTS20_{split}_{i:03d}"
        folder = root / f"MICCAI_BraTS2020_{split}Data" / subject
        for contrast, seed in (("t1", i), ("t2", 50 + i), ("t1ce", 90 + i)):
            _nifti(folder / f"{subject}_{contrast}.nii.gz", _head((24, 24, 155), seed, skull=False))


def test_a_patients_scans_at_several_timepoints_stay_on_one_side_of_the_split():
    """BraTS 2023 names scans `BraTS-<set>-<patient>-<timepoint>`: a drawn split of the scans could test
    on one timepoint of a patient and train on another."""
    from fedistill.data.mri.split import brats_patient, split_subjects

    names = [f"BraTS-GLI-{p:05d}-{t:03d}" for p in range(6) for t in range(3)]
    train, test = split_subjects(names, 0.34, "brats", patient_of=brats_patient)
    assert {brats_patient(n) for n in train}.isdisjoint(brats_patient(n) for n in test)
    assert len(train) + len(test) == 18 and len(test) == 6  # two of the six patients, all their scans
    old = [f"BraTS20_Training_{i:03d}" for i in range(9)]  # one scan per patient: the split is unchanged
    assert split_subjects(old, 0.34, "brats", patient_of=brats_patient) == split_subjects(old, 0.34, "brats")
    with pytest.raises(DataError, match="at least 2 patients"):
        split_subjects(names[:3], 0.5, "brats", patient_of=brats_patient)


def test_brats_official_split_and_protocol_slices(tmp_path):
    _brats(tmp_path, "Training", 2, 1)
    _brats(tmp_path, "Validation", 1, 1)
    ds = load_brats_mri(tmp_path, image_size=None)
    _check_recon(ds, 24)
    assert len(ds.train) == 2 * 121 and len(ds.test) == 121  # Guo et al.'s slices 14..134
    assert ds.test_meta["slice"].tolist() == list(range(14, 135))
    t2 = load_brats_mri(tmp_path, contrast="t2", image_size=16, slices="brain")
    assert len(t2.train) < 2 * 155 and t2.info.name == "brats-mri-t2"
    pooled = load_brats_mri(tmp_path, image_size=16, test_fraction=0.34)
    assert len(np.unique(pooled.test_meta["subject"])) == 1 and len(pooled.train) == 2 * 121
    for f in tmp_path.rglob("*Validation*"):
        if f.is_dir() and f.name.startswith("MICCAI"):
            for p in sorted(f.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            f.rmdir()
    with pytest.raises(DataError, match=r"Validation.*test_fraction"):
        load_brats_mri(tmp_path)


def test_brats_releases_that_share_patients_are_not_read_together(tmp_path):
    """Each glioma release holds the scans of the earlier ones under new names (BraTS 2020's name_mapping.csv
    lists each subject's 2018 name): with 2018 unpacked beside 2020, a patient was trained on twice, or,
    with test_fraction, could be trained on under one name and tested on under the other."""
    _brats(tmp_path, "Training", 2, 1)
    _brats(tmp_path, "Validation", 1, 1)
    subject = "Brats18_2013_2_1"
    folder = tmp_path / "MICCAI_BraTS_2018_Data_Training" / "HGG" / subject
    _nifti(folder / f"{subject}_t1.nii.gz", _head((24, 24, 155), 7, skull=False))
    for options in ({}, {"test_fraction": 0.34}):
        with pytest.raises(DataError, match=r"BraTS 2018 \(Brats18_2013_2_1 \.\.\.\), BraTS 2020 \(BraTS20_"):
            load_brats_mri(tmp_path, image_size=16, **options)
    # 2018's HGG/ straight in the folder (where the segmentation set reads it) is in neither official split
    (tmp_path / "MICCAI_BraTS_2018_Data_Training" / "HGG").rename(tmp_path / "HGG")
    assert len(load_brats_mri(tmp_path, image_size=16).train) == 2 * 121
    # subjects of a set of their own (a 2023 set other than the gliomas, a user's own) share no patient
    folder = tmp_path / "MICCAI_BraTS_2018_Data_Training" / "Case_01"
    _nifti(folder / "Case_01_t1.nii.gz", _head((24, 24, 155), 7, skull=False))
    assert len(load_brats_mri(tmp_path, image_size=16).train) == 3 * 121


def test_brats_2023_file_names(tmp_path):
    """BraTS 2023 names its native T1 `-t1n` and its T2 `-t2w`; the contrast-enhanced `-t1c` is not read."""
    for split, i in (("Training", 1), ("Training", 2), ("Validation", 3)):
        subject = f"BraTS-GLI-{i:05d}-000"
        folder = tmp_path / f"ASNR-MICCAI-BraTS2023-GLI-Challenge-{split}Data" / subject
        for ending, seed in (("t1n", i), ("t2w", 50 + i), ("t1c", 90 + i)):
            _nifti(folder / f"{subject}-{ending}.nii.gz", _head((24, 24, 155), seed, skull=False))
    ds = load_brats_mri(tmp_path, image_size=None)
    assert len(ds.train) == 2 * 121 and len(ds.test) == 121
    for path in tmp_path.rglob("*-t1c.nii.gz"):
        path.unlink()
    assert torch.equal(load_brats_mri(tmp_path, image_size=None).test.x, ds.test.x)
    t2 = load_brats_mri(tmp_path, contrast="t2", image_size=None)
    assert not torch.equal(t2.test.x, ds.test.x)
    for path in tmp_path.rglob("*-t2w.nii.gz"):
        path.unlink()
    with pytest.raises(DataError, match=r"-t2w\.nii\.gz"):
        load_brats_mri(tmp_path, contrast="t2")


def test_cross_site_one_group_per_source(tmp_path, monkeypatch):
    monkeypatch.setattr(fastmri, "TARGET_SIZE", 32)
    _fastmri_file(tmp_path / "fastmri" / "train" / "a.h5", 1)
    _fastmri_file(tmp_path / "fastmri" / "val" / "b.h5", 2)
    _brats(tmp_path / "brats", "Training", 1, 1)
    _brats(tmp_path / "brats", "Validation", 1, 1)
    for i, s in enumerate(["IXI002-Guys-0828", "IXI012-HH-1211", "IXI016-IOP-0756"]):
        _nifti(tmp_path / "ixi" / f"{s}-T1.nii.gz", _head((40, 48, 30), i))
    ds = load_mri_cross_site(tmp_path, image_size=16)
    _check_recon(ds, 16)
    assert ds.group_names == ("fastMRI", "BraTS2020", "IXI")
    assert set(ds.train_groups.tolist()) == set(ds.test_groups.tolist()) == {0, 1, 2}
    assert len(np.unique(ds.test_meta["subject"])) == 3  # one test volume per source, ids distinct
    for g in range(3):
        assert len(np.unique(ds.test_meta["subject"][ds.test_groups == g])) == 1
    two = load_mri_cross_site(tmp_path, image_size=16, sources="brats,ixi")
    assert two.group_names == ("BraTS2020", "IXI") and len(two.test) < len(ds.test)
    (tmp_path / "ixi").rename(tmp_path / "elsewhere")
    with pytest.raises(DataError, match=r"missing source folder\(s\) .*ixi"):
        load_mri_cross_site(tmp_path)


@pytest.mark.parametrize("name", ["fastmri-brain", "ixi", "brats-mri", "mri-cross-site", "brain-t1-sites"])
def test_missing_files_name_the_path_and_what_to_put_there(tmp_path, name):
    entry = ENTRIES[name]
    folder = tmp_path / (entry.subdir or "")
    folder.mkdir(exist_ok=True)
    with pytest.raises(DataError) as err:
        entry.load(folder)
    message = str(err.value)
    assert str(folder) in message  # which folder was searched
    assert any(example in message for example in ("file_brain_", "IXI002-", "_t1.nii.gz", "colin27_t1"))
    assert str(folder) in entry.describe(str(folder))


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("brats-mri", "test_fraction", 2),
        ("brats-mri", "contrast", "pd"),
        ("brats-mri", "image_size", 3),
        ("brats-mri", "slices", "some"),
        ("brats-mri", "max_volumes", 0),
        ("ixi", "test_fraction", 0),
        ("ixi", "slice_axis", "coronal"),
        ("fastmri-brain", "target", "image"),
        ("mri-cross-site", "sources", "brats,bratz"),
        ("mri-cross-site", "image_size", 3),
        ("mri-cross-site", "max_volumes", -1),
        ("mni152-t1", "sites", 9),
        ("mni152-t1", "image_size", 3),
        ("brain-t1-sites", "image_size", 3),
    ],
)
def test_an_mri_option_error_names_its_dataset_before_any_file_is_read(tmp_path, name, key, value):
    """As every other dataset's option errors do ("image-folder option channels must be ..."): the MRI
    loaders said "test_fraction must be ..." or "unknown BraTS slices ...", and test_fraction was checked
    only after the files were found, so an empty folder hid a wrong value."""
    with pytest.raises(ConfigError, match=rf"^{name} option {key} must be .*{value!r}"):
        ENTRIES[name].load(tmp_path, **{key: value})


# ---------------------------------------------------------------- real-anatomy stand-ins


def test_brain_t1_sites_real_volumes():
    folder = SHARED_DATA / "brain-mri"
    if not (folder / "colin27_t1.nii.gz").is_file():
        pytest.skip(f"the real brain volumes are not under {folder}")
    start = time.process_time()  # CPU time: the wall clock of a shared machine counts its other jobs
    ds = load_brain_t1_sites(folder)
    assert time.process_time() - start < 5
    _check_recon(ds, 64, whole_test_volumes=False)
    assert ds.group_names == ("Colin27", "MNI152-2009a", "patient-1", "patient-2")
    assert np.bincount(ds.train_groups).min() >= 10 and np.bincount(ds.test_groups).min() >= 3
    assert ds.test_meta["subject"].tolist() == ds.test_groups.tolist()  # one volume per site
    with pytest.raises(ConfigError, match="image_size"):
        load_brain_t1_sites(folder, image_size=None)


def test_mni152_sites_need_no_files():
    start = time.process_time()  # CPU time, as above
    ds = load_mni152_t1(image_size=32, sites=4)
    assert time.process_time() - start < 5
    _check_recon(ds, 32, whole_test_volumes=False)
    assert ds.group_names == ("reference", "bias-field-noisy", "low-resolution", "contrast-shift")
    counts = np.bincount(ds.train_groups)
    assert len(counts) == 4 and counts.min() == counts.max() > 20
    x, g = ds.train.x, torch.from_numpy(ds.train_groups)
    reference, noisy = x[g == 0], x[g == 1]
    background = ds.train.y[g == 0] == 0
    assert float(noisy[:, 0][background].std()) > 2 * float(reference[:, 0][background].std())
    two = load_mni152_t1(image_size=32, sites=2)  # deterministic, each site independent of the others
    assert torch.equal(two.train.x, x[g < 2])
    with pytest.raises(ConfigError, match="sites"):
        load_mni152_t1(sites=5)
