"""From a volume's raw slices to training slices: square them, resize them, scale them to [0, 1].

Intensities: negative values (interpolation undershoot in some files) become 0 and each volume is
divided by its maximum over the slices kept, after resizing, so every volume's maximum is exactly 1.
fastMRI's evaluation takes the maximum of each test volume as the data range of PSNR and SSIM; with this
scaling that range is 1 for a volume tested whole. A volume split into slabs (`slab_split`) is scored on
its test slabs alone, against their own maximum, which can be below 1 (0.92-0.99 on `brain-t1-sites` and
`mni152-t1` at 64 px).

Geometry: a non-square slice is zero-padded to a square around its centre (padding adds empty
background, it does not stretch anatomy), then resized with antialiased bilinear interpolation.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedistill.errors import DataError


def center_crop(slices: np.ndarray, height: int, width: int) -> np.ndarray:
    """The central (height, width) window of (..., H, W), as fastMRI's `center_crop` (no-op if smaller)."""
    h, w = slices.shape[-2:]
    height, width = min(height, h), min(width, w)
    top, left = (h - height) // 2, (w - width) // 2
    return slices[..., top : top + height, left : left + width]


def pad_to_square(slices: np.ndarray) -> np.ndarray:
    """(S, H, W) zero-padded around the centre to (S, M, M), M = max(H, W)."""
    s, h, w = slices.shape
    m = max(h, w)
    if h == w:
        return slices
    top, left = (m - h) // 2, (m - w) // 2
    out = np.zeros((s, m, m), dtype=slices.dtype)
    out[:, top : top + h, left : left + w] = slices
    return out


def resize(slices: np.ndarray, size: int | None) -> np.ndarray:
    """Square (S, M, M) slices resized to (S, size, size) (antialiased bilinear); None keeps M."""
    if size is None or slices.shape[-1] == size:
        return slices.astype(np.float32, copy=False)
    x = torch.from_numpy(np.ascontiguousarray(slices, dtype=np.float32))[:, None]
    out = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return out[:, 0].numpy()


def scale_to_unit(slices: np.ndarray, source: str) -> np.ndarray:
    """Negative values to 0, then divided by the maximum: a volume in [0, 1] with maximum 1."""
    if not np.isfinite(slices).all():
        raise DataError(f"{source}: the volume holds NaN or infinite values; replace the file")
    out = np.clip(slices.astype(np.float32, copy=False), 0.0, None)
    peak = float(out.max()) if out.size else 0.0
    if peak <= 0:
        raise DataError(f"{source}: the volume is empty (no positive intensity); replace the file")
    return np.clip(out / peak, 0.0, 1.0)


def prepare(slices: np.ndarray, size: int | None, source: str) -> np.ndarray:
    """Raw (S, H, W) slices -> square, resized, per-volume-maximum-scaled float32 in [0, 1]."""
    return scale_to_unit(resize(pad_to_square(np.clip(slices, 0.0, None)), size), source)


def brain_slices(masks: np.ndarray, min_share: float) -> np.ndarray:
    """Indices of the slices whose foreground area is at least `min_share` of the volume's largest."""
    area = masks.reshape(len(masks), -1).sum(1)
    if area.max(initial=0) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(area >= min_share * area.max())
