"""NIfTI volumes as stacks of axial slices, with errors that name the file.

Axial means: the volume is first turned to its closest canonical orientation (RAS+: voxel axes run
to the subject's right, anterior, superior, as `nibabel.as_closest_canonical` does), then cut along
the superior axis, inferior slice first. Each slice is shown with anterior at the top (row 0) and the
subject's left on column 0. Files written in any voxel order thus give the same kind of slice.
`axis="stored"` instead cuts along the file's third voxel axis as it is, which is what converters
that slice a volume array directly do (e.g. Guo et al.'s BraTS script).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

from fedistill.errors import ConfigError, DataError

SLICE_AXES = ("axial", "stored")


@dataclass
class SliceStack:
    """The slices of a volume along one axis, with the voxel spacing in mm."""

    slices: np.ndarray  # (S, H, W) float32, the voxel values
    spacing: tuple[float, float, float]  # mm between slices, rows, columns


def read_slices(path: Path, axis: str = "axial") -> SliceStack:
    """The slices of the 3D NIfTI volume at `path` (see the module's docstring for `axis`)."""
    if axis not in SLICE_AXES:
        raise ConfigError(f"slice_axis must be one of {', '.join(SLICE_AXES)}, got {axis!r}")
    try:
        img = nib.load(str(path))
        if axis == "axial":
            img = nib.as_closest_canonical(img)
        data = np.asarray(img.dataobj, dtype=np.float32)
        zooms = tuple(float(z) for z in img.header.get_zooms()[:3])
    except (OSError, ValueError, EOFError, zlib.error, ImageFileError, HeaderDataError) as e:
        raise DataError(f"cannot read NIfTI volume {path} ({e}); replace the file") from e
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise DataError(f"{path}: expected a 3D volume, got shape {data.shape}")
    if not np.isfinite(data).all():
        raise DataError(f"{path}: the volume holds NaN or infinite values; replace the file")
    if axis == "axial":  # (R, A, S) -> (S, A, R), anterior up
        slices = data.transpose(2, 1, 0)[:, ::-1, :]
        spacing = (zooms[2], zooms[1], zooms[0])
    else:
        slices = data.transpose(2, 0, 1)
        spacing = (zooms[2], zooms[0], zooms[1])
    return SliceStack(np.ascontiguousarray(slices), spacing)
