"""Brain extraction for scans that keep the skull: the two real lesion patients.

The lesion models here train on skull-stripped brains, as BraTS's are (its scans are skull-stripped
before release). The patients' contrast T1 keeps the whole head, and its scalp fat is as bright as an
enhancing lesion: a model meets the head as a shift of domain and marks the scalp. `extract_brain` takes
the head away the simple way: the head's outline, slice by slice (the patients' slices are 6.5 mm apart),
moved inwards by `STRIP_MM`.

`STRIP_MM` is the depth of best brain-mask Dice on semi-synthetic heads whose brain is known: the real
brains of `brats-synthetic-lesions` inside synthetic CSF, skull and scalp of the thickness ranges of
`lesion_randomisation.HEAD_MM` (benchmarks/brain_extraction.py). The real patients never chose it. This
is no BET or HD-BET: an outline moved inwards keeps some skull where the head is thick and cuts some
cortex where it is thin.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from fedistill.data.mri.foreground import foreground_masks

#: how far inside the head's outline the brain starts, mm (benchmarks/results/brain_extraction.md)
STRIP_MM = 14.0
#: a pixel is head where it is brighter than this share of the volume's 99th percentile
HEAD_LEVEL = 0.1


def head_mask(volume: np.ndarray) -> np.ndarray:
    """(Z, H, W) -> the head of every slice: the reconstruction sets' foreground mask (brighter than
    HEAD_LEVEL of the volume's level, closed, holes filled, its largest piece), unsmoothed."""
    return foreground_masks(volume, fraction=HEAD_LEVEL, smooth=0.0)


def inside_distance(head: np.ndarray, pixel_mm: tuple[float, float]) -> np.ndarray:
    """Per slice, how far (mm) each pixel of `head` lies inside its outline; 0 outside."""
    return np.stack([ndimage.distance_transform_edt(s, sampling=pixel_mm) for s in head])


def extract_brain(
    volume: np.ndarray, pixel_mm: tuple[float, float], depth_mm: float = STRIP_MM
) -> np.ndarray:
    """(Z, H, W) -> the brain mask: the pixels more than `depth_mm` inside the head's outline, per slice
    (`pixel_mm`: row and column spacing)."""
    return inside_distance(head_mask(volume), pixel_mm) > depth_mm
