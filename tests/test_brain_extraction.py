"""Brain extraction for scans that keep the skull: the head found by intensity, the brain a set depth
inside its outline, the extracted brain put on the training brains' scale by its median, and the real
patients scored either way."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from conftest import SHARED_DATA
from fedistill.data.medical import brain_extraction as bx
from fedistill.data.medical.brain_synthetic import (
    COLIN27,
    HOST_MEDIAN,
    HOST_PEAK,
    MNI152,
    load_brats_synthetic,
    load_host,
    load_real_lesions,
    scan_scale,
)
from fedistill.data.medical.volumes import axial_slices, read_volume
from fedistill.errors import ConfigError

PIXEL_MM = 1.0


def _head(size: int = 160, brain_r: float = 50.0, layers=((2, 0.05), (6, 0.02), (6, 1.0))):
    """One slice of a T1-like head: a grey brain disc, then CSF (dark), skull (dark), scalp (bright, like
    fat), and a bright speck of noise outside; the true brain mask."""
    yy, xx = np.mgrid[:size, :size] - size / 2
    r = np.hypot(yy, xx)
    image = np.where(r <= brain_r, 0.4, 0.0)
    edge = brain_r
    for thickness, level in layers:
        image = np.where((r > edge) & (r <= edge + thickness), level, image)
        edge += thickness
    image[3:5, 3:5] = 1.0  # a speck outside the head
    return image[None].astype(np.float32), (r <= brain_r)[None]


def test_the_head_is_filled_through_its_dark_skull_and_keeps_no_speck():
    image, brain = _head()
    head = bx.head_mask(image)
    assert head[brain].all()  # the dark CSF and skull between brain and scalp are inside the head
    assert not head[0, 3:5, 3:5].any()
    yy, xx = np.mgrid[:160, :160] - 80
    assert not head[0][np.hypot(yy, xx) > 64.5].any()  # nothing beyond the scalp


def test_the_brain_starts_strip_mm_inside_the_outline():
    image, brain = _head()  # 14 mm of CSF, skull and scalp: the depth STRIP_MM expects on average
    found = bx.extract_brain(image, (PIXEL_MM, PIXEL_MM))
    dice = 2 * (found & brain).sum() / (found.sum() + brain.sum())
    assert dice > 0.97
    deeper = bx.extract_brain(image, (PIXEL_MM, PIXEL_MM), depth_mm=30.0)
    assert deeper.sum() < found.sum() and not (deeper & ~found).any()
    # the same head on 2 mm pixels: the depth is in millimetres, not pixels
    coarse = bx.extract_brain(image[:, ::2, ::2], (2.0, 2.0))
    assert abs(coarse.sum() * 4 - found.sum()) < 0.05 * found.sum()


def _head_with_orbit(slices: int = 5):
    """A stack of T1-like head slices at 1 mm: a grey brain disc (0.4) with a bright enhancing lesion at its
    edge (0.9) and a dark one enclosed in it (0.1); dark CSF and skull, a bright scalp (1.0); and in front
    of the brain, inside the same skull, an orbit of bright fat (0.8) that a 3 mm line of bone separates
    from the brain. Returns the image, the brain (lesions included), the orbit and the lesions."""
    size = 160
    yy, xx = np.mgrid[:size, :size] - size / 2
    r = np.hypot(yy, xx)
    brain = (r <= 45) & ~((yy < -20) & (np.abs(xx) < 22))  # a notch where the orbit sits
    orbit = np.hypot(yy + 33, xx) <= 9
    image = np.zeros((size, size), np.float32)
    image[(r > 47) & (r <= 53)] = 0.02  # skull
    image[(r > 53) & (r <= 60)] = 1.0  # scalp
    image[brain] = 0.4
    image[orbit] = 0.8
    bright = np.hypot(yy, xx - 40) <= 4  # at the brain's edge
    dark = np.hypot(yy - 10, xx + 10) <= 5  # enclosed in the brain
    image[bright], image[dark] = 0.9, 0.1
    stack = lambda a: np.repeat(a[None], slices, axis=0)  # noqa: E731
    return stack(image), stack(brain), stack(orbit), stack(bright), stack(dark)


def test_the_tissue_rule_drops_an_orbit_that_the_outline_keeps_and_keeps_the_lesions():
    image, brain, orbit, bright, dark = _head_with_orbit()
    outline = bx.extract_brain(image, (PIXEL_MM, PIXEL_MM))
    tissue = bx.extract_brain(image, (PIXEL_MM, PIXEL_MM), rule="tissue")
    assert outline[orbit].mean() > 0.9  # the orbit lies deeper than STRIP_MM inside the head
    assert tissue[orbit].mean() < 0.05
    assert tissue[bright].all() and tissue[dark].all()
    dice = 2 * (tissue & brain).sum() / (tissue.sum() + brain.sum())
    assert dice > 0.95
    with pytest.raises(ConfigError, match="unknown brain extraction rule 'bet'; valid: outline, tissue"):
        bx.extract_brain(image, (PIXEL_MM, PIXEL_MM), rule="bet")


def test_a_skull_strip_setting_names_a_rule():
    assert bx.extraction_rule(True) == "outline" and bx.extraction_rule("tissue") == "tissue"
    assert bx.extraction_rule(False) is None and bx.extraction_rule("") is None
    with pytest.raises(ConfigError, match="valid: outline, tissue"):
        bx.extraction_rule("hd-bet")


def test_the_tissue_rule_fits_the_real_colin27_head_better_than_the_outline():
    """The Colin 27 T1 keeps its skull, orbits and neck; its brain mask is known. Every 7th slice, as far
    apart as the real patients' slices."""
    folder = SHARED_DATA / "brain-mri"
    if not (folder / "colin27_t1.nii.gz").is_file() or not (folder / COLIN27).is_file():
        pytest.skip(f"the Colin 27 head is not under {SHARED_DATA}")
    head = axial_slices(read_volume(folder / "colin27_t1.nii.gz")[0])[3::7]
    truth = axial_slices(read_volume(folder / COLIN27)[0])[3::7] > 0
    truth = np.stack([ndimage.binary_fill_holes(s) for s in truth])
    scored = truth.sum(axis=(1, 2)) >= 0.2 * truth.sum(axis=(1, 2)).max()

    def dice(mask):
        m, t = mask[scored], truth[scored]
        return 2 * (m & t).sum() / (m.sum() + t.sum())

    outline, tissue = (dice(bx.extract_brain(head, (1.0, 1.0), rule=r)) for r in bx.RULES)
    assert outline < 0.86 and tissue > 0.88 and tissue > outline + 0.04


def test_the_chosen_tissue_constants_are_the_recorded_ones():
    import json
    from pathlib import Path

    record = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "brain_extraction.json"
    chosen = json.loads(record.read_text())["tissue_chosen"]
    assert (chosen["scalp_mm"], chosen["level"], chosen["neck_mm"], chosen["close_mm"]) == (
        bx.SCALP_MM,
        bx.TISSUE_LEVEL,
        bx.NECK_MM,
        bx.CLOSE_MM,
    )


def test_the_chosen_depth_is_the_recorded_one():
    import json
    from pathlib import Path

    record = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "brain_extraction.json"
    assert json.loads(record.read_text())["chosen_mm"] == bx.STRIP_MM


def _require_patients():
    if not (SHARED_DATA / "brain-mri" / "lesion_brain1_image.nii.gz").is_file():
        pytest.skip(f"the real lesion patients are not under {SHARED_DATA}")


def test_the_real_patients_are_scored_brain_extracted_by_default():
    _require_patients()
    folder = SHARED_DATA / "brain-mri"
    stripped = load_real_lesions(folder, image_size=64)
    whole = load_real_lesions(folder, image_size=64, skull="on")
    assert len(stripped.test.y) == len(whole.test.y) == 10  # the lesion slices, both ways
    assert (stripped.test.y == whole.test.y).all()
    x, on = stripped.test.x.float() / 255, whole.test.x.float() / 255
    assert abs(x[x > 0].median().item() - HOST_MEDIAN) < 0.05  # the training brains' scale, by the median
    assert ((x > 0).sum() < 0.8 * (on > 0.05).sum()).item()  # the head around the brain is gone
    by_percentile = load_real_lesions(folder, image_size=64, intensity="percentile").test.x.float() / 255
    assert by_percentile.max() <= HOST_PEAK + 1e-6 < on.max()
    # the patients' brightest voxels set the percentile scale: their brains sit far below the hosts'
    assert by_percentile[by_percentile > 0].median().item() < HOST_MEDIAN - 0.1
    with_real = load_brats_synthetic(folder, image_size=32, train_subjects=2, test_subjects=1, real_test=True)
    assert with_real.test.x.shape[0] > 10


def test_a_skull_option_must_be_stripped_or_on():
    _require_patients()
    with pytest.raises(ConfigError, match="skull must be one of stripped, stripped-tissue, on"):
        load_real_lesions(SHARED_DATA / "brain-mri", image_size=64, skull="off")
    with pytest.raises(ConfigError, match="real_skull must be one of stripped, stripped-tissue, on"):
        load_brats_synthetic(SHARED_DATA / "brain-mri", image_size=32, train_subjects=2, real_skull="yes")
    with pytest.raises(ConfigError, match="intensity must be one of brain-median, percentile"):
        load_real_lesions(SHARED_DATA / "brain-mri", image_size=64, intensity="max")


def _brain_with_bright_part(bright_share: float) -> tuple[np.ndarray, np.ndarray]:
    """A volume whose brain is normal tissue around 100 with `bright_share` of it at 400 (an enhancing
    lesion, vessels), zero outside; and its brain mask."""
    rng = np.random.default_rng(0)
    volume = np.zeros((4, 40, 40), np.float32)
    brain = np.zeros_like(volume, dtype=bool)
    brain[:, 5:35, 5:35] = True
    volume[brain] = rng.normal(100.0, 10.0, brain.sum())
    bright = brain & (rng.random(volume.shape) < bright_share)
    volume[bright] = 400.0
    return volume, brain


def test_a_scan_meets_the_hosts_by_its_brain_median_whatever_its_bright_part():
    normal = {}
    for share in (0.002, 0.03):
        volume, brain = _brain_with_bright_part(share)
        scaled = scan_scale(volume, brain)
        assert (scaled[~brain] == 0).all() and scaled.max() <= 1.0
        tissue = brain & (volume < 300)
        normal[share] = float(np.median(scaled[tissue]))
        # zero stays zero: one factor, the hosts' median over the brain's
        np.testing.assert_allclose(scaled[tissue], volume[tissue] * HOST_MEDIAN / np.median(volume[brain]),
                                   rtol=1e-5)  # fmt: skip
        by_percentile = scan_scale(volume, brain, "percentile")
        assert by_percentile.max() <= HOST_PEAK + 1e-6
        normal[f"percentile {share}"] = float(np.median(by_percentile[tissue]))
    assert abs(normal[0.002] - HOST_MEDIAN) < 0.01 and abs(normal[0.03] - HOST_MEDIAN) < 0.02
    # by percentiles the bright part decides where normal tissue lands: 0.2% or 3% of it moves it a lot
    assert normal["percentile 0.002"] - normal["percentile 0.03"] > 0.1
    with pytest.raises(ValueError, match="unknown scan scale 'max'"):
        scan_scale(volume, brain, "max")


def test_host_median_is_the_hosts_own():
    folder = SHARED_DATA / "brain-mri"
    if not (folder / COLIN27).is_file() or not (folder / MNI152).is_file():
        pytest.skip(f"the host brains are not under {SHARED_DATA}")
    medians = []
    for path, name in ((COLIN27, "colin27"), (MNI152, "mni152")):
        host = load_host(str(folder / path), name, 240)  # 1 mm voxels, their own resolution
        medians.append(float(np.median(host.volume[host.brain])))
    assert abs(np.mean(medians) - HOST_MEDIAN) < 0.005
