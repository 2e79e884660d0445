"""`nifti-folder`: a user's own 3D scans with a label volume each (NIfTI), segmented on 2D axial slices.

Layouts (uncompressed `.nii` works wherever `.nii.gz` is named; files starting with "." are ignored, as
the `._*` files macOS leaves in the Medical Segmentation Decathlon's archives):
  Medical Segmentation Decathlon / nnU-Net: `imagesTr/<case>.nii.gz` with `labelsTr/<case>.nii.gz` (3-D);
    a case's channels in one 4-D file, as the Decathlon releases them (Task01_BrainTumour: FLAIR, T1w, t1gd,
    T2w, named in dataset.json's "modality"), or in nnU-Net's `<case>_0000.nii.gz`, `<case>_0001.nii.gz`,
    ...: the option `channel` picks one (a volume of the 4th axis, read alone; or `_000N`); the test cases in
    `imagesTs/` + `labelsTs/` when `labelsTs/` exists, else `test_fraction` of the training cases, evenly
    spread over their sorted names (logged). The folder itself, or the one folder below it that holds
    `imagesTr/` (a Decathlon task's own `Task09_Spleen/`). `dataset.json`'s "labels" name the classes, as
    the Decathlon writes them ({"0": "background", "1": "spleen"}) or nnU-Net v2 ({"background": 0, ...}).
  mask-folder's, with volumes: `train/images/<case>.nii.gz` with `train/masks/<case>.nii.gz`, `test/` alike
    (without `test/`, `test_fraction` of the training cases).

Every volume goes through `scaled_slices` then `model_slices`, which `fedistill predict` applies to a new
scan of a model trained on this set: the closest RAS orientation and its axial slices (`volumes.py`), the
intensities of each volume scaled to 0..255 (by default its 0.5th-99.5th percentiles of the voxels above
its minimum, so an MR scan's zero background does not set the scale; the option `window = [lo, hi]` fixes
the range instead, e.g. CT Hounsfield units), each slice centred on a square field of view as wide as the
volume's larger physical side (anisotropic pixels become square) and resized to `image_size` (bilinear
with antialiasing; labels per value by the area each covers, values kept).

Classes as mask-folder reads them (the option `classes`, by value; `foreground`: every value above 0 one
class, named as dataset.json names its one value above 0 where it names just one); slices: `labelled`
(default: the slices with any foreground, as BraTS' protocol keeps its tumour slices; a slice with neither
truth nor prediction scores Dice 1, so empty slices would inflate it) or `all`. Each training case is a
group, ranked by its foreground volume (as slice_sets ranks subjects), so `partition = "natural"` gives
each site whole cases and validation holds out whole cases.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.orientations import inv_ornt_aff, io_orientation

from fedistill.data.base import LoadedDataset
from fedistill.data.image_folder import checked_classes
from fedistill.data.mask_folder import class_names
from fedistill.data.medical import options as opt
from fedistill.data.medical.dataset_json import NAME, foreground_name, label_names, named_channels
from fedistill.data.medical.slice_sets import SubjectSlices, slice_dataset
from fedistill.data.medical.volumes import (
    NotOneVolumeError,
    axial_slices,
    read_volume,
    resize_images,
    resize_labels,
    scale_to_uint8,
    to_field_of_view,
    volume_count,
)
from fedistill.errors import ConfigError, DataError

log = logging.getLogger(__name__)

LAYOUT = (
    "<data_dir>/imagesTr/<case>.nii.gz (or <case>_0000.nii.gz) with <data_dir>/labelsTr/<case>.nii.gz, "
    "optionally imagesTs/ + labelsTs/ and dataset.json (Medical Segmentation Decathlon, nnU-Net); or "
    "<data_dir>/train/images/<case>.nii.gz with <data_dir>/train/masks/<case>.nii.gz, test/ alike"
)
SLICE_RULES = ("labelled", "all")
TEST_FRACTION = 0.2
#: nnU-Net's channel suffix: `<case>_0000` is channel 0 of case `<case>`.
CHANNEL = re.compile(r"^(.+)_(\d{4})$")


def describe(folder: str) -> str:
    """Where a user's own NIfTI volumes go."""
    return (
        f"nifti-folder reads your own 3D scans and label volumes (NIfTI) from {folder} as 2D axial slices:\n"
        f"  {folder}/imagesTr/<case>.nii.gz (nnU-Net: <case>_0000.nii.gz) and\n"
        f"  {folder}/labelsTr/<case>.nii.gz, the test cases in imagesTs/ + labelsTs/ (else\n"
        "  nifti-folder.test_fraction of the training cases),\n"
        f"  class names from {folder}/dataset.json's labels when present (Medical Segmentation Decathlon or\n"
        "  nnU-Net layout, as released); or train/images/<case>.nii.gz with train/masks/<case>.nii.gz and\n"
        "  test/ alike (mask-folder's layout). Each label value is a class, 0 the background."
    )


def checked_window(window: object) -> tuple[float, float] | None:
    """The option `window`: two finite numbers [lo, hi], lo < hi, or None."""
    if window is None:
        return None
    valid = (
        isinstance(window, list | tuple)
        and len(window) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in window)
    )
    if not valid or not window[0] < window[1]:
        raise ConfigError(
            f"{NAME} option window must be two numbers [lo, hi] with lo < hi (e.g. [-160, 240] for CT "
            f"soft tissue in Hounsfield units), got {window!r}"
        )
    return float(window[0]), float(window[1])


def scaled_slices(
    volume: np.ndarray, zooms: tuple[float, float, float], window: tuple[float, float] | None, source: str
) -> tuple[np.ndarray, tuple[float, float], float]:
    """A RAS volume (X, Y, Z) with voxel size `zooms` as uint8 axial slices (Z, H, W), their (row, column)
    spacing in mm and the field of view they are placed on (the larger physical side of a slice)."""
    images = axial_slices(volume)
    spacing = (zooms[1], zooms[0])  # rows run along y, columns along x
    if window is None:
        above = images > images.min()
        if not above.any():
            raise DataError(f"{source}: every voxel holds {float(images.min()):g}; the volume is empty")
        scaled = scale_to_uint8(images, above, "volume-percentile", source)
    else:
        lo, hi = window
        scaled = np.round(np.clip((images - lo) / (hi - lo), 0.0, 1.0) * 255.0).astype(np.uint8)
    field = max(images.shape[1] * spacing[0], images.shape[2] * spacing[1])
    return scaled, spacing, field


def model_slices(scaled: np.ndarray, spacing: tuple[float, float], field_mm: float, size: int) -> np.ndarray:
    """Slices from `scaled_slices` as the model takes them: on the square field of view, resized."""
    return resize_images(to_field_of_view(scaled, spacing, field_mm), size)


def load_nifti_folder(
    folder: Path,
    *,
    image_size: int = 128,
    window: object = None,
    classes: object = None,
    foreground: object = False,
    slices: str = "labelled",
    channel: int = 0,
    test_fraction: object = None,
    test_alone: bool = False,
) -> LoadedDataset:
    """The cases under `folder` as 2D axial slices and their label maps (see the module's docstring).
    `test_alone`: a folder holding test cases alone (imagesTs/ + labelsTs/, or test/, and no training
    folder) is a test set with an empty training set (a server that holds out no validation split); the
    classes are then read from its test label volumes."""
    image_size = opt.positive_int(NAME, "image_size", image_size, minimum=8)
    window = checked_window(window)
    names = checked_classes(classes, NAME)
    foreground = opt.flag(NAME, "foreground", foreground)
    rule = opt.choice(NAME, "slices", slices, SLICE_RULES)
    channel = opt.positive_int(NAME, "channel", channel, minimum=0)
    if test_fraction is not None:
        test_fraction = opt.positive_float(NAME, "test_fraction", test_fraction, maximum=0.9)
    base, train_dirs, test_dirs = _layout(Path(folder), test_alone)
    channel_names = named_channels(base / "dataset.json")
    train_cases, volumes = _cases(*train_dirs, channel, channel_names) if train_dirs else ({}, None)
    if test_dirs is None:
        train_cases, test_cases = _held_out(
            train_cases, TEST_FRACTION if test_fraction is None else test_fraction
        )
    elif test_fraction is not None:
        raise ConfigError(
            f"{NAME} option test_fraction does not apply: {test_dirs[1]} holds the test cases; leave it out"
        )
    else:
        test_cases, test_volumes = _cases(*test_dirs, channel, channel_names)
        if volumes is not None and (test_volumes or 1) != (volumes or 1):  # 0, nnU-Net's files: 1 each
            raise DataError(
                f"{NAME}: the image files under {train_dirs[0]} hold {volumes or 1} volumes each but those "
                f"under {test_dirs[0]} {test_volumes or 1}; give the test cases the same channels"
            )
        volumes = test_volumes if volumes is None else volumes
    if volumes != 1:  # say which channel is read, and its name
        where = f"<case>_{channel:04d} file" if volumes == 0 else f"4-D image file of {volumes} volumes"
        named = f" ({channel_names[1][channel]}, {channel_names[0]})" if channel in channel_names[1] else ""
        log.info("%s: channel %d%s read from each case's %s", NAME, channel, named, where)
    if names is None and not foreground:
        names = label_names(base / "dataset.json")
    elif names is None and (named := foreground_name(base / "dataset.json")) is not None:
        names = ("background", named)
    steps = (window, foreground, rule, image_size, channel if volumes else 0)  # nnU-Net's file: its only one
    train = [_case(c, *paths, *steps) for c, paths in train_cases.items()]
    test = [_case(c, *paths, *steps) for c, paths in test_cases.items()]
    test_largest = max(largest for _, largest in test)
    train_largest = max(largest for _, largest in train) if train else test_largest
    read_from = train_dirs[1] if train_dirs is not None else test_dirs[1]
    largest = max(train_largest, test_largest)
    names = class_names(names, train_largest, largest, NAME, base, read_from, what="label volume")
    if train_dirs is not None and not any(len(s.images) for s, _ in train):
        raise DataError(
            f"{NAME}: no training case under {train_dirs[1]} labels a voxel above 0; nothing to learn"
        )
    if not any(len(s.images) for s, _ in test):
        shown = ", ".join(list(test_cases)[:3]) + (", ..." if len(test_cases) > 3 else "")
        raise DataError(f"{NAME}: no test case ({shown}) labels a voxel above 0; nothing to score")
    return slice_dataset(
        NAME, [s for s, _ in train], [s for s, _ in test], image_size, class_names=names, unit="case"
    )


Parts = tuple[Path, Path]


def _layout(root: Path, test_alone: bool = False) -> tuple[Path, Parts | None, Parts | None]:
    """The data's own folder, its training (images, labels) folders (None: a test set alone, where
    `test_alone` allows one), and its test ones (None: held out)."""
    if not root.is_dir():
        raise DataError(f"{NAME}: data_dir {root} is not a folder; expected the layout {LAYOUT}")
    if not (root / "imagesTr").is_dir() and not (root / "train").is_dir():
        below = [p for p in sorted(root.iterdir()) if p.is_dir() and (p / "imagesTr").is_dir()]
        if len(below) > 1:
            raise DataError(
                f"{NAME}: {', '.join(str(p) for p in below)} each hold imagesTr/; "
                "set data_dir to the one to read"
            )
        root = below[0] if below else root
    if (root / "imagesTr").is_dir():
        if not (root / "labelsTr").is_dir():
            raise DataError(
                f"{NAME}: {root / 'imagesTr'} has no {root / 'labelsTr'} beside it; expected {LAYOUT}"
            )
        test = (root / "imagesTs", root / "labelsTs") if (root / "labelsTs").is_dir() else None
        if test is None and (root / "imagesTs").is_dir():
            log.info("%s: %s has no labelsTs/ beside it: its cases are not used", NAME, root / "imagesTs")
        return root, (root / "imagesTr", root / "labelsTr"), test
    if (root / "train").is_dir():
        test = (root / "test" / "images", root / "test" / "masks") if (root / "test").is_dir() else None
        return root, (root / "train" / "images", root / "train" / "masks"), test
    if test_alone and (root / "labelsTs").is_dir():
        return root, None, (root / "imagesTs", root / "labelsTs")
    if test_alone and (root / "test").is_dir():
        return root, None, (root / "test" / "images", root / "test" / "masks")
    raise DataError(f"{NAME}: {root} holds neither imagesTr/ nor train/; expected the layout {LAYOUT}")


def _volumes(folder: Path) -> dict[str, Path]:
    """The NIfTI files of `folder` by name without `.nii.gz` / `.nii` (hidden files, `._*` too, ignored)."""
    if not folder.is_dir():
        raise DataError(f"{NAME}: {folder} is not a folder; expected the layout {LAYOUT}")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        lower = path.name.lower()
        if path.name.startswith(".") or not path.is_file() or not lower.endswith((".nii.gz", ".nii")):
            continue
        stem = path.name[: -len(".nii.gz")] if lower.endswith(".gz") else path.name[: -len(".nii")]
        if stem in found:
            raise DataError(f"{NAME}: {found[stem]} and {path} have one name; keep one")
        found[stem] = path
    return found


def _cases(
    images_dir: Path, labels_dir: Path, channel: int, channel_names: tuple[str, dict[int, str]]
) -> tuple[dict[str, tuple[Path, Path]], int]:
    """{case: (image, label)} by case name and the volumes in each image file: 0 for nnU-Net's
    `<case>_000N` files (giving channel `channel`), else a 4-D file's 4th axis (`channel` is read), or 1."""
    images, labels = _volumes(images_dir), _volumes(labels_dir)
    if not images:
        raise DataError(f"{NAME}: {images_dir} holds no NIfTI volumes (.nii.gz, .nii); expected {LAYOUT}")
    suffixed = all(CHANNEL.match(stem) for stem in images) and not any(stem in labels for stem in images)
    if suffixed:
        by_case: dict[str, dict[int, Path]] = {}
        for stem, path in images.items():
            match = CHANNEL.match(stem)
            by_case.setdefault(match[1], {})[int(match[2])] = path
        shared = sorted(set.intersection(*(set(channels) for channels in by_case.values())))
        for case, channels in by_case.items():
            if channel not in channels:
                fix = f"set {NAME}.channel to one every case has ({_numbers(shared)})"
                fix = fix if shared else "the cases share no channel: give each case the same channel files"
                raise DataError(
                    f"{NAME}: case {case} under {images_dir} has no channel {channel} ({case}_{channel:04d}"
                    f".nii.gz; it has {', '.join(f'{c:04d}' for c in sorted(channels))}); {fix}"
                )
        chosen, volumes = {case: channels[channel] for case, channels in by_case.items()}, 0
    else:
        chosen, volumes = images, _volumes_each(images_dir, images, channel, channel_names)
    out = {}
    for case, image in sorted(chosen.items()):
        if case not in labels:
            raise DataError(f"{NAME}: image {image} has no label volume {labels_dir / case}.nii.gz (or .nii)")
        out[case] = (image, labels[case])
    return out, volumes


def _volumes_each(
    images_dir: Path, images: dict[str, Path], channel: int, channel_names: tuple[str, dict[int, str]]
) -> int:
    """The volumes every image file holds, from their headers; different counts, or no `channel`, refused."""
    first: dict[int, Path] = {}  # the first file of each count
    for path in images.values():
        first.setdefault(volume_count(path), path)
    if len(first) > 1:
        shown = ", ".join(f"{path.name} {count}" for count, path in first.items())
        raise DataError(
            f"{NAME}: the image files under {images_dir} hold different numbers of volumes ({shown}); give "
            "every case the same channels"
        )
    ((count, path),) = first.items()
    if count == 1 and channel > 0:
        raise DataError(
            f"{NAME}: {path} holds one volume (a 3-D image), so {NAME}.channel = {channel} picks none; "
            "leave it out, or give each case's channels in one 4-D file or as nnU-Net's "
            f"<case>_{channel:04d}.nii.gz files"
        )
    if channel >= count:
        key, names = channel_names
        named = f" ({key}: {', '.join(f'{c} {n}' for c, n in sorted(names.items()))})" if names else ""
        raise DataError(
            f"{NAME}: {path} holds {count} volumes, so {NAME}.channel = {channel} picks none; set it to one "
            f"of {_numbers(list(range(count)))}{named}"
        )
    return count


def _numbers(values: list[int]) -> str:
    """Sorted channel numbers as a line says them: "0 to 3" for a run, else "0, 2"."""
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]} to {values[-1]}"
    return ", ".join(str(v) for v in values)


def _held_out(
    cases: dict[str, tuple[Path, Path]], fraction: float
) -> tuple[dict[str, tuple[Path, Path]], dict[str, tuple[Path, Path]]]:
    """`fraction` of the cases (at least one, never all) for testing, evenly spread over the sorted names."""
    names = sorted(cases)
    if len(names) < 2:
        raise DataError(
            f"{NAME}: {len(names)} case found and no test folder; give at least 2 cases (one to train, one "
            "to test), or the test cases in imagesTs/ + labelsTs/ (test/ in the train/ layout)"
        )
    count = min(len(names) - 1, max(1, round(len(names) * fraction)))
    picked = {names[int((i + 0.5) * len(names) / count)] for i in range(count)}
    log.info(
        "%s: no test folder; %d of the %d cases held out for testing (test_fraction %g): %s",
        NAME,
        count,
        len(names),
        fraction,
        ", ".join(sorted(picked)),
    )
    return {n: cases[n] for n in names if n not in picked}, {n: cases[n] for n in names if n in picked}


def _read(path: Path, channel: int | None = None) -> tuple[np.ndarray, tuple[float, float, float]]:
    """An image's volume `channel` (of a 4-D file), or with None a label volume, which must be 3-D."""
    try:
        return read_volume(path, channel)
    except NotOneVolumeError as e:
        if e.ndim < 3:  # a single slice: no channels to pick
            raise DataError(f"{NAME}: {e}; 2D images with masks are read by mask-folder") from None
        if channel is None:
            raise DataError(
                f"{NAME}: {e}; a label file holds one label volume, which the image's channels share"
            ) from None
        raise DataError(f"{NAME}: {e}") from None


def _same_grid(image_path: Path, label_path: Path) -> None:
    """Log a label volume whose grid (its voxels' places, in RAS order) differs from its image's by more
    than 0.01 mm: read voxel for voxel, it may not lie on the scan (nnU-Net warns of the same)."""
    grids = []
    for path in (image_path, label_path):
        image = nib.load(str(path))
        grids.append(image.affine @ inv_ornt_aff(io_orientation(image.affine), image.shape[:3]))
    if not np.allclose(grids[0], grids[1], rtol=0.0, atol=0.01):
        log.warning(
            "%s: %s and its image %s place their voxels differently (affines %s and %s); read voxel for "
            "voxel, as nnU-Net reads them",
            NAME,
            label_path,
            image_path,
            np.round(grids[1], 3).tolist(),
            np.round(grids[0], 3).tolist(),
        )


def _case(
    name: str,
    image_path: Path,
    label_path: Path,
    window: tuple[float, float] | None,
    foreground: bool,
    rule: str,
    size: int,
    channel: int,
) -> tuple[SubjectSlices, int]:
    """One case's kept slices and label maps, and the largest label value in its volume."""
    volume, zooms = _read(image_path, channel)
    label, _ = _read(label_path)
    if label.shape != volume.shape:
        raise DataError(
            f"{NAME}: {label_path} is {label.shape} voxels (in RAS order) but its image {image_path} is "
            f"{volume.shape}; a label volume must lie on its image's grid"
        )
    if label.min() < 0 or not (label == np.round(label)).all():
        raise DataError(
            f"{NAME}: {label_path} holds values other than whole numbers >= 0; not a label volume"
        )
    _same_grid(image_path, label_path)
    labels = axial_slices(label).astype(np.int64)
    if foreground:
        labels = (labels > 0).astype(np.int64)
    scaled, spacing, field = scaled_slices(volume, zooms, window, str(image_path))
    labelled = labels.reshape(len(labels), -1).any(axis=1)
    keep = np.flatnonzero(labelled) if rule == "labelled" else np.arange(len(labels))
    images = model_slices(scaled[keep], spacing, field, size)
    masks = resize_labels(to_field_of_view(labels[keep], spacing, field), size)
    slices = SubjectSlices(name, images, masks, keep.astype(np.int64), int((labels > 0).sum()))
    return slices, int(labels.max())
