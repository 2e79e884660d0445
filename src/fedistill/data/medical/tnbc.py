"""TNBC (Naylor et al. 2018): 50 H&E tiles, 512×512 at 40×, of triple-negative breast cancer from 11
patients, with binary nucleus masks.

Layout (as released): `Slide_XX/<name>.png` images and `GT_XX/<name>.png` masks, XX the patient.
Instances are the masks' connected components with 8-connectivity (touching nuclei drawn without a gap
become one instance: the masks hold no more than that). TNBC has no official split: the test set is
the patients in `test_slides` (default: the last 3 of the patients present, about 30%), so no patient is
in both sets; the groups are patients.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError
from scipy import ndimage

from fedistill.data.base import LoadedDataset
from fedistill.data.medical import options as opt
from fedistill.data.medical.nuclei_sets import (
    WholeImage,
    is_metadata,
    nuclei_dataset,
    patching_options,
    read_rgb,
)
from fedistill.errors import ConfigError, DataError

log = logging.getLogger(__name__)

NAME = "tnbc"
EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


#: TNBC's released folders, in a few words.
LAYOUT = (
    "Slide_01/ ... Slide_11/ (images *.png) and GT_01/ ... GT_11/ (binary masks with the same file names)"
)


def describe(folder: str) -> str:
    """Where to put TNBC's released folders; it cannot be downloaded."""
    return (
        f"TNBC nuclei: put the released folders in {folder}/: {LAYOUT}. "
        "It cannot be downloaded automatically."
    )


def read_mask_instances(path: Path) -> np.ndarray:
    """The nuclei of a binary mask file as an instance map (8-connected components)."""
    try:
        with Image.open(path) as image:
            mask = np.asarray(image)
    except (OSError, ValueError, UnidentifiedImageError) as e:
        raise DataError(f"cannot read mask {path} ({e}); replace the file") from e
    if mask.ndim == 3:
        mask = mask[..., 0]
    instances, _ = ndimage.label(mask > 0, structure=EIGHT_CONNECTED)
    return instances.astype(np.int64)


def find_slides(folder: Path) -> dict[int, Path]:
    """The Slide_XX folders by slide number, in order: in `folder`, or in the one folder below it that holds
    them (the release's zip unpacks into `TNBC_NucleiSegmentation/`); DataError when there are none."""
    if not folder.is_dir():
        raise DataError(f"TNBC folder {folder} does not exist; expected {LAYOUT} in it")
    slides = _slides_in(folder)
    if not slides:
        below = [d for d in sorted(folder.iterdir()) if d.is_dir() and not d.name.startswith(("_", "."))]
        slides = next((found for found in map(_slides_in, below) if found), {})
    if not slides:
        raise DataError(f"no Slide_XX folder in {folder} or a folder below it; expected {LAYOUT} there")
    return dict(sorted(slides.items()))


def _slides_in(folder: Path) -> dict[int, Path]:
    slides = {}
    for path in folder.iterdir():
        match = re.fullmatch(r"Slide_(\d+)", path.name)
        if match and path.is_dir():
            slides[int(match.group(1))] = path
    return slides


def read_slide(folder: Path, slide_dir: Path, group: int) -> list[WholeImage]:
    """The whole images of one slide with their instance maps from the matching GT_XX folder, in `group`."""
    gt_dir = slide_dir.parent / slide_dir.name.replace("Slide_", "GT_")
    wholes = []
    for path in sorted(
        p for p in slide_dir.iterdir() if p.suffix.lower() == ".png" and not is_metadata(p, slide_dir)
    ):
        mask = gt_dir / path.name
        if not mask.is_file():
            raise DataError(f"TNBC: missing mask {mask} for image {path}")
        image, instances = read_rgb(path), read_mask_instances(mask)
        if instances.shape != image.shape[1:]:
            raise DataError(f"{mask} is {instances.shape} but {path} is {image.shape[1:]}")
        wholes.append(WholeImage(path.stem, image, instances, group))
    return wholes


def load_tnbc_images(
    folder: Path, test_slides: object = None, group_of: Callable[[int], int] | None = None
) -> tuple[list[WholeImage], list[WholeImage], dict[int, Path]]:
    """Training and test images; `group_of(slide number)` gives each image's group (default: patient)."""
    slides = find_slides(Path(folder))
    if len(slides) < 2:
        raise DataError(f"TNBC needs at least 2 patients (Slide_XX folders) in {folder}; found {len(slides)}")
    if test_slides is None:
        chosen = list(slides)[-max(1, round(0.3 * len(slides))) :]
        log.info(
            "tnbc: test patients %s (the last 30%% of the slides)", ", ".join(f"{s:02d}" for s in chosen)
        )
    else:
        chosen = list(dict.fromkeys(opt.int_list(NAME, "test_slides", test_slides)))  # each patient once
        absent = [s for s in chosen if s not in slides]
        if absent or len(chosen) >= len(slides):
            raise ConfigError(
                f"tnbc option test_slides must name some but not all of the patients present "
                f"({', '.join(map(str, slides))}); got {list(chosen)}"
            )
    group_of = group_of or {s: i for i, s in enumerate(slides)}.__getitem__
    train, test = [], []
    for number, slide_dir in slides.items():
        (test if number in chosen else train).extend(read_slide(Path(folder), slide_dir, group_of(number)))
    return train, test, slides


def load_tnbc(
    folder: Path,
    *,
    test_slides: object = None,
    patch_size: int = 256,
    stride: int | None = None,
    scale: float = 1.0,
) -> LoadedDataset:
    """TNBC nuclei, the chosen test slides held out, the training images cut into patches as
    `patching_options` says."""
    patching = patching_options(NAME, patch_size, stride, scale)
    train, test, slides = load_tnbc_images(Path(folder), test_slides)
    return nuclei_dataset(NAME, train, test, patching, tuple(p.name for p in slides.values()))
