"""Brain extraction for scans that keep the skull: the two real lesion patients.

The lesion models here train on skull-stripped brains, as BraTS's are (its scans are skull-stripped
before release). The patients' contrast T1 keeps the whole head, and its scalp fat is as bright as an
enhancing lesion: a model meets the head as a shift of domain and marks the scalp. Two rules, neither a
BET or HD-BET (benchmarks/brain_extraction.py measures both):

- "outline" (the default): the head's outline, slice by slice (the patients' slices are 6.5 mm apart),
  moved inwards by `STRIP_MM`. It keeps some skull where the head is thick and cuts some cortex where it
  is thin, and on the lowest slices it keeps the orbits and the tissue around them, which the models
  mark as lesion. It never looks at intensity inside the head, so it keeps every lesion deeper than it.
- "tissue": from the head `SCALP_MM` inwards, what is at least `TISSUE_LEVEL` of the brain's median
  intensity is tissue; tissue shrunk by `NECK_MM` in each slice breaks at the thin bone between the brain
  and the skull or the orbits, the largest piece connected across slices is the brain, grown back by
  `NECK_MM` within the tissue, closed by `CLOSE_MM` and its holes filled. On the Colin 27 head (T1 without
  contrast) it fits the brain far better than the outline and keeps as much of the semi-synthetic heads'
  lesions. On the two real patients (contrast T1) it does not help: the fat above their orbits touches
  the frontal lobes and stays, and the models score lower on the lesion slices and on the whole volumes
  (docs/methods/fediod/per-pixel-notes.md). An option, for T1 heads like Colin's.

`STRIP_MM` is the depth of best brain-mask Dice on semi-synthetic heads whose brain is known: the real
brains of `brats-synthetic-lesions` inside synthetic CSF, skull and scalp of the thickness ranges of
`lesion_randomisation.HEAD_MM`. The tissue rule's constants were chosen on those heads (with lesions
painted in) and on the real Colin 27 head against its brain mask. The real patients never chose anything.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from fedistill.data import portable_math
from fedistill.data.mri.foreground import foreground_masks, largest_component
from fedistill.errors import ConfigError

#: how far inside the head's outline the brain starts, mm (benchmarks/results/brain_extraction.md)
STRIP_MM = 14.0
#: a pixel is head where it is brighter than this share of the volume's 99th percentile
HEAD_LEVEL = 0.1
#: brain extraction rules: the outline moved inwards, or tissue connected to the brain
RULES = ("outline", "tissue")
#: the tissue rule (benchmarks/results/brain_extraction.md): the outermost mm of the head that are never
#: brain, tissue as a share of the brain's median, the shrinking that breaks bridges, the closing, mm
SCALP_MM = 10.0
TISSUE_LEVEL = 0.6
NECK_MM = 6.0
CLOSE_MM = 10.0


def head_mask(volume: np.ndarray) -> np.ndarray:
    """(Z, H, W) -> the head of every slice: the reconstruction sets' foreground mask (brighter than
    HEAD_LEVEL of the volume's level, closed, holes filled, its largest piece), unsmoothed."""
    return foreground_masks(volume, fraction=HEAD_LEVEL, smooth=0.0)


def inside_distance(head: np.ndarray, pixel_mm: tuple[float, float]) -> np.ndarray:
    """Per slice, how far (mm) each pixel of `head` lies inside its outline; 0 outside."""
    return np.stack([ndimage.distance_transform_edt(s, sampling=pixel_mm) for s in head])


def extraction_rule(skull_strip: bool | str | None) -> str | None:
    """What a `skull_strip` setting asks for: None (no extraction), or one of RULES (True: "outline")."""
    if skull_strip is None or skull_strip is False or skull_strip == "":
        return None
    return _checked("outline" if skull_strip is True else skull_strip)


def _checked(rule: object) -> str:
    if rule not in RULES:
        raise ConfigError(f"unknown brain extraction rule {rule!r}; valid: {', '.join(RULES)}")
    return str(rule)


def extract_brain(
    volume: np.ndarray,
    pixel_mm: tuple[float, float],
    depth_mm: float = STRIP_MM,
    rule: str = "outline",
) -> np.ndarray:
    """(Z, H, W) -> the brain mask by `rule` (see the module's docstring); `pixel_mm`: row and column
    spacing; `depth_mm`: the outline rule's depth."""
    if _checked(rule) == "outline":
        return inside_distance(head_mask(volume), pixel_mm) > depth_mm
    return tissue_brain(volume, pixel_mm)


def _disk(radius_mm: float, pixel_mm: tuple[float, float]) -> np.ndarray:
    """A flat structuring element: the pixels within `radius_mm` of the centre."""
    ry, rx = (int(np.ceil(radius_mm / p)) for p in pixel_mm)
    yy, xx = np.ogrid[-ry : ry + 1, -rx : rx + 1]
    return (yy * pixel_mm[0]) ** 2 + (xx * pixel_mm[1]) ** 2 <= radius_mm**2


def _per_slice(operation, masks: np.ndarray, element: np.ndarray) -> np.ndarray:
    """A 2-D morphological operation on every slice, padded so the image border does not cut it."""
    pad = max(element.shape) // 2 + 1
    return np.stack([operation(np.pad(m, pad), element)[pad:-pad, pad:-pad] for m in masks])


def tissue_brain(
    volume: np.ndarray,
    pixel_mm: tuple[float, float],
    *,
    scalp_mm: float = SCALP_MM,
    level: float = TISSUE_LEVEL,
    neck_mm: float = NECK_MM,
    close_mm: float = CLOSE_MM,
) -> np.ndarray:
    """(Z, H, W) -> the brain by the tissue rule (see the module's docstring), its constants as arguments
    so benchmarks/brain_extraction.py can try others."""
    inside = inside_distance(head_mask(volume), pixel_mm)
    deep = inside > STRIP_MM
    if not deep.any():
        return deep
    candidate = inside > scalp_mm
    threshold = level * float(np.median(volume[deep]))  # the brain's median, found the outline's way
    sigma = (1.0 / pixel_mm[0], 1.0 / pixel_mm[1])  # 1 mm
    smoothed = np.stack([portable_math.gaussian_filter(s.astype(np.float32), sigma) for s in volume])
    tissue = candidate & (smoothed > threshold)
    neck = _disk(neck_mm, pixel_mm)
    core = _per_slice(ndimage.binary_erosion, tissue, neck)
    brain = _per_slice(ndimage.binary_dilation, largest_component(core), neck) & tissue
    if close_mm > 0:
        brain = _per_slice(ndimage.binary_closing, brain, _disk(close_mm, pixel_mm)) & candidate
    return np.stack([ndimage.binary_fill_holes(s) for s in brain])
