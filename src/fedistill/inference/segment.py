"""Segmentation: label PNGs for images, label volumes for NIfTI volumes, each on its input's own grid.

Semantic segmentation (brain tumours) was trained on whole slices resized to `image_size`: an image is
resized so, and its class map resized back by nearest neighbour. Instance segmentation (nuclei) was
trained on `image_size` patches cut from whole histology images at the run's `scale`: an image is
rescaled so, cut into patches every `stride` pixels (the run's dataset options), and the patches'
probabilities are stitched back and turned into instances by the same post-processing its test
metrics use (`instances_from_three_class`); the instance map (uint16 PNG, 0 = background) is then
resized back to the image's size.

A NIfTI volume given to a model trained on `nifti-folder` goes through that loader's own steps
(`nifti_folder.scaled_slices`, `model_slices`; of a 4-D file the run's `channel` alone); any other goes
through the BraTS loader's steps: axial slices of the canonical volume, intensities scaled per volume
(the 0.5th-99.5th percentiles of its non-zero voxels, or each slice by its maximum when the run's BraTS
data used `intensity = "slice-max"`; the semi-synthetic lesion sets' brains span 0..0.75 as their
hosts'), the slices placed on BraTS' 240 mm field of view and resized to `image_size`. The models learned
skull-stripped brains: a scan that keeps the head is first brain-extracted when asked (`skull_strip`,
`fedistill predict --skull-strip`). Every slice is predicted, and the class map is taken back through the
same steps to the volume's grid and voxel order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedistill.data.medical.brain_extraction import extract_brain, extraction_rule
from fedistill.data.medical.brain_synthetic import HOST_SCALED, scan_scale
from fedistill.data.medical.nifti_folder import NAME as NIFTI_FOLDER
from fedistill.data.medical.nifti_folder import checked_window, scaled_slices
from fedistill.data.medical.patches import extract_patches, stitch
from fedistill.data.medical.volumes import (
    FIELD_OF_VIEW_MM,
    axial_slices,
    resize_images,
    scale_to_uint8,
    to_field_of_view,
)
from fedistill.errors import DataError
from fedistill.inference.forward import Trained, chunks, dataset_options, outputs
from fedistill.inference.images import model_image, nearest_resize, read_image, to_channels, write_labels
from fedistill.inference.inputs import InputFile
from fedistill.inference.volumes import read_nifti, write_like
from fedistill.metrics.instances import instances_from_three_class


def segment_images(
    model: Trained, files: Sequence[InputFile], answers: Sequence[Path], batch_size: int
) -> None:
    """Write a label image per input: nuclei instances for patchwise tasks, else the class per pixel
    resized back to the input's shape."""
    if model.task.patchwise:
        for file, answer in zip(files, answers, strict=True):
            write_labels(answer, nuclei_instances(model, file.path, batch_size), np.uint16)
        return
    info = model.info
    for part in chunks(len(files), batch_size):
        read = [model_image(f.path, info.channels, info.image_size) for f in files[part]]
        images = torch.from_numpy(np.stack([image for image, _ in read]))
        labels = model.task.decode(outputs(model, images, batch_size)).numpy()  # its decision threshold
        for (_, shape), label, answer in zip(read, labels, answers[part], strict=True):
            write_labels(answer, nearest_resize(label, shape))


def _rescale(image: np.ndarray, scale: float) -> np.ndarray:
    """uint8 (C, H, W) resized by `scale` as the nuclei loaders resize their whole images."""
    if scale == 1.0:
        return image
    height, width = image.shape[1:]
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    x = torch.from_numpy(image.astype(np.float32))[None]
    y = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    return y.round().clamp(0, 255).to(torch.uint8).numpy()


def nuclei_instances(model: Trained, path: Path, batch_size: int) -> np.ndarray:
    """The instance map (H, W) of the whole image at `path`, patch by patch."""
    info, options = model.info, dataset_options(model)
    array = to_channels(read_image(path), info.channels, path)
    image = _rescale(array.transpose(2, 0, 1), float(options.get("scale", 1.0)))
    size = info.image_size
    stride = int(options.get("stride") or size)
    patches, rows, cols = extract_patches(image, size, stride)
    probabilities = outputs(model, torch.from_numpy(patches), batch_size).softmax(1)
    whole = stitch(probabilities, rows, cols, image.shape[1], image.shape[2])
    instances = instances_from_three_class(whole[0], whole[1], whole[2])
    return nearest_resize(instances, array.shape[:2])


def from_field_of_view(stack: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The inverse of `to_field_of_view`: (N, h, w) maps on the field of view back to (N, *shape), what
    was padded cut away and what was cropped filled with 0."""
    out = stack
    for axis, have in zip((1, 2), shape, strict=True):
        size = out.shape[axis]
        if have < size:
            start = (size - have) // 2
            out = np.take(out, np.arange(start, start + have), axis=axis)
        elif have > size:
            before = (have - size) // 2
            widths = [(0, 0)] * 3
            widths[axis] = (before, have - size - before)
            out = np.pad(out, widths)
    return out


def from_axial(slices: np.ndarray) -> np.ndarray:
    """The inverse of `axial_slices`: (Z, Y, X) axial slices back to a RAS volume (X, Y, Z)."""
    return np.ascontiguousarray(np.rot90(slices.transpose(1, 2, 0), k=-1, axes=(0, 1)))


def scan_to_uint8(
    model: Trained,
    images: np.ndarray,
    spacing: tuple[float, float],
    source: str,
    skull_strip: bool | str,
) -> np.ndarray:
    """Axial slices (Z, H, W) on the intensity scale of the run's training brains, 0 outside the brain:
    the brain is the non-zero voxels (a skull-stripped scan, as BraTS's are), or with `skull_strip` what
    `brain_extraction` finds in a scan that keeps the head (True or "outline": its outline rule; "tissue":
    its tissue rule). The semi-synthetic lesion sets put it on their hosts' scale (`scan_scale`, by the
    run's `real_intensity` rule); the others scale it by the run's `intensity` rule."""
    extraction = extraction_rule(skull_strip)
    brain = extract_brain(images, spacing, rule=extraction) if extraction else images > 0
    if not brain.any():
        found = "brain extraction found no brain in it" if extraction else "the volume has no brain voxels"
        raise DataError(f"{source}: {found} (all zero?); check the file")
    if model.config.dataset in HOST_SCALED:
        rule = str(dataset_options(model).get("real_intensity", "brain-median"))
        return np.round(scan_scale(images, brain, rule) * 255.0).astype(np.uint8)
    intensity = dataset_options(model).get("intensity", "volume-percentile")
    # the brain alone, as the training scans hold it: under "slice-max" the scalp must not set the peak
    stripped = np.where(brain, images, 0.0).astype(images.dtype, copy=False)
    return scale_to_uint8(stripped, brain, str(intensity), source) * brain.astype(np.uint8)


def segment_volume(
    model: Trained, path: Path, answer: Path, batch_size: int, skull_strip: bool | str = False
) -> None:
    """The class of every voxel of the NIfTI volume at `path`, written to `answer` (uint8); `skull_strip`:
    brain extraction first, for a scan that keeps the head (`scan_to_uint8`). A model trained on
    nifti-folder gets the volume as that loader made its slices (`nifti_folder.scaled_slices`, with the
    run's `window`; of a 4-D file its `channel`), on the field of view of the volume's larger side; the
    brain sets on BraTS' 240 mm."""
    nifti_folder = model.config.dataset == NIFTI_FOLDER
    volume = read_nifti(path, int(dataset_options(model).get("channel", 0)) if nifti_folder else None)
    zooms = volume.canonical_zooms
    if nifti_folder:  # --skull-strip refused before any answer (predict_path)
        window = checked_window(dataset_options(model).get("window"))
        scaled, spacing, field = scaled_slices(volume.canonical, zooms, window, str(path))
    else:
        images = axial_slices(volume.canonical)
        spacing, field = (zooms[1], zooms[0]), FIELD_OF_VIEW_MM  # rows run along y, columns along x
        scaled = scan_to_uint8(model, images, spacing, str(path), skull_strip)
    on_view = to_field_of_view(scaled, spacing, field)
    small = resize_images(on_view, model.info.image_size)
    labels = model.task.decode(outputs(model, torch.from_numpy(small)[:, None], batch_size)).numpy()
    labels = from_field_of_view(nearest_resize(labels, on_view.shape[1:]), scaled.shape[1:])
    write_like(volume, volume.from_canonical(from_axial(labels)).astype(np.uint8), answer)
