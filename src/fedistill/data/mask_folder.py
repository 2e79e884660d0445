"""`mask-folder`: a user's own 2D images with a label mask each, for semantic segmentation.

Layout: `train/images/<name>.<ext>` with its mask at `train/masks/<name>.<ext>` (the same name; the
extensions may differ, e.g. a JPEG scan and a PNG mask), and the same under `test/`. Images are read exactly
as `image-folder` and `fedistill predict` read them (`fedistill.data.image_files`) and resized to a square
`image_size`; masks keep their values, resized by nearest neighbour: each value a class (0 the background),
a palette PNG's indices included. A mask holding only 0 and 255 (the usual binary mask saved as an 8-bit
image) is read as background and class 1. A JPEG mask is refused: its compression makes values no class
has. Pathology tiles, dermoscopy, X-ray or ultrasound frames, or slices a user cut from volumes all fit; 3D
volumes do not (the BraTS layout reads those).

Options: `channels` (1, default, or 3), `image_size` (default 64), `classes`: the class names by value,
`classes[0]` the background; by default the largest value in the training masks gives the count, named
`background`, `class-1`, ... (more than `MOST_CLASSES` unnamed is taken for an instance map and refused), and
`foreground`: every value above 0 one class, for instance maps (one id per object, as nuclei sets store
them). A site holding its own data (site_data_dir) takes the server's classes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset, is_plain_int
from fedistill.data.image_files import IMAGE_READ_ERRORS, model_image, read_tiff
from fedistill.data.image_folder import IMAGE_SUFFIXES, channel_statistics, checked_classes
from fedistill.errors import ConfigError, DataError

LAYOUT = "<data_dir>/train/images/<name>.png|jpg|tif|... and <data_dir>/train/masks/<name>.png|tif; test/ too"
#: Mask files refused: lossy compression moves a label's value (a 0/255 mask's edges hold 1, 2, 254, ...).
LOSSY_SUFFIXES = frozenset({".jpg", ".jpeg"})


def load_mask_folder(
    data_dir: str | Path,
    *,
    channels: int = 1,
    image_size: int = 64,
    classes: list[str] | tuple[str, ...] | None = None,
    foreground: bool = False,
    test_alone: bool = False,
) -> LoadedDataset:
    """Load `data_dir/{train,test}/{images,masks}`; mean/std are per channel over the training images.
    `foreground`: every value above 0 is one class (an instance map, one id per object, read as objects
    against the background). `test_alone`: a folder with test/ and no train/ is a test set alone (a server
    that holds out no validation split): the training set is empty, and the class count and mean/std are
    read from the test masks and images."""
    if not is_plain_int(channels) or channels not in (1, 3):
        raise ConfigError(f"mask-folder option channels must be 1 or 3, got {channels!r}")
    if not is_plain_int(image_size) or image_size < 4:
        raise ConfigError(f"mask-folder option image_size must be an integer >= 4, got {image_size!r}")
    if not isinstance(foreground, bool):  # "false" from --set would read as true
        raise ConfigError(f"mask-folder option foreground must be true or false, got {foreground!r}")
    names = checked_classes(classes, "mask-folder")
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"mask-folder: data_dir {root} is not a folder; expected the layout {LAYOUT}")
    alone = test_alone and not (root / "train").exists() and (root / "test").is_dir()
    test_x, test_masks = _load_part(root / "test", channels, image_size)
    train_x, train_masks = (test_x[:0], []) if alone else _load_part(root / "train", channels, image_size)
    binary = foreground or all(set(np.unique(m).tolist()) <= {0, 255} for m in (*train_masks, *test_masks))
    test_y = _labels(test_masks, binary)
    train_y = test_y[:0] if alone else _labels(train_masks, binary)
    largest = max(int(train_y.max()) if len(train_y) else 0, int(test_y.max()))  # test/ is never empty
    part, read = ("test", test_y) if alone else ("train", train_y)  # where the classes are counted
    names = class_names(names, int(read.max()), largest, "mask-folder", root, root / part)
    mean, std = channel_statistics(test_x if alone else train_x)
    info = DatasetInfo(
        name="mask-folder",
        channels=channels,
        image_size=image_size,
        num_classes=len(names),
        mean=mean,
        std=std,
        class_names=tuple(names),
        task="semantic-segmentation",
    )
    return LoadedDataset(info=info, train=ImageSet(train_x, train_y), test=ImageSet(test_x, test_y))


#: More classes than this, with no `classes` option naming them, is taken for an instance map (refused with
#: the options that read it); a semantic mask of so many unnamed classes is rare.
MOST_CLASSES = 32


def class_names(
    names: tuple[str, ...] | None,
    train_largest: int,
    largest: int,
    dataset: str,
    root: Path,
    train_root: Path,
    what: str = "mask",
) -> tuple[str, ...]:
    """The class names by value: the option `classes` (`names`), or by default `background`, `class-1`, ...
    up to the largest value in the training masks (`train_largest`; more than MOST_CLASSES is taken for an
    instance map and refused); a value (`largest`, of train and test) without a name is refused. `root` and
    `train_root` are the folders the errors name: the data's, and its training masks'."""
    if names is None:
        count = max(train_largest + 1, 2)
        if count > MOST_CLASSES:
            raise DataError(
                f"{dataset}: the {what}s under {train_root} hold values up to {count - 1}, read as "
                f"{count} classes: an instance map (one id per object)? set {dataset}.foreground = true to "
                f"read every object as one class, or name the classes ({dataset}.classes, by value)"
            )
        names = ("background", *(f"class-{c}" for c in range(1, count)))
    if largest >= len(names):
        raise DataError(
            f"{dataset}: a {what} under {root} holds the value {largest}, but there are {len(names)} classes "
            f"({', '.join(names)}); name them all in the option classes, by value"
        )
    return tuple(names)


def _load_part(part: Path, channels: int, image_size: int) -> tuple[torch.Tensor, list[np.ndarray]]:
    """The images of `part` (uint8 (N, C, S, S)) and their masks (resized, values kept), by name."""
    images, masks = _files(part / "images"), _files(part / "masks")
    missing = sorted(set(images) - set(masks))
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise DataError(
            f"mask-folder: {len(missing)} image(s) under {part / 'images'} have no mask of the same name "
            f"under {part / 'masks'} ({shown})"
        )
    pictures, labels = [], []
    for name, path in images.items():
        picture, shape = model_image(path, channels, image_size)
        mask = _read_mask(masks[name])
        if mask.shape != shape:
            raise DataError(
                f"mask-folder: {masks[name]} is {mask.shape[1]} x {mask.shape[0]} pixels, its image {path} "
                f"{shape[1]} x {shape[0]}; a mask must match its image"
            )
        pictures.append(picture)
        labels.append(_nearest(mask, image_size))
    return torch.from_numpy(np.stack(pictures)), labels


def _files(folder: Path) -> dict[str, Path]:
    """The image files of `folder` by name without extension (two files of one name are refused)."""
    if not folder.is_dir():
        raise DataError(f"mask-folder: {folder} is not a folder; expected the layout {LAYOUT}")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith(".") and path.suffix.lower() in IMAGE_SUFFIXES:
            stem = path.name[: -len(path.suffix)]
            if stem in found:
                raise DataError(f"mask-folder: {found[stem]} and {path} have one name; keep one")
            found[stem] = path
    if not found:
        raise DataError(f"mask-folder: {folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return found


def _read_mask(path: Path) -> np.ndarray:
    """A mask's values (H, W) as stored: no scaling; a palette image's indices; a grey image saved as RGB
    read from one channel (an alpha channel dropped), a colour mask refused; a JPEG refused (its compression
    makes values no class has)."""
    if path.suffix.lower() in LOSSY_SUFFIXES:
        raise DataError(
            f"mask-folder: {path} is a JPEG, whose compression changes pixel values near every edge, so its "
            "mask would hold classes that are not there; save masks as PNG or TIFF (a 0/255 JPEG mask: set "
            "each pixel >= 128 to 255 and the rest to 0 first)"
        )
    try:
        if path.suffix.lower() in (".tif", ".tiff"):
            array = read_tiff(path)  # as an image is read: Pillow where tifffile lacks the codec (LZW)
        else:
            with Image.open(path) as image:
                array = np.asarray(image.convert("L") if image.mode == "1" else image)
    except IMAGE_READ_ERRORS as e:
        raise DataError(f"mask-folder: cannot read mask {path} ({e}); replace the file") from e
    if array.ndim == 3:
        if array.shape[2] in (2, 4):  # grey or RGB with alpha: the alpha channel is no class
            array = array[:, :, :-1]
        if not (array == array[:, :, :1]).all():
            raise DataError(
                f"mask-folder: {path} is a colour mask; save each pixel's class as one value (0: background)"
            )
        array = array[:, :, 0]
    if array.ndim != 2 or array.dtype.kind not in "biu" or (array.dtype.kind == "i" and array.min() < 0):
        raise DataError(
            f"mask-folder: {path} holds no mask of whole numbers >= 0 ({array.dtype}, {array.shape})"
        )
    return array.astype(np.int64)


def _nearest(mask: np.ndarray, size: int) -> np.ndarray:
    """A label mask resized to (size, size) by nearest neighbour (values kept)."""
    if mask.shape == (size, size):
        return mask
    rows = np.minimum((np.arange(size) + 0.5) * mask.shape[0] / size, mask.shape[0] - 1).astype(np.int64)
    cols = np.minimum((np.arange(size) + 0.5) * mask.shape[1] / size, mask.shape[1] - 1).astype(np.int64)
    return mask[rows][:, cols]


def _labels(masks: list[np.ndarray], binary: bool) -> torch.Tensor:
    """The masks as int64 (N, S, S) classes; 0/255 masks as 0/1."""
    stacked = np.stack(masks)
    return torch.from_numpy(np.where(stacked > 0, 1, 0) if binary else stacked)
