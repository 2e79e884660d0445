"""`image-folder`: a user's own images laid out as `train/<class>/*` and `test/<class>/*`.

Class names sorted alphabetically give the label order, so the labels are the same
on every machine. Every image is converted to RGB or greyscale and resized to a
square `image_size` with bilinear filtering (the aspect ratio is not kept), so the
models see the same tensor shape as with the built-in datasets. Images are read exactly as predict reads
them (`fedistill.data.image_files`): images of more than 8 bits (16-bit grey PNG, 16-bit or float TIFF)
are scaled by their own maximum (`fedistill.data.eight_bit`); a multi-page TIFF is refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset, is_plain_int
from fedistill.errors import ConfigError, DataError

IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
)
LAYOUT = "<data_dir>/train/<class>/*.png|jpg|... and <data_dir>/test/<class>/*"


def _entries(folder: Path) -> list[Path]:
    """What `folder` holds; DataError naming it when it cannot be listed (permissions, a disk error)."""
    try:
        return list(folder.iterdir())
    except OSError as e:
        raise DataError(f"image-folder: cannot list {folder}: {e.strerror or e}") from e


def channel_statistics(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 images (N, C, H, W) on the 0..1 scale, what a user's
    own images are normalised by; a constant-colour channel's deviation is held at 1e-3 (no division by 0)."""
    pixels = images.double().div(255.0).transpose(0, 1).reshape(images.shape[1], -1)
    std = pixels.std(dim=1).clamp_min(1e-3)
    return tuple(float(m) for m in pixels.mean(dim=1)), tuple(float(s) for s in std)


def checked_classes(classes: object, dataset: str = "image-folder") -> tuple[str, ...] | None:
    """The option `classes`: two or more distinct names (no '/': an image folder's are folder names), in
    label order; None when not given."""
    if classes is None:
        return None
    names = tuple(classes) if isinstance(classes, list | tuple) else ()
    valid = all(isinstance(n, str) and n and n == n.strip() and "/" not in n for n in names)
    if len(names) < 2 or not valid or len(set(names)) != len(names):
        raise ConfigError(
            f"{dataset} option classes must list two or more distinct class names in label order, e.g. "
            f'classes = ["benign", "malignant"]; got {classes!r}'
        )
    return names


def _check_root(root: Path) -> None:
    """The usual wrong data_dir, named with what it holds: a folder that is not there, a train/ folder itself,
    or one of class folders with no train/ above them. Anything else goes on to `_class_dirs`' own errors."""
    if not root.exists():
        raise DataError(f"image-folder: data_dir {root} does not exist; expected the layout {LAYOUT}")
    if not root.is_dir() or (root / "train").is_dir():
        return
    if root.name == "train":
        raise DataError(
            f"image-folder: {root} is itself a train/ folder; set data_dir to {root.parent}, the folder that "
            f"holds train/ and test/ ({LAYOUT})"
        )
    found = sorted(p.name for p in _entries(root) if p.is_dir() and not p.name.startswith("."))
    if found:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise DataError(
            f"image-folder: {root} has no train/ folder; it holds {shown}: put the class folders under "
            f"{root / 'train'} and {root / 'test'} ({LAYOUT})"
        )


def _class_dirs(split_dir: Path) -> dict[str, Path]:
    if not split_dir.is_dir():
        raise DataError(f"image-folder: {split_dir} is not a folder; expected the layout {LAYOUT}")
    dirs = {p.name: p for p in _entries(split_dir) if p.is_dir() and not p.name.startswith(".")}
    if not dirs:
        raise DataError(f"image-folder: {split_dir} has no class subfolders; expected the layout {LAYOUT}")
    return dict(sorted(dirs.items()))


def _image_files(class_dir: Path) -> list[Path]:
    return sorted(
        p
        for p in _entries(class_dir)
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
    )


def _no_images(class_dir: Path) -> str:
    """Why `class_dir` gives no image: what it holds instead (a few names), the extensions that are read."""
    found = sorted(p.name for p in _entries(class_dir) if not p.name.startswith("."))
    held = f"found {', '.join(found[:3])}{', ...' if len(found) > 3 else ''}" if found else "it is empty"
    return f"holds no images ({held}); images end in {', '.join(sorted(IMAGE_SUFFIXES))}"


def _load_image(path: Path, channels: int, image_size: int) -> np.ndarray:
    """The image as uint8 (channels, image_size, image_size), read exactly as predict reads it (TIFFs through
    tifffile, so colour TIFFs of more than 8 bits are scaled by their maximum, not cut to their high byte
    as Pillow does)."""
    from fedistill.data.image_files import model_image

    try:
        return model_image(path, channels, image_size)[0]
    except Image.DecompressionBombError as e:  # no OSError: Pillow's limit on the pixels of one image
        raise DataError(f"image-folder: cannot read image {path} ({e}); shrink it to a smaller copy") from e


def _load_split(
    split_dir: Path, classes: dict[str, Path], label_of: dict[str, int], channels: int, image_size: int
) -> ImageSet:
    images: list[np.ndarray] = []
    labels: list[int] = []
    for name, class_dir in classes.items():
        for path in _image_files(class_dir):
            images.append(_load_image(path, channels, image_size))
            labels.append(label_of[name])
    if not images:
        raise DataError(f"image-folder: {split_dir} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    x = torch.from_numpy(np.stack(images))
    return ImageSet(x, torch.tensor(labels, dtype=torch.int64))


def load_image_folder(
    data_dir: str | Path,
    *,
    channels: int = 3,
    image_size: int = 32,
    crop_padding: int = 0,
    horizontal_flip: bool = False,
    classes: list[str] | tuple[str, ...] | None = None,
    test_alone: bool = False,
) -> LoadedDataset:
    """Load `data_dir/train` and `data_dir/test`; mean/std are per channel over the training images.
    `classes`: every class name in label order, where a folder may lack some of them (a site that has no
    case of one); without it the train/ folder names, sorted, are the classes. `test_alone`: a folder with
    test/ and no train/ is a test set alone (a server that holds out no validation split): the training set
    is empty, the classes are test/'s folder names and mean/std are measured on the test images."""
    if not is_plain_int(channels) or channels not in (1, 3):
        raise ConfigError(f"image-folder option channels must be 1 or 3, got {channels!r}")
    if not is_plain_int(image_size) or image_size < 1:
        raise ConfigError(f"image-folder option image_size must be a positive integer, got {image_size!r}")
    if not is_plain_int(crop_padding) or not 0 <= crop_padding < image_size:  # else a crop can miss the image
        raise ConfigError(
            f"image-folder option crop_padding must be an integer from 0 to {image_size - 1} "
            f"(image_size {image_size}), got {crop_padding!r}"
        )
    if not isinstance(horizontal_flip, bool):  # "false" (a typed `False` via --set) would switch flips on
        raise ConfigError(
            f"image-folder option horizontal_flip must be true or false, got {horizontal_flip!r}"
        )
    names = checked_classes(classes)
    root = Path(data_dir)
    alone = test_alone and root.is_dir() and not (root / "train").exists() and (root / "test").is_dir()
    if not alone:
        _check_root(root)
    train_classes = {} if alone else _class_dirs(root / "train")
    if set(train_classes) == {"images", "masks"}:  # else a classifier of scans against their masks
        raise DataError(
            f"image-folder: {root / 'train'} holds images/ and masks/, the layout of mask-folder "
            "(segmentation): use --dataset mask-folder, or put each class's images in a folder named after it"
        )
    test_classes = _class_dirs(root / "test")
    named = test_classes if alone else train_classes  # the folders the classes are read from
    known = set(named) if names is None else set(names)
    for part, found in (("train", train_classes), ("test", test_classes)):
        unknown = sorted(set(found) - known)
        if unknown and names is not None:
            raise DataError(
                f"image-folder: class folder(s) {unknown} under {root / part} are not in the option "
                f"classes ({', '.join(names)})"
            )
        if unknown:
            raise DataError(
                f"image-folder: test classes {unknown} under {root / 'test'} have no folder under "
                f"{root / 'train'}; every test class must also be a training class"
            )
    for class_dir in train_classes.values():
        if not _image_files(class_dir):
            raise DataError(f"image-folder: training class folder {class_dir} {_no_images(class_dir)}")
    if names is None and len(named) < 2:
        raise DataError(
            f"image-folder: {root / ('test' if alone else 'train')} holds {len(named)} class folder(s) "
            f"({', '.join(named) or 'none'}); a classifier needs at least 2"
        )
    names = names or tuple(named)
    label_of = {name: i for i, name in enumerate(names)}
    test = _load_split(root / "test", test_classes, label_of, channels, image_size)
    if alone:
        train = ImageSet(test.x[:0], test.y[:0])
    else:
        train = _load_split(root / "train", train_classes, label_of, channels, image_size)
    mean, std = channel_statistics(test.x if alone else train.x)
    info = DatasetInfo(
        name="image-folder",
        channels=channels,
        image_size=image_size,
        num_classes=len(names),
        mean=mean,
        std=std,
        crop_padding=crop_padding,
        horizontal_flip=horizontal_flip,
        class_names=names,
    )
    return LoadedDataset(info=info, train=train, test=test)
