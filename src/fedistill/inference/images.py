"""Image files in and label images out for `fedistill predict`: files are read as the training loaders
read them (`fedistill.data.image_files`: uint8, channels converted, Pillow's bilinear resize); label maps
are resized back by nearest neighbour, so no label is invented, and written as PNGs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from fedistill.data.image_files import CHANNEL_NAMES, model_image, read_image, resize_image, to_channels
from fedistill.errors import DataError

__all__ = [
    "CHANNEL_NAMES",
    "model_image",
    "nearest_resize",
    "read_image",
    "resize_image",
    "to_channels",
    "write_labels",
]


def nearest_resize(labels: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Label maps (..., h, w) to (..., H, W) by nearest neighbour (pixel centres), values unchanged."""
    h, w = labels.shape[-2:]
    height, width = shape
    if (h, w) == (height, width):
        return labels
    rows = np.minimum(((np.arange(height) + 0.5) * h / height).astype(np.int64), h - 1)
    cols = np.minimum(((np.arange(width) + 0.5) * w / width).astype(np.int64), w - 1)
    return labels[..., rows[:, None], cols[None, :]]


def write_labels(path: Path, labels: np.ndarray, dtype: type = np.uint8) -> None:
    """A label map (H, W) as a PNG of its values (uint8, or uint16 for instance maps)."""
    limit = np.iinfo(dtype).max
    if labels.size and int(labels.max()) > limit:
        raise DataError(f"{path}: {int(labels.max())} labels do not fit a {np.dtype(dtype).name} PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(labels.astype(dtype))).save(path)
