"""MNIST, Fashion-MNIST and EMNIST: their files (URLs, md5s), loaders, class names, the text that says
where the files go, and `reshaped`, which puts a grey 28 x 28 set at another image shape."""

from __future__ import annotations

import dataclasses
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset, is_plain_int
from fedistill.data.files import RemoteFile, fetch_or_require
from fedistill.data.idx import read_idx_pair
from fedistill.data.transforms import fit_uint8
from fedistill.errors import ConfigError, DataError

MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
IDX_NAMES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
MNIST_MD5 = (
    "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "d53e105ee54ea40749a09fcbcd1e9432",
    "9fb629c4189551a2d022fa330f9573f3",
    "ec29112dd5afa0611ce80d1b7f02629c",
)
FASHION_MNIST_MD5 = (
    "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "25c81989df183df01b3e8a0aad5dffbe",
    "bef4ecab320f06d8554ea6380940ec79",
    "bb300cfdad3c16e7a12a480ee83cd310",
)
MNIST_FILES = tuple(RemoteFile(n, m, MNIST_URL + n) for n, m in zip(IDX_NAMES, MNIST_MD5, strict=True))
FASHION_MNIST_FILES = tuple(
    RemoteFile(n, m, FASHION_MNIST_URL + n) for n, m in zip(IDX_NAMES, FASHION_MNIST_MD5, strict=True)
)
EMNIST_ZIP = RemoteFile(
    "gzip.zip", "58c8d27c78d21e728a6bc7b3cc06412e", "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip"
)

# The normalisation the reference code uses for all MNIST-like data.
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)
DIGIT_CLASSES = tuple("0123456789")
_UPPER = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_MERGED_LOWER = tuple("abdefghnqrt")  # lower-case letters that NIST kept apart from their capitals
EMNIST_CLASSES = {
    "digits": DIGIT_CLASSES,
    "letters": _UPPER,  # upper and lower case merged; labels 1..26 in the files, 0..25 here
    "balanced": DIGIT_CLASSES + _UPPER + _MERGED_LOWER,
    "byclass": DIGIT_CLASSES + _UPPER + tuple("abcdefghijklmnopqrstuvwxyz"),
    "bymerge": DIGIT_CLASSES + _UPPER + _MERGED_LOWER,
    "mnist": DIGIT_CLASSES,
}
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


def _mnist_like_info(
    name: str, x: torch.Tensor, num_classes: int, class_names: tuple[str, ...]
) -> DatasetInfo:
    return DatasetInfo(
        name=name,
        channels=1,
        image_size=int(x.shape[-1]),
        num_classes=num_classes,
        mean=MNIST_MEAN,
        std=MNIST_STD,
        class_names=class_names,
    )


def _check_labels(images: ImageSet, num_classes: int, source: str) -> ImageSet:
    if len(images):
        lo, hi = int(images.y.min()), int(images.y.max())
        if lo < 0 or hi >= num_classes:
            raise DataError(f"{source}: labels must be in 0..{num_classes - 1}, found {lo}..{hi}")
    return images


def _idx_path(folder: Path, spec: RemoteFile, download: bool, verify: bool) -> Path:
    """The .gz file (md5-checked), or an already uncompressed copy next to it (format-checked only)."""
    raw = folder / spec.name.removesuffix(".gz")
    if not (folder / spec.name).is_file() and raw.is_file():
        return raw
    return fetch_or_require(folder, spec, download_missing=download, verify=verify)


def load_mnist_like(
    name: str, title: str, files: tuple[RemoteFile, ...], class_names: tuple[str, ...]
) -> Callable[..., LoadedDataset]:
    """The loader of an MNIST-like dataset in gzip IDX files, optionally resized and given more channels."""

    def load(
        folder: Path,
        download: bool,
        verify: bool,
        image_size: int = 0,
        channels: int = 0,
        crop_padding: int = 0,
        horizontal_flip: bool = False,
    ) -> LoadedDataset:
        augmentation = _augmentation(name, crop_padding, horizontal_flip)
        if is_plain_int(image_size) and 0 < image_size <= crop_padding:  # a crop could miss the image
            raise ConfigError(
                f"{name}.crop_padding must be an integer from 0 to 8, below image_size {image_size}, "
                f"got {crop_padding}"
            )
        missing = [
            str(folder / f.name)
            for f in files
            if not (folder / f.name).is_file() and not (folder / f.name.removesuffix(".gz")).is_file()
        ]
        if missing and not download:
            raise DataError(
                f"missing dataset files {', '.join(missing)}.\n"
                + describe_mnist_like(title, files)(str(folder))
            )
        paths = [_idx_path(folder, spec, download, verify) for spec in files]
        train = _check_labels(read_idx_pair(paths[0], paths[1]), 10, str(paths[1]))
        test = _check_labels(read_idx_pair(paths[2], paths[3]), 10, str(paths[3]))
        info = dataclasses.replace(_mnist_like_info(name, train.x, 10, class_names), **augmentation)
        loaded = LoadedDataset(info, train, test)
        return reshaped(loaded, image_size, channels) if image_size or channels else loaded

    return load


def _augmentation(name: str, crop_padding: int, horizontal_flip: bool) -> dict[str, Any]:
    """The training augmentation `augment = "auto"` applies (none by default, as these sets are usually
    trained): random crops of `crop_padding` black pixels, horizontal flips (a shoe or a shirt mirrored is
    still one; a mirrored digit is not, so leave flips off on MNIST)."""
    if not is_plain_int(crop_padding) or not 0 <= crop_padding <= 8:
        raise ConfigError(f"{name}.crop_padding must be an integer from 0 to 8, got {crop_padding!r}")
    if not isinstance(horizontal_flip, bool):
        raise ConfigError(f"{name}.horizontal_flip must be true or false, got {horizontal_flip!r}")
    return {"crop_padding": crop_padding, "horizontal_flip": horizontal_flip}


def reshaped(data: LoadedDataset, image_size: int, channels: int) -> LoadedDataset:
    """`data` at another image shape (`image_size` pixels square, `channels` 1 or 3; 0 keeps it): bilinear
    resampling, grey repeated into colour, normalised by the reshaped training split's own statistics.
    For example Fashion-MNIST at CIFAR's 3 x 32 x 32: real images, the generators' and models' CIFAR
    sizes, which is what a speed measurement at the paper's scale needs when CIFAR is not at hand."""
    info = data.info
    size, chans = image_size or info.image_size, channels or info.channels
    if not is_plain_int(size) or not 8 <= size <= 512:
        raise ConfigError(f"{info.name}.image_size must be an integer from 8 to 512, got {image_size!r}")
    if not is_plain_int(chans) or chans not in (1, 3):  # `true` == 1 in Python, but names no channel count
        raise ConfigError(f"{info.name}.channels must be 1 or 3, got {channels!r}")
    train, test = (ImageSet(fit_uint8(part.x, chans, size), part.y) for part in (data.train, data.test))
    pixels = train.x.double() / 255.0
    mean = tuple(float(v) for v in pixels.mean(dim=(0, 2, 3)))
    std = tuple(float(v) for v in pixels.std(dim=(0, 2, 3)))
    new_info = dataclasses.replace(info, channels=chans, image_size=size, mean=mean, std=std)
    return LoadedDataset(new_info, train, test)


def describe_mnist_like(title: str, files: tuple[RemoteFile, ...]) -> Callable[[str], str]:
    """The description of where to put an MNIST-like dataset's files."""

    def describe(folder: str) -> str:
        lines = [
            f"{title}: put these gzip IDX files in {folder}/ (uncompressed copies without .gz also work):"
        ]
        lines += [f"  {folder}/{f.name}  md5 {f.md5}  from {f.url}" for f in files]
        lines.append("--download (download=True) fetches them when online.")
        return "\n".join(lines)

    return describe


def _emnist_names(split: str) -> list[str]:
    return [
        f"emnist-{split}-{part}-{kind}-ubyte.gz"
        for part in ("train", "test")
        for kind in ("images-idx3", "labels-idx1")
    ]


def _emnist_sources(folder: Path, split: str, download: bool, verify: bool) -> list[tuple[bytes | Path, str]]:
    """The four EMNIST files as (content or path, name for messages): loose files first (in the folder, or in
    the `gzip/` folder that unpacking the release's gzip.zip makes), else gzip.zip."""
    names = _emnist_names(split)
    loose = []
    for n in names:
        places = (folder, folder / "gzip")
        candidates = [place / name for place in places for name in (n, n.removesuffix(".gz"))]
        loose.append(next((c for c in candidates if c.is_file()), None))
    if all(p is not None for p in loose):
        return [(p, str(p)) for p in loose]  # no published per-file md5: checked by format only
    if not download and not (folder / EMNIST_ZIP.name).is_file():
        missing = [str(folder / n) for n, p in zip(names, loose, strict=True) if p is None]
        raise DataError(f"missing EMNIST files {', '.join(missing)}.\n" + describe_emnist(split)(str(folder)))
    zip_path = fetch_or_require(folder, EMNIST_ZIP, download_missing=download, verify=verify)
    try:
        with zipfile.ZipFile(zip_path) as zf:
            by_base = {m.rsplit("/", 1)[-1]: m for m in zf.namelist()}
            absent = [n for n in names if n not in by_base]
            if absent:
                raise DataError(
                    f"{zip_path} lacks {', '.join(absent)}; it is not the official EMNIST gzip.zip"
                )
            return [(zf.read(by_base[n]), f"{zip_path}:{by_base[n]}") for n in names]
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError) as e:  # zlib: bad data
        raise DataError(f"{zip_path} is not a readable zip archive ({e}); replace it") from e


def load_emnist(split: str) -> Callable[..., LoadedDataset]:
    """The loader of one EMNIST split, from NIST's release files or its zip; images are transposed upright."""
    classes = EMNIST_CLASSES[split]

    def load(folder: Path, download: bool, verify: bool) -> LoadedDataset:
        (xi, xn), (yi, yn), (ti, tn), (ui, un) = _emnist_sources(folder, split, download, verify)
        parts = []
        for images_in, labels_in, images_name, labels_name in ((xi, yi, xn, yn), (ti, ui, tn, un)):
            # NIST stores each image transposed: turned upright as it is read, with no second copy
            images = read_idx_pair(
                images_in, labels_in, images_name=images_name, labels_name=labels_name, transposed=True
            )
            y = images.y - 1 if split == "letters" else images.y
            parts.append(_check_labels(ImageSet(images.x, y), len(classes), labels_name))
        info = _mnist_like_info(f"emnist-{split}", parts[0].x, len(classes), classes)
        return LoadedDataset(info, parts[0], parts[1])

    return load


def describe_emnist(split: str) -> Callable[[str], str]:
    """The description of where to put one EMNIST split's files or the official archive."""

    def describe(folder: str) -> str:
        names = "\n".join(f"  {folder}/{n}" for n in _emnist_names(split))
        return (
            f"EMNIST {split}: put the NIST release files in {folder}/:\n{names}\n"
            f"(checked by format; NIST publishes no per-file md5), or the official archive at\n"
            f"  {folder}/{EMNIST_ZIP.name}  md5 {EMNIST_ZIP.md5}  from {EMNIST_ZIP.url}\n"
            "--download (download=True) fetches the archive (about 560 MB) when online."
        )

    return describe
