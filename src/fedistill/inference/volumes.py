"""NIfTI volumes in and out, so that an answer lies on its input's grid.

A volume is read as the training loaders read theirs (`fedistill.data.medical.volumes.read_volume`,
`fedistill.data.mri.nifti.read_slices`): turned to its closest canonical (RAS+) orientation before it is
cut into slices. The answer is turned back to the file's own voxel order and written with the input's
affine and header (only the data type changes, and for a label volume the scan's display range is
dropped), so a viewer lays it exactly over the input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.orientations import apply_orientation, axcodes2ornt, io_orientation, ornt_transform

from fedistill.data.medical.volumes import READ_ERRORS
from fedistill.errors import DataError


@dataclass
class NiftiVolume:
    """A NIfTI volume as read: its image (affine and header), voxels in stored order and orientation."""

    path: Path
    image: nib.Nifti1Image  # as read: its affine and header go to the answer
    stored: np.ndarray  # float32 (I, J, K): the voxels in the file's own order
    orientation: np.ndarray  # nibabel's orientation of the file's axes relative to RAS

    @property
    def canonical(self) -> np.ndarray:
        """The voxels in RAS+ order (X, Y, Z), as `nibabel.as_closest_canonical` gives them."""
        return apply_orientation(self.stored, self.orientation)

    @property
    def canonical_zooms(self) -> tuple[float, float, float]:
        """Voxel size in mm along X, Y, Z of `canonical`."""
        zooms = [float(z) for z in self.image.header.get_zooms()[:3]]
        out = [0.0, 0.0, 0.0]
        for axis, (target, _) in enumerate(self.orientation):
            out[int(target)] = zooms[axis]
        return out[0], out[1], out[2]

    def from_canonical(self, data: np.ndarray) -> np.ndarray:
        """An array in RAS+ order back in the file's own voxel order."""
        return apply_orientation(data, ornt_transform(axcodes2ornt("RAS"), self.orientation))


def read_nifti(path: Path, channel: int | None = None) -> NiftiVolume:
    """The 3D volume at `path` (a 4D one with a single volume too); `channel`: of a 4-D file of several
    volumes (a Decathlon case's channels) the one to read, alone, as a nifti-folder run read its own (a 3-D
    file is taken as that channel); DataError naming the file otherwise."""
    try:
        image = nib.load(str(path))
        count = image.shape[3] if len(image.shape) == 4 else 1
        if channel is not None and count > 1 and channel >= count:
            raise DataError(
                f"{path} holds {count} volumes, none of them the model's channel {channel} (its run's "
                "nifti-folder.channel); give it a scan of that channel"
            )
        picked = image.dataobj[..., channel] if channel is not None and count > 1 else image.dataobj
        data = np.asarray(picked, dtype=np.float32)
        orientation = io_orientation(image.affine)
    except READ_ERRORS as e:
        raise DataError(f"cannot read NIfTI volume {path} ({e}); replace the file") from e
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise DataError(
            f"{path} holds a {data.ndim}-D image of shape {data.shape}; predict takes 3-D volumes"
        )
    if not np.isfinite(data).all():
        raise DataError(f"{path}: the volume holds NaN or infinite values; replace the file")
    return NiftiVolume(path, image, data, orientation)


def write_like(volume: NiftiVolume, data: np.ndarray, path: Path) -> None:
    """`data` (in the file's voxel order) as a NIfTI file with the input's affine and header; the header's
    data type becomes `data`'s and its intensity scaling is dropped (labels and images are stored as is),
    and for labels (integers) its display range (cal_min, cal_max) too. The answer to a 4-D file of one
    volume keeps its 4th axis; to a file of several (one channel read), it is one 3-D volume."""
    if data.shape != volume.stored.shape:
        raise ValueError(f"answer of shape {data.shape} for a volume of shape {volume.stored.shape}")
    header = volume.image.header.copy()
    if header.get_data_shape()[3:] == (1,):
        data = data[..., None]
    header.set_data_dtype(data.dtype)
    header.set_slope_inter(1.0, 0.0)
    if np.issubdtype(data.dtype, np.integer):  # labels: the scan's display range would hide them
        header["cal_min"], header["cal_max"] = 0.0, 0.0  # 0 and 0: none set
    out = type(volume.image)(data, volume.image.affine, header)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(out, str(path))
