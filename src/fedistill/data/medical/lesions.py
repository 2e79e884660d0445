"""Synthetic tumour-like lesions painted into real brain volumes: the ground truth of the semi-synthetic
brain sets.

A lesion is built in 3D, so consecutive slices agree: an ellipsoid with random axes and orientation,
its boundary made irregular by smoothed noise (a "deformed ellipsoid"). Its whole extent is the label
(the "whole tumour" of BraTS: core plus oedema). Inside, intensities look the way T2 shows a glioma: an
oedema-like halo brighter than white matter, a brighter core, a darker ring at the core's rim, and a
texture of smoothed noise; the edge fades over a few voxels, so the boundary is not a free step edge.
Lesion size is drawn log-uniformly over a wide range (equivalent radius 6-30 mm, about 1-110 cm³), so
sorting subjects by lesion volume gives sites that differ as Chang et al.'s size-sorted BraTS sites do.
The host's intensities are in [0, 1] with its brain below the lesions' levels (see brain_synthetic), and
lesions are kept inside the host's brain mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from fedistill.data import portable_math

RADIUS_MM = (6.0, 30.0)  # equivalent radius range of the whole lesion, drawn log-uniformly
EDGE = 0.15  # width of the fading edge, as a fraction of the lesion radius


@dataclass(frozen=True)
class LesionLook:
    """Intensities (in the host's [0, 1] scale) and shape parameters of one lesion."""

    radius_mm: float
    axes: tuple[float, float, float]  # relative ellipsoid axes
    roughness: float  # amplitude of the boundary's noise, relative to the radius
    core_fraction: float  # core radius / whole radius
    oedema_level: float
    core_level: float
    ring_depth: float  # how much darker the core's rim is
    texture: float  # std of the multiplicative texture


def draw_look(rng: np.random.Generator) -> LesionLook:
    """A random lesion look: its size (log-uniform radius), shape, roughness and intensities."""
    low, high = math.log(RADIUS_MM[0]), math.log(RADIUS_MM[1])  # math, not NumPy: see portable_math
    return LesionLook(
        radius_mm=math.exp(rng.uniform(low, high)),
        axes=tuple(float(a) for a in rng.uniform(0.7, 1.3, size=3)),
        roughness=float(rng.uniform(0.1, 0.3)),
        core_fraction=float(rng.uniform(0.35, 0.65)),
        oedema_level=float(rng.uniform(0.85, 0.95)),
        core_level=float(rng.uniform(0.95, 1.0)),
        ring_depth=float(rng.uniform(0.15, 0.3)),
        texture=float(rng.uniform(0.03, 0.08)),
    )


def _centre(depth: np.ndarray, radius: float, rng: np.random.Generator) -> np.ndarray:
    """A random brain voxel at least half a radius deep inside the brain (or as deep as the brain allows)."""
    need = min(max(2.0, 0.5 * radius), 0.8 * float(depth.max()))
    candidates = np.flatnonzero(depth.ravel() >= need)
    return np.array(np.unravel_index(candidates[rng.integers(candidates.size)], depth.shape))


def paint_lesion(
    volume: np.ndarray,
    brain: np.ndarray,
    depth: np.ndarray,
    voxel_mm: float,
    look: LesionLook,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """(painted volume, whole-lesion mask): `volume` in [0, 1], `brain` its mask, `depth` the brain's
    distance transform in voxels (computed once per host)."""
    radius = look.radius_mm / voxel_mm
    centre = _centre(depth, radius, rng)
    half = int(np.ceil(radius * max(look.axes) * (1 + 2 * look.roughness))) + 2
    lo = np.maximum(centre - half, 0)
    hi = np.minimum(centre + half + 1, volume.shape)
    box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
    grids = np.meshgrid(*(np.arange(a, b) - c for a, b, c in zip(lo, hi, centre, strict=True)), indexing="ij")
    offsets = np.stack([g.ravel() for g in grids]).astype(np.float64)
    rotated = Rotation.random(rng=rng).as_matrix() @ offsets
    scale = radius * np.asarray(look.axes)[:, None]
    rho = np.sqrt(((rotated / scale) ** 2).sum(axis=0)).reshape(grids[0].shape)
    smooth = portable_math.gaussian_filter(rng.standard_normal(rho.shape), sigma=max(1.0, 0.35 * radius))
    rho = rho * (1.0 + look.roughness * smooth / max(float(smooth.std()), 1e-8))

    inside = brain[box]
    weight = np.clip((1.0 - rho) / EDGE, 0.0, 1.0) * inside
    core = np.clip((look.core_fraction - rho) / (EDGE * look.core_fraction), 0.0, 1.0)
    ring = portable_math.exp(-(((rho - look.core_fraction) / 0.06) ** 2))
    target = look.oedema_level + (look.core_level - look.oedema_level) * core - look.ring_depth * ring
    texture = portable_math.gaussian_filter(rng.standard_normal(rho.shape), sigma=1.0)
    target = target * (1.0 + look.texture * texture / max(float(texture.std()), 1e-8))

    painted = volume.copy()
    painted[box] = np.clip(volume[box] * (1.0 - weight) + target * weight, 0.0, 1.0)
    mask = np.zeros(volume.shape, dtype=bool)
    mask[box] = weight >= 0.5
    return painted.astype(np.float32), mask
