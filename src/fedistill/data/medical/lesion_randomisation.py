"""Domain-randomised lesion synthesis (SynthSeg's idea): draw every training subject's appearance at random,
widely enough that a model trained on the painted lesions meets a real scan as one more draw.

The plain synthesis paints T2-like bright lesions into skull-stripped T1 brains, always alike, and a model
trained on it finds nothing in the real patients (contrast T1, skull on, thick slices). Here each subject
gets, from its own seeded generator:

- a random intensity curve over the host's tissues (monotone, T1-like, or not at all), so grey matter,
  white matter and CSF take random contrasts;
- one to `MAX_LESIONS` lesions of random size, shape (deformed ellipsoids), texture and intensity: brighter
  or darker than the brain around them, with or without a bright or dark rim, each at least
  `MIN_CONTRAST` away from the brain's median level so the label stays visible;
- after the host's usual mild change (flip, rotation, shift, gamma, noise: brain_synthetic): a smooth
  multiplicative bias field, blur in-plane and across slices (thick slices), noise, and, around the brain,
  one of `HEADS`: nothing (skull-stripped, as the hosts are), a synthetic head (CSF gap, skull, scalp of
  random thickness and intensity: the scan as taken), or that head cut by `brain_extraction` as the real
  patients are before scoring (some skull left, some cortex cut);
- an intensity scale like the patients': the shown region's 0.5th-99.5th percentiles span 0..1.

The label is the union of the painted lesions' masks, moved with the image, so it stays aligned; where
the extraction cut the image away the label goes too.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage

from fedistill.data import portable_math
from fedistill.data.medical.brain_extraction import STRIP_MM, inside_distance
from fedistill.data.medical.lesions import LesionLook, paint_lesion

RADIUS_MM = (4.0, 30.0)  # equivalent lesion radius, log-uniform: the real lesions are small, the plain big
MAX_LESIONS = 3  # lesions per subject, 1..MAX_LESIONS
MIN_CONTRAST = 0.12  # least |lesion level - brain median| on the remapped [0, 1] scale
CURVE_POINTS = 6  # control points of the random intensity curve
BIAS_STD = (0.0, 0.3)  # std of the log bias field
BLUR_MM = (0.0, 2.0)  # in-plane Gaussian blur sigma
SLICE_BLUR_MM = (0.0, 4.0)  # across-slice blur sigma: the patients' slices are 6.5 mm thick
NOISE_STD = (0.0, 0.06)
#: what surrounds the brain, with its share of the subjects: nothing (skull-stripped, as the hosts are), a
#: synthetic head (the scan as taken), or a synthetic head then brain extraction (`brain_extraction`, as the
#: real patients are scored), which leaves some skull and cuts some cortex
HEADS = {"none": 0.25, "kept": 0.25, "extracted": 0.5}
HEAD_MM = {"csf": (0.5, 4.0), "skull": (3.0, 8.0), "scalp": (3.0, 10.0)}  # layer thickness ranges


def remap_intensities(volume: np.ndarray, brain: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The brain's intensities through a random piecewise-linear curve onto [0, 1]: its values at
    `CURVE_POINTS` levels spanning the brain's range are uniform draws, sorted half of the time (a
    monotone, T1-like contrast) and unsorted otherwise (any order of tissues). Outside the brain stays 0."""
    inside = volume[brain]
    top = float(inside.max()) if inside.size else 1.0
    levels = np.linspace(0.0, max(top, 1e-6), CURVE_POINTS)
    values = rng.uniform(0.0, 1.0, size=CURVE_POINTS)
    if rng.random() < 0.5:
        values = np.sort(values)
    return (np.interp(volume, levels, values) * brain).astype(np.float32)


def draw_random_look(brain_level: float, rng: np.random.Generator) -> LesionLook:
    """A lesion look drawn far wider than `lesions.draw_look`: hyper- or hypo-intense around
    `brain_level` by at least MIN_CONTRAST, core brighter or darker, a bright, dark or no rim."""
    low, high = math.log(RADIUS_MM[0]), math.log(RADIUS_MM[1])  # math, not NumPy: see portable_math
    radius = math.exp(rng.uniform(low, high))
    brighter = rng.random() < 0.6
    room = (1.0 - brain_level) if brighter else brain_level
    contrast = rng.uniform(MIN_CONTRAST, max(MIN_CONTRAST, room))
    level = float(np.clip(brain_level + contrast if brighter else brain_level - contrast, 0.0, 1.0))
    if abs(level - brain_level) < MIN_CONTRAST:  # no room on the drawn side: go the other way
        level = float(np.clip(brain_level + (-contrast if brighter else contrast), 0.0, 1.0))
    core = float(np.clip(level + rng.uniform(-0.3, 0.3), 0.0, 1.0))
    rim = 0.0 if rng.random() < 0.4 else float(rng.uniform(-0.3, 0.3))  # < 0: a bright (enhancing) rim
    return LesionLook(
        radius_mm=radius,
        axes=tuple(float(a) for a in rng.uniform(0.5, 1.5, size=3)),
        roughness=float(rng.uniform(0.1, 0.35)),
        core_fraction=float(rng.uniform(0.2, 0.8)),
        oedema_level=level,
        core_level=core,
        ring_depth=rim,
        texture=float(rng.uniform(0.0, 0.15)),
    )


def paint_random_lesions(
    volume: np.ndarray, brain: np.ndarray, depth: np.ndarray, voxel_mm: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(painted volume, union of the lesions' masks): 1..MAX_LESIONS lesions of random looks, each
    painted over the previous ones."""
    painted, mask = volume, np.zeros(volume.shape, dtype=bool)
    count = int(rng.integers(1, MAX_LESIONS + 1))
    for _ in range(count):
        level = float(np.median(painted[brain & ~mask])) if (brain & ~mask).any() else 0.5
        painted, lesion = paint_lesion(painted, brain, depth, voxel_mm, draw_random_look(level, rng), rng)
        mask |= lesion
    return painted, mask


def _bias_field(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A smooth multiplicative field: log-normal values on a coarse 4x4x4 grid, cubic-interpolated."""
    std = rng.uniform(*BIAS_STD)
    coarse = rng.standard_normal((4, 4, 4)) * std
    zoom = [n / 4 for n in shape]
    fine = ndimage.zoom(coarse, zoom, order=3, mode="nearest")[: shape[0], : shape[1], : shape[2]]
    return portable_math.exp(fine).astype(np.float32)


def synthetic_head(
    image: np.ndarray, brain: np.ndarray, voxel_mm: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The stack with layers of CSF, skull and scalp around the brain (thickness and intensity random),
    and the head's mask; the layers follow the brain's outline, slice by slice."""
    # in-plane distance, slice by slice (the patients' slices are far apart); no head where no brain
    outside_mm = np.stack(
        [
            ndimage.distance_transform_edt(~b) * voxel_mm if b.any() else np.full(b.shape, np.inf)
            for b in brain
        ]
    )
    out = image.copy()
    edge = 0.0
    for layer, (low, high) in HEAD_MM.items():
        thickness = float(rng.uniform(low, high))
        level = float(rng.uniform(0.0, 0.3) if layer == "csf" else rng.uniform(0.0, 1.0))
        texture = portable_math.gaussian_filter(rng.standard_normal(image.shape).astype(np.float32), 1.0)
        shell = (outside_mm > edge) & (outside_mm <= edge + thickness)
        out[shell] = np.clip(level * (1.0 + 0.1 * texture[shell] / max(float(texture.std()), 1e-8)), 0, 1)
        edge += thickness
    return out, brain | (outside_mm <= edge)


def corrupt(
    image: np.ndarray, brain: np.ndarray, voxel_mm: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The randomised acquisition of an axial stack (Z, H, W) in [0, 1], and the region it shows: what
    surrounds the brain drawn from HEADS (nothing; a head; a head, then `brain_extraction`'s cut), bias
    field, blur (in-plane and across slices), noise, and the patients' intensity scale (the region's
    0.5th-99.5th percentiles span 0..1). Geometry is unchanged; outside the region the image is 0."""
    head = brain
    surround = rng.choice(list(HEADS), p=list(HEADS.values())) if brain.any() else "none"
    if surround != "none":
        image, head = synthetic_head(image, brain, voxel_mm, rng)
    image = image * _bias_field(image.shape, rng)
    sigma_xy = rng.uniform(*BLUR_MM) / voxel_mm
    sigma_z = rng.uniform(*SLICE_BLUR_MM) / voxel_mm
    image = portable_math.gaussian_filter(image, sigma=(sigma_z, sigma_xy, sigma_xy))
    image = image + rng.standard_normal(image.shape).astype(np.float32) * rng.uniform(*NOISE_STD)
    if surround == "extracted":  # what the real patients go through: the outline moved STRIP_MM inwards
        head = inside_distance(head, (voxel_mm, voxel_mm)) > STRIP_MM
    image = image * head
    if head.any():
        lo, hi = np.percentile(image[head], [0.5, 99.5])
        image = (image - lo) / max(float(hi - lo), 1e-8) * head
    return np.clip(image, 0.0, 1.0).astype(np.float32), head
