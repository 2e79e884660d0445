"""Whole histology images with nucleus instance maps to a patched instance-segmentation dataset.

Every nuclei loader (MoNuSeg/TCGA, CPM-17, TNBC, the cross-site union and the semi-synthetic sites)
reads whole RGB images and their instance maps, optionally rescales them (`scale`: 0.5 halves a 40×
image to about 20×, for CPU work), and cuts them into `patch_size` patches every `stride` pixels
(`patches.py`). Targets are instance ids relabelled 1..n per patch. Test patches also record where they
came from (`test_meta`: subject = whole test image, row, col, height, width) and their whole-image ids
(`image_instances`), so predictions and ground truth can be stitched back for whole-image metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
import torch
import torch.nn.functional as F
from PIL import Image

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.data.eight_bit import to_uint8
from fedistill.data.image_files import IMAGE_READ_ERRORS
from fedistill.data.medical import options as opt
from fedistill.data.medical.patches import extract_patches, relabel
from fedistill.errors import ConfigError, DataError

NUCLEUS_CLASSES = ("background", "nucleus")


@dataclass
class WholeImage:
    """One whole image with its instance map and the group (site, organ) it belongs to."""

    name: str
    image: np.ndarray  # (3, H, W) uint8
    instances: np.ndarray  # (H, W) int64, 0 = background
    group: int  # index into the dataset's group_names


@dataclass(frozen=True)
class Patching:
    """How whole images are cut into square patches: the patch size, the stride between patches and the scale
    applied first."""

    size: int
    stride: int
    scale: float


def patching_options(dataset: str, patch_size: object, stride: object, scale: object) -> Patching:
    """A dataset's patch_size, stride (default: the patch size, no overlap; at most the patch size, so that
    every pixel is in a patch) and scale, checked."""
    size = opt.positive_int(dataset, "patch_size", patch_size, minimum=8)
    step = size if stride is None else opt.positive_int(dataset, "stride", stride)
    if step > size:
        raise ConfigError(
            f"{dataset} option stride must be at most the patch_size ({size}), got {step}: patches every "
            f"{step} pixels would leave strips of each image in no patch"
        )
    return Patching(size, step, opt.positive_float(dataset, "scale", scale, maximum=4.0))


def is_metadata(path: Path, folder: Path) -> bool:
    """Whether a file below `folder` is no data file: hidden (`.name`, such as the `._name` metadata twin that
    macOS writes beside every file it copies) or inside an archive's `__MACOSX/` folder."""
    return any(part.startswith(".") or part == "__MACOSX" for part in path.relative_to(folder).parts)


def _read_tiff(path: Path) -> np.ndarray:
    """A TIFF's pixels: tifffile, or Pillow where tifffile lacks the codec (LZW or JPEG compression needs
    the optional imagecodecs package there; Pillow decodes both). An indexed-colour (palette) TIFF is
    looked up in its colormap, so it gives its colours, not its indices."""
    try:
        with tifffile.TiffFile(path) as tif:
            if not len(tif.pages):  # libtiff writes the directory last: a file cut short loses it
                raise ValueError("it holds no image: a damaged or cut-short TIFF")
            array = np.asarray(tif.asarray())
            page = tif.pages[0]
            if page.photometric == tifffile.PHOTOMETRIC.PALETTE and page.colormap is not None:
                array = _palette_colours(array, np.asarray(page.colormap))
        return array
    except ValueError as e:
        if "imagecodecs" not in str(e):
            raise
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB") if image.mode in ("P", "PA") else image)


def _palette_colours(indices: np.ndarray, colormap: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 colours of palette `indices` in a TIFF colormap (3, n): 16 bits per channel, as the
    TIFF standard has it, or 8 where a writer stored them so (no value above 255)."""
    table = colormap.T.astype(np.float64)
    if table.max() > 255:
        table = table / 257.0
    return np.round(table).astype(np.uint8)[np.clip(indices, 0, len(table) - 1)]


def read_rgb(path: Path) -> np.ndarray:
    """An image file as (3, H, W) uint8: grey is repeated, alpha dropped (RGBA and grey with alpha alike),
    16-bit scaled by its maximum."""
    try:
        if path.suffix.lower() in (".tif", ".tiff"):
            array = _read_tiff(path)
        else:
            with Image.open(path) as image:
                array = np.asarray(image.convert("RGB") if image.mode in ("P", "PA", "CMYK") else image)
    except IMAGE_READ_ERRORS as e:
        raise DataError(f"cannot read image {path} ({e}); replace the file") from e
    if array.ndim == 3 and array.shape[0] in (2, 3, 4) and array.shape[-1] not in (2, 3, 4):
        array = array.transpose(1, 2, 0)  # planar TIFF
    if array.ndim == 3 and array.shape[2] == 2:
        array = array[:, :, 0]  # grey and alpha
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] < 3:
        raise DataError(f"{path}: expected an RGB image, got an array of shape {array.shape}")
    array = array[:, :, :3]
    return np.ascontiguousarray(to_uint8(array).transpose(2, 0, 1))


def rescale(image: np.ndarray, instances: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Image resized bilinearly with antialiasing, instance map by nearest neighbour (ids unchanged)."""
    if scale == 1.0:
        return image, instances
    height, width = instances.shape
    new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
    x = torch.from_numpy(image.astype(np.float32))[None]
    y = F.interpolate(x, size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)[0]
    rows = np.minimum(((np.arange(new_h) + 0.5) * height / new_h).astype(np.int64), height - 1)
    cols = np.minimum(((np.arange(new_w) + 0.5) * width / new_w).astype(np.int64), width - 1)
    return y.round().clamp(0, 255).to(torch.uint8).numpy(), relabel(instances[rows[:, None], cols[None, :]])


def _patch(
    wholes: list[WholeImage], patching: Patching, test: bool
) -> tuple[ImageSet, np.ndarray, dict[str, np.ndarray]]:
    xs, ys, groups, meta = [], [], [], {k: [] for k in ("subject", "row", "col", "height", "width")}
    whole_ids = []
    for index, whole in enumerate(wholes):
        image, instances = rescale(whole.image, whole.instances, patching.scale)
        image_patches, rows, cols = extract_patches(image, patching.size, patching.stride)
        target_patches, _, _ = extract_patches(instances, patching.size, patching.stride)
        xs.append(image_patches)
        ys.extend(relabel(t) for t in target_patches)
        groups.append(np.full(len(rows), whole.group, np.int64))
        meta["subject"].append(np.full(len(rows), index, np.int64))  # the whole image: kept for training too
        if test:
            whole_ids.append(target_patches.astype(np.int32))
            for key, values in (
                ("row", rows),
                ("col", cols),
                ("height", np.full(len(rows), instances.shape[0])),
                ("width", np.full(len(rows), instances.shape[1])),
            ):
                meta[key].append(np.asarray(values, np.int64))
    size = patching.size
    if not xs:
        empty = ImageSet(
            torch.zeros((0, 3, size, size), dtype=torch.uint8), torch.zeros((0, size, size)).long()
        )
        return empty, np.zeros(0, np.int64), {"subject": np.zeros(0, np.int64)}
    images = ImageSet(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.stack(ys)))
    test_meta = {k: np.concatenate(v) for k, v in meta.items() if test or k == "subject"}
    if test:
        test_meta["image_instances"] = np.concatenate(whole_ids)
    return images, np.concatenate(groups), test_meta


def nuclei_dataset(
    name: str,
    train: list[WholeImage],
    test: list[WholeImage],
    patching: Patching,
    group_names: tuple[str, ...],
) -> LoadedDataset:
    """The patched dataset; mean and std per channel over the training patches."""
    for split, wholes in (("training", train), ("test", test)):
        if not wholes:
            raise DataError(f"{name}: no {split} image was found; check the folder layout")
    train_set, train_groups, train_meta = _patch(train, patching, test=False)
    test_set, test_groups, test_meta = _patch(test, patching, test=True)
    pixels = train_set.x.double().div(255.0).transpose(0, 1).reshape(3, -1)
    info = DatasetInfo(
        name=name,
        channels=3,
        image_size=patching.size,
        num_classes=2,
        mean=tuple(float(m) for m in pixels.mean(dim=1)),
        std=tuple(float(s) for s in pixels.std(dim=1).clamp_min(1e-3)),
        horizontal_flip=False,  # the batch augmentation flips images only, never their per-pixel targets
        class_names=NUCLEUS_CLASSES,
        task="instance-segmentation",
    )
    return LoadedDataset(
        info=info,
        train=train_set,
        test=test_set,
        train_groups=train_groups,
        test_groups=test_groups,
        group_names=group_names,
        test_meta=test_meta,
        train_subject_ids=train_meta["subject"],
    )
