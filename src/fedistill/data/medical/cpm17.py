"""CPM-17 ("Cell17", Vu et al. 2019): 64 H&E tiles of four cancers (GBM, LGG, HNSCC, NSCLC), 500×500 or
600×600 at 20× or 40×, split by its authors into 32 training and 32 test tiles.

Layout (as HoVer-Net's distribution ships it): `train/Images/<name>.png` with `train/Labels/<name>.mat`,
and the same under `test/`; each .mat holds the instance map under the key `inst_map` (0 = background).
The file names do not say the cancer type, so the whole set is one group ("cpm17").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.io import loadmat
from scipy.io.matlab import MatReadError

from fedistill.data.base import LoadedDataset
from fedistill.data.medical.nuclei_sets import (
    WholeImage,
    is_metadata,
    nuclei_dataset,
    patching_options,
    read_rgb,
)
from fedistill.data.medical.patches import relabel
from fedistill.errors import DataError

NAME = "cpm17"
IMAGE_SUFFIXES = (".png", ".tif", ".tiff", ".jpg")


#: HoVer-Net's layout of CPM-17, for `str.format(folder=...)`.
LAYOUT = (
    "{folder}/train/Images/<name>.png with {folder}/train/Labels/<name>.mat (instance map under the key "
    "inst_map), and the same under {folder}/test/"
)


def describe(folder: str) -> str:
    """Where to put CPM-17's images and labels (HoVer-Net's layout); it cannot be downloaded."""
    return (
        f"CPM-17 nuclei: put {LAYOUT.format(folder=folder)} (the layout of HoVer-Net's CPM-17 download). "
        "It cannot be downloaded automatically."
    )


def read_inst_map(path: Path) -> np.ndarray:
    """The instance map (`inst_map`) of one CPM-17 label file, relabelled 1..n; DataError if it is missing or
    malformed."""
    try:
        content = loadmat(str(path))
    except (OSError, ValueError, NotImplementedError, TypeError, IndexError, MatReadError) as e:
        # IndexError: scipy's reading of a file cut short inside its 128-byte header
        raise DataError(f"cannot read MATLAB file {path} ({e}); replace it") from e
    if "inst_map" not in content:
        keys = ", ".join(k for k in content if not k.startswith("__"))
        raise DataError(f"{path} has no 'inst_map' (it holds: {keys or 'nothing'}); expected CPM-17's labels")
    inst = np.asarray(content["inst_map"])
    if inst.ndim != 2:
        raise DataError(f"{path}: inst_map must be a 2-D instance map, got shape {inst.shape}")
    if inst.dtype.kind not in "biuf" or not np.isfinite(inst).all() or (inst < 0).any():
        raise DataError(
            f"{path}: inst_map must hold instance ids >= 0 (0 = background), got {_value_range(inst)}"
        )
    return relabel(np.round(inst).astype(np.int64))


def _value_range(inst: np.ndarray) -> str:
    """What an invalid inst_map holds, for the message."""
    if inst.dtype.kind not in "biuf":
        return f"values of type {inst.dtype}"
    finite = inst[np.isfinite(inst)]
    span = f"{finite.min():g}..{finite.max():g}" if finite.size else "no finite value"
    return span + (" and NaN or infinite values" if finite.size < inst.size else "")


def read_split(folder: Path, split: str, group: int = 0) -> list[WholeImage]:
    """The whole images of CPM-17's train or test split with their instance maps, in `group`."""
    images_dir, labels_dir = folder / split / "Images", folder / split / "Labels"
    if not images_dir.is_dir():
        raise DataError(f"CPM-17: missing folder {images_dir}; expected {LAYOUT.format(folder=folder)}")
    paths = sorted(
        p
        for p in images_dir.iterdir()
        if p.suffix.lower() in IMAGE_SUFFIXES and not is_metadata(p, images_dir) and p.is_file()
    )
    if not paths:
        raise DataError(f"CPM-17: no image in {images_dir}; expected {LAYOUT.format(folder=folder)}")
    wholes = []
    for path in paths:
        label = labels_dir / f"{path.stem}.mat"
        if not label.is_file():
            raise DataError(f"CPM-17: missing label file {label} for image {path}")
        image, inst = read_rgb(path), read_inst_map(label)
        if inst.shape != image.shape[1:]:
            raise DataError(f"{label}: inst_map is {inst.shape} but {path} is {image.shape[1:]}")
        wholes.append(WholeImage(path.stem, image, inst, group))
    return wholes


def load_cpm17(
    folder: Path, *, patch_size: int = 256, stride: int | None = None, scale: float = 1.0
) -> LoadedDataset:
    """CPM-17 nuclei with its own train/test split, the images cut into patches as `patching_options` says."""
    patching = patching_options(NAME, patch_size, stride, scale)
    folder = Path(folder)
    return nuclei_dataset(NAME, read_split(folder, "train"), read_split(folder, "test"), patching, ("cpm17",))
