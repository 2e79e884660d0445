"""The foreground mask of a slice: the imaged head (or brain, for skull-stripped data) as one solid blob.

It is the target `y` of a reconstruction set: FedIOD conditions its generator "only on the contour of
the foreground of the brain". Per slice:

1. smooth with a Gaussian (sigma = `smooth` pixels), so background noise does not cross the threshold;
2. threshold at `fraction` of the volume's reference level, the 99th percentile of its non-zero voxels
   (a robust maximum: a few hot voxels, e.g. contrast-filled vessels, do not move it);
3. close small gaps (one closing by the 3x3 cross applied twice: two dilations, then two erosions)
   and fill holes, so a bright scalp ring and the darker skull, CSF and brain inside it become one
   object, not a ring and a separate brain;
4. keep the largest connected component (drops noise specks and detached bits such as the neck's
   cross-section off the head's edge), then fill its holes again.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from fedistill.data import portable_math

DEFAULT_FRACTION = 0.1
DEFAULT_SMOOTH = 1.0


def reference_level(volume: np.ndarray) -> float:
    """The 99th percentile of a volume's non-zero voxels (0 for an empty volume)."""
    nonzero = volume[volume > 0]
    return float(np.percentile(nonzero, 99)) if nonzero.size else 0.0


def foreground_mask(
    image: np.ndarray, level: float, fraction: float = DEFAULT_FRACTION, smooth: float = DEFAULT_SMOOTH
) -> np.ndarray:
    """The (H, W) bool foreground of one slice; `level` is its volume's `reference_level`."""
    if level <= 0:
        return np.zeros(image.shape, dtype=bool)
    smoothed = portable_math.gaussian_filter(image.astype(np.float32), smooth) if smooth > 0 else image
    mask = smoothed > fraction * level
    if not mask.any():
        return mask
    padded = np.pad(mask, 2)  # closing next to the border must not erode pixels on it
    mask = ndimage.binary_fill_holes(ndimage.binary_closing(padded, iterations=2)[2:-2, 2:-2])
    return ndimage.binary_fill_holes(largest_component(mask))


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest face-connected piece of `mask` (2-D or 3-D); the mask itself when it has one or none."""
    labels, count = ndimage.label(mask)
    if count <= 1:
        return mask
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return labels == int(sizes.argmax())


def foreground_masks(
    slices: np.ndarray, fraction: float = DEFAULT_FRACTION, smooth: float = DEFAULT_SMOOTH
) -> np.ndarray:
    """(S, H, W) bool masks of a volume's slices (S, H, W), thresholded against the whole volume."""
    level = reference_level(slices)
    out = np.zeros(slices.shape, dtype=bool)
    for i, image in enumerate(slices):
        out[i] = foreground_mask(image, level, fraction, smooth)
    return out
