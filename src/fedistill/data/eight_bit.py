"""Images stored with more than 8 bits (16-bit PNG or TIFF, float TIFF) as uint8, by one rule that the
training loaders (`image-folder`, the nuclei sets) and `predict` share, so a model sees the same pixels
in both: each image scaled by its own maximum to 255 (negative and non-finite values to 0). A fixed
65535 would leave 12-bit data stored in 16 bits 16 grey levels; Pillow's own conversion clips at 255."""

from __future__ import annotations

import numpy as np

#: Pillow's modes of grey images with more than 8 bits (16-bit integers, 32-bit integers or floats).
WIDE_GREY_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I", "F"})


def to_uint8(array: np.ndarray) -> np.ndarray:
    """`array` as uint8: unchanged if it is, booleans as 0/255, anything else scaled by its maximum."""
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if array.dtype == bool:
        return array.astype(np.uint8) * 255
    values = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0).clip(min=0.0)
    peak = float(values.max()) if values.size else 0.0
    return np.round(values * (255.0 / max(peak, 1e-12))).astype(np.uint8)
