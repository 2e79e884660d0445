"""Domain-randomised lesion synthesis: deterministic per seed, within its stated ranges, labels aligned
with the painted lesions, and the dataset option checked in one line."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from fedistill.data.medical import brain_synthetic
from fedistill.data.medical import lesion_randomisation as rnd
from fedistill.errors import ConfigError

VOXEL_MM = 4.0


def _host() -> brain_synthetic.Host:
    """A small ball-shaped "brain" with three tissue levels (the hosts' [0, HOST_PEAK] scale)."""
    zz, yy, xx = np.mgrid[:32, :32, :32]
    radius = np.sqrt((zz - 16) ** 2 + (yy - 16) ** 2 + (xx - 16) ** 2)
    brain = radius < 13
    volume = np.select([radius < 5, radius < 9, brain], [0.75, 0.5, 0.25], 0.0).astype(np.float32)
    return brain_synthetic.Host("ball", volume, brain, ndimage.distance_transform_edt(brain), VOXEL_MM)


def _subject(seed: int, randomised: bool = True) -> brain_synthetic.SubjectSlices:
    rng = np.random.default_rng(seed)
    return brain_synthetic.synthetic_subject(_host(), "s", rng, "tumour", 32, randomised)


def test_randomised_subject_is_deterministic_per_seed_and_differs_between_seeds():
    first, again, other = _subject(3), _subject(3), _subject(4)
    assert np.array_equal(first.images, again.images) and np.array_equal(first.masks, again.masks)
    assert not np.array_equal(first.images, other.images) or not np.array_equal(first.masks, other.masks)


def test_randomised_masks_are_binary_and_the_kept_slices_show_the_lesion():
    for seed in range(4):
        subject = _subject(seed)
        assert set(np.unique(subject.masks).tolist()) <= {0, 1} and subject.tumour_voxels > 0
        shown = subject.masks.reshape(len(subject.masks), -1).any(axis=1)
        assert shown.mean() > 0.5  # slices kept for their lesion (a sliver may vanish when resized)


def test_remap_keeps_the_range_and_the_background():
    host = _host()
    curves = []
    for seed in range(6):
        out = rnd.remap_intensities(host.volume, host.brain, np.random.default_rng(seed))
        assert out.min() >= 0.0 and out.max() <= 1.0 and (out[~host.brain] == 0).all()
        curves.append(tuple(np.round([out[16, 16, 16], out[16, 16, 23], out[16, 16, 27]], 4)))
    assert len(set(curves)) == 6  # each seed gives the tissues other levels


@pytest.mark.parametrize("brain_level", [0.05, 0.5, 0.95])
def test_lesion_looks_stay_in_their_ranges_and_visible(brain_level):
    rng = np.random.default_rng(0)
    looks = [rnd.draw_random_look(brain_level, rng) for _ in range(200)]
    for look in looks:
        assert rnd.RADIUS_MM[0] <= look.radius_mm <= rnd.RADIUS_MM[1]
        assert all(0.5 <= a <= 1.5 for a in look.axes)
        assert 0.0 <= look.oedema_level <= 1.0 and 0.0 <= look.core_level <= 1.0
        assert abs(look.oedema_level - brain_level) >= rnd.MIN_CONTRAST - 1e-9
        assert -0.3 <= look.ring_depth <= 0.3
    brighter = sum(look.oedema_level > brain_level for look in looks)
    if brain_level == 0.5:  # both hyper- and hypo-intense lesions, with and without a rim
        assert 0 < brighter < len(looks)
        assert any(look.ring_depth == 0 for look in looks) and any(look.ring_depth < 0 for look in looks)


def test_painted_lesions_match_their_mask():
    host = _host()
    for seed in range(5):
        rng = np.random.default_rng(seed)
        volume = rnd.remap_intensities(host.volume, host.brain, rng)
        painted, mask = rnd.paint_random_lesions(volume, host.brain, host.depth, VOXEL_MM, rng)
        assert mask.dtype == bool and mask.any() and not (mask & ~host.brain).any()
        near = ndimage.binary_dilation(mask, iterations=8)
        assert np.array_equal(painted[~near], volume[~near])  # nothing painted away from the label
        assert (painted[mask] != volume[mask]).mean() > 0.9  # the label is where the paint is


def test_corruption_keeps_geometry_and_range():
    host = _host()
    stack = np.ascontiguousarray(host.volume.transpose(2, 0, 1))
    brain = host.brain.transpose(2, 0, 1)
    surrounds = set()
    for seed in range(12):
        out, shown = rnd.corrupt(stack, brain, VOXEL_MM, np.random.default_rng(seed))
        assert out.shape == stack.shape and out.dtype == np.float32
        assert out.min() >= 0.0 and out.max() <= 1.0 and not out[~shown].any()
        if np.array_equal(shown, brain):
            surrounds.add("none")
        elif shown[brain].all():  # a whole head around the brain
            assert (shown & ~brain).any()
            surrounds.add("kept")
        else:  # the head cut STRIP_MM inside its outline: mostly brain, some of it cut
            assert (shown & brain).sum() > 0.5 * shown.sum()
            surrounds.add("extracted")
    assert surrounds == set(rnd.HEADS)


def test_plain_synthesis_is_untouched_by_the_option():
    plain = brain_synthetic.load_mni152_synthetic(image_size=16, train_subjects=2, test_subjects=1)
    named = brain_synthetic.load_mni152_synthetic(
        image_size=16, train_subjects=2, test_subjects=1, synthesis="plain", randomised_fraction=0.5
    )
    randomised = brain_synthetic.load_mni152_synthetic(
        image_size=16, train_subjects=2, test_subjects=1, synthesis="randomised"
    )
    assert np.array_equal(plain.train.x.numpy(), named.train.x.numpy())
    assert np.array_equal(plain.test.x.numpy(), randomised.test.x.numpy())  # the test subjects stay plain
    assert not np.array_equal(plain.train.x.numpy()[:1], randomised.train.x.numpy()[:1])


@pytest.mark.parametrize(
    ("synthesis", "fraction", "message"),
    [
        ("wild", 1.0, "option synthesis must be one of plain, randomised; got 'wild'"),
        ("randomised", 0, "option randomised_fraction must be a positive number, got 0"),
        ("randomised", 1.5, "option randomised_fraction must be at most 1.0, got 1.5"),
        ("randomised", "half", "option randomised_fraction must be a positive number, got 'half'"),
    ],
)
def test_option_values_are_checked_in_one_line(synthesis, fraction, message):
    with pytest.raises(ConfigError) as error:
        brain_synthetic.randomised_share("mni152-synthetic-lesions", synthesis, fraction)
    assert str(error.value) == f"mni152-synthetic-lesions {message}" and "\n" not in str(error.value)


def test_randomised_share():
    assert brain_synthetic.randomised_share("d", "plain", 1.0) == 0.0
    assert brain_synthetic.randomised_share("d", " Randomised ", 0.25) == 0.25


def _benchmark():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import lesion_randomisation as benchmark

    return benchmark


def test_the_benchmark_cites_its_command_without_one_machine_s_folders():
    shown = _benchmark().shown_arguments(
        ["--methods", "centralized", "--out", "/x/runs", "--results=/x/res", "--data-dir", "d", "--reuse"]
    )
    assert shown == ["--methods", "centralized", "--reuse"]


def test_the_real_lesions_visibility_is_measured_on_what_the_models_see():
    """Patient 1's lesion is brighter than its surroundings on every slice; patient 2's is a few pixels at
    64 px (the benchmark's reading of why nothing finds it). Skipped without the real patients' files."""
    import argparse

    from conftest import SHARED_DATA

    if not (SHARED_DATA / "brain-mri" / "lesion_brain1_image.nii.gz").is_file():
        pytest.skip(f"the real lesion patients are not under {SHARED_DATA}")
    args = argparse.Namespace(
        data_dir=str(SHARED_DATA), image_size=64, real_skull="stripped", real_intensity="brain-median"
    )
    slices = _benchmark().lesion_visibility(args)
    first = [s for s in slices if s["patient"] == 1]
    second = [s for s in slices if s["patient"] == 2]
    assert first and second
    # on the training brains' scale by the brain's median (skull stripped), what the models are given
    assert all(s["contrast"] > 0.24 for s in first)
    assert max(s["pixels"] for s in second) < 10 < min(s["pixels"] for s in first)
    assert all(abs(s["contrast"]) < 0.21 for s in second)
    # by the percentile rule the brightest voxels set the scale and every lesion shows about half as bright
    by_percentile = _benchmark().lesion_visibility(
        argparse.Namespace(**{**vars(args), "real_intensity": "percentile"})
    )
    assert all(p["contrast"] < 0.65 * s["contrast"] for p, s in zip(by_percentile, slices, strict=True))
