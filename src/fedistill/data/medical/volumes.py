"""MRI volumes to 2D training slices: reading NIfTI, orientation, intensity scaling, slice choice, resizing.

Every volume is brought to the closest RAS orientation first, so BraTS, the template brains and the
patients' scans all give axial slices that look the same way: anterior at the top, the subject's right
on the image's right. Slices are resized on a fixed 240 mm field of view (BraTS' 240×240 1 mm grid), so
one pixel covers the same tissue whichever scanner or template a slice came from.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
import torch
import torch.nn.functional as F
from nibabel.filebasedimages import ImageFileError
from nibabel.spatialimages import HeaderDataError

from fedistill.errors import DataError

FIELD_OF_VIEW_MM = 240.0  # BraTS: 240×240 voxels of 1 mm
SLICE_RULES = ("tumour", "margin", "brain")
MIN_TUMOUR_MM2 = 10.0  # a "tumour slice" shows at least 10 tumour voxels of BraTS' 1×1 mm grid
MARGIN_MM = 20.0  # the "margin" rule: 20 slices of 1 mm either side of the tumour
MIN_BRAIN_FRACTION = 0.01  # the "brain" rule: at least 1% of the slice is brain


class NotOneVolumeError(DataError):
    """A NIfTI file that holds no single 3-D volume; `ndim` says what it holds (2: one slice, 4: several
    volumes), for a loader to say what to do about it."""

    def __init__(self, message: str, ndim: int = 0) -> None:  # a default: exceptions are pickled by args
        super().__init__(message)
        self.ndim = ndim


READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, ImageFileError, HeaderDataError)


def volume_count(path: Path) -> int:
    """How many volumes a NIfTI file holds, from its header alone: a 4-D file's 4th axis, else 1."""
    try:
        shape = nib.load(str(path)).shape
    except READ_ERRORS as e:
        raise DataError(f"cannot read NIfTI volume {path} ({e}); replace the file") from e
    return shape[3] if len(shape) == 4 else 1


def read_volume(path: Path, channel: int | None = None) -> tuple[np.ndarray, tuple[float, float, float]]:
    """A 3-D float32 volume in RAS orientation and its voxel size in mm (x, y, z). `channel`: of a file of
    several volumes (a 4-D file, as the Medical Segmentation Decathlon stores a case's MR sequences) the
    one to read, sliced from the file alone and oriented as a 3-D file of it; a 3-D file is channel 0."""
    try:
        image = nib.load(str(path))
        stored = image.get_data_dtype()
        if stored.kind not in "biuf":  # RGB (a record of channels) or complex voxels
            raise DataError(
                f"{path} holds voxels of type {''.join(stored.names or ()) or stored.name}; expected one "
                "real number per voxel (a grey-level scan or a label map)"
            )
        count = image.shape[3] if len(image.shape) == 4 else 1
        if channel is not None and len(image.shape) in (3, 4):
            if channel >= count:
                held = f"{count} volumes" if count > 1 else "one volume (3-D)"
                raise DataError(f"{path} holds {held}; it has no volume {channel}")
            if count > 1:  # that volume alone read from the file, as a 3-D image of the file's geometry
                image = type(image)(image.dataobj[..., channel], image.affine, image.header)
        image = nib.as_closest_canonical(image)
        data = np.asarray(image.dataobj, dtype=np.float32)
        zooms = tuple(float(z) for z in image.header.get_zooms()[:3])
    except READ_ERRORS as e:
        raise DataError(f"cannot read NIfTI volume {path} ({e}); replace the file") from e
    if data.ndim == 4 and data.shape[3] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise NotOneVolumeError(
            f"{path} holds a {data.ndim}-D image of shape {data.shape}; expected one 3-D volume", data.ndim
        )
    if not np.isfinite(data).all():  # else scaled to 0 in silence: black voxels, or background labels
        raise DataError(f"{path}: the volume holds NaN or infinite values; replace the file")
    return data, (zooms[0], zooms[1], zooms[2])


def axial_slices(volume: np.ndarray) -> np.ndarray:
    """(Z, Y, X) axial slices of a RAS volume: anterior at row 0, the subject's right on the right."""
    return np.ascontiguousarray(np.rot90(volume, k=1, axes=(0, 1)).transpose(2, 0, 1))


def scale_to_uint8(volume: np.ndarray, brain: np.ndarray, mode: str, source: str) -> np.ndarray:
    """Intensities to 0..255. "volume-percentile": the 0.5th-99.5th percentiles of the volume's brain voxels
    span 0..255 (robust to a few hot voxels, and one scale per subject, so slices of a volume compare);
    "slice-max": each slice divided by its own maximum (what Chang et al.'s released code does)."""
    if not brain.any():
        raise DataError(f"{source}: the volume has no brain voxels (all zero); check the file")
    if mode == "slice-max":
        peak = volume.reshape(volume.shape[0], -1).max(axis=1).clip(min=1e-8)[:, None, None]
        scaled = volume / peak
    else:
        lo, hi = np.percentile(volume[brain], [0.5, 99.5])
        scaled = (volume - lo) / max(float(hi - lo), 1e-8)
    return np.round(np.clip(scaled, 0.0, 1.0) * 255.0).astype(np.uint8)


def to_field_of_view(
    stack: np.ndarray, spacing_mm: tuple[float, float], field_of_view_mm: float = FIELD_OF_VIEW_MM
) -> np.ndarray:
    """Centre-pad (or crop) slices (N, H, W) of the given row/column spacing to a square field of view of
    `field_of_view_mm` (BraTS' 240 mm by default), in their own pixels (so 1 mm data becomes 240×240)."""
    target = [round(field_of_view_mm / s) for s in spacing_mm]
    out = stack
    for axis, size in zip((1, 2), target, strict=True):
        have = out.shape[axis]
        if have < size:
            before = (size - have) // 2
            widths = [(0, 0)] * 3
            widths[axis] = (before, size - have - before)
            out = np.pad(out, widths)
        elif have > size:
            start = (have - size) // 2
            out = np.take(out, np.arange(start, start + size), axis=axis)
    return out


def resize_images(stack: np.ndarray, size: int) -> np.ndarray:
    """uint8 slices (N, H, W) to (N, size, size), bilinear with antialiasing (no aliasing when shrinking)."""
    if stack.shape[1:] == (size, size):
        return stack
    x = torch.from_numpy(np.ascontiguousarray(stack, dtype=np.float32))[:, None]
    y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return y[:, 0].round().clamp(0, 255).to(torch.uint8).numpy()


def resize_masks(stack: np.ndarray, size: int) -> np.ndarray:
    """Binary masks (N, H, W) to (N, size, size): the area-weighted fraction of each new pixel, >= 0.5."""
    if stack.shape[1:] == (size, size):
        return stack.astype(bool)
    x = torch.from_numpy(np.ascontiguousarray(stack, dtype=np.float32))[:, None]
    y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return (y[:, 0] >= 0.5).numpy()


def resize_labels(stack: np.ndarray, size: int) -> np.ndarray:
    """Label maps (N, H, W) of whole numbers to (N, size, size), values kept: each new pixel takes the value
    covering most of its area (bilinear with antialiasing, per value); a tie goes to a foreground value, as
    `resize_masks` keeps a half-covered pixel."""
    if stack.shape[1:] == (size, size):
        return stack.astype(np.int64)
    values = [int(v) for v in np.unique(stack) if v != 0]
    if not values:
        return np.zeros((stack.shape[0], size, size), np.int64)
    x = torch.from_numpy(np.stack([stack == v for v in values], axis=1).astype(np.float32))
    y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    background = 1.0 - y.sum(dim=1, keepdim=True)
    best = torch.cat([y, background], dim=1).argmax(dim=1).numpy()  # the first largest: foreground on a tie
    return np.asarray([*values, 0], np.int64)[best]


def select_slices(
    tumour: np.ndarray, brain: np.ndarray, rule: str, pixel_mm2: float, slice_mm: float
) -> np.ndarray:
    """Indices of the slices (Z, H, W) a protocol keeps.

    "tumour": slices with at least 10 mm² of tumour (10 voxels of BraTS' grid; Chang et al.'s training
    loader, and what matches the paper's 11,057 + 2,616 slices for 210 subjects, about 65 each);
    "margin": every slice from 20 mm below the tumour to 20 mm above it (Chang et al.'s export script);
    "brain": every slice with at least 1% brain (no tumour needed).
    """
    tumour_area = tumour.reshape(tumour.shape[0], -1).sum(axis=1)
    if rule == "tumour":
        return np.flatnonzero(tumour_area * pixel_mm2 >= MIN_TUMOUR_MM2)
    if rule == "margin":
        hit = np.flatnonzero(tumour_area > 0)
        if hit.size == 0:
            return hit
        margin = round(MARGIN_MM / slice_mm)
        return np.arange(max(0, hit[0] - margin), min(tumour.shape[0], hit[-1] + margin + 1))
    brain_fraction = brain.reshape(brain.shape[0], -1).mean(axis=1)
    return np.flatnonzero(brain_fraction >= MIN_BRAIN_FRACTION)


def size_ranks(sizes: list[int], names: list[str]) -> np.ndarray:
    """Rank of each subject by tumour size, smallest first (ties by name): Chang et al.'s site order."""
    order = sorted(range(len(sizes)), key=lambda i: (sizes[i], names[i]))
    ranks = np.empty(len(sizes), np.int64)
    ranks[order] = np.arange(len(sizes))
    return ranks
