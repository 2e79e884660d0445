"""Datasets by name: `load_dataset("cifar10", data_dir)` and the text that says which files go where.

File-based datasets live in a subfolder of `data_dir` (`mnist/`, `fashion-mnist/`,
`emnist/`, `cifar10/`, `cifar100/`; the segmentation sets `brats/`, `monuseg/`, `cpm17/`,
`tnbc/`, and `brain-mri/`, `nuclei/` for the semi-synthetic ones; the text sets `ag-news/`,
`sst2/`, tokenised by a local model folder's tokenizer); `image-folder` and
`nuclei-cross-site` use `data_dir` itself, and `digits` and `mni152-synthetic-lesions` need
no files. Nothing is fetched unless `download=True`, and every download and every file with
a published md5 is checked (unless `verify=False`). The medical sets cannot be downloaded
(registration required, or they ship with the data folder), so `download` does not apply.
"""

from __future__ import annotations

import dataclasses
import importlib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.data.cifar import (
    CIFAR10_ARCHIVE,
    CIFAR10_DIR,
    CIFAR10_META,
    CIFAR10_TRAIN,
    CIFAR100_ARCHIVE,
    CIFAR100_DIR,
    KNOWN_MD5,
    load_cifar10,
    load_cifar100,
)
from fedistill.data.digits import load_digits_dataset
from fedistill.data.files import RemoteFile, fetch_or_require
from fedistill.data.idx import read_idx_pair
from fedistill.data.image_folder import LAYOUT, load_image_folder
from fedistill.data.transforms import fit_uint8
from fedistill.errors import ConfigError, DataError, UserError, unknown_name

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
_DIGITS = tuple("0123456789")
_UPPER = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_MERGED_LOWER = tuple("abdefghnqrt")  # lower-case letters that NIST kept apart from their capitals
EMNIST_CLASSES = {
    "digits": _DIGITS,
    "letters": _UPPER,  # upper and lower case merged; labels 1..26 in the files, 0..25 here
    "balanced": _DIGITS + _UPPER + _MERGED_LOWER,
    "byclass": _DIGITS + _UPPER + tuple("abcdefghijklmnopqrstuvwxyz"),
    "bymerge": _DIGITS + _UPPER + _MERGED_LOWER,
    "mnist": _DIGITS,
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

_ALIASES = {
    "fmnist": "fashion-mnist",
    "fashionmnist": "fashion-mnist",
    "cifar-10": "cifar10",
    "cifar-100": "cifar100",
    "imagefolder": "image-folder",
    "tcga": "monuseg",
    "cell17": "cpm17",
    "cpm-17": "cpm17",
    "brats2018": "brats",
    "agnews": "ag-news",
    "sst-2": "sst2",
}


@dataclass(frozen=True)
class _Entry:
    subdir: str | None  # folder under data_dir; None: needs no files ("" = data_dir itself)
    load: Callable[..., LoadedDataset]  # (folder, download, verify, **options)
    describe: Callable[[str], str]  # (folder shown to the user) -> which files go where
    options: tuple[str, ...] = ()


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


def _load_mnist_like(
    name: str, title: str, files: tuple[RemoteFile, ...], class_names: tuple[str, ...]
) -> Callable[..., LoadedDataset]:
    def load(
        folder: Path, download: bool, verify: bool, image_size: int = 0, channels: int = 0
    ) -> LoadedDataset:
        missing = [
            str(folder / f.name)
            for f in files
            if not (folder / f.name).is_file() and not (folder / f.name.removesuffix(".gz")).is_file()
        ]
        if missing and not download:
            raise DataError(
                f"missing dataset files {', '.join(missing)}.\n"
                + _describe_mnist_like(title, files)(str(folder))
            )
        paths = [_idx_path(folder, spec, download, verify) for spec in files]
        train = _check_labels(read_idx_pair(paths[0], paths[1]), 10, str(paths[1]))
        test = _check_labels(read_idx_pair(paths[2], paths[3]), 10, str(paths[3]))
        loaded = LoadedDataset(_mnist_like_info(name, train.x, 10, class_names), train, test)
        return reshaped(loaded, image_size, channels) if image_size or channels else loaded

    return load


def reshaped(data: LoadedDataset, image_size: int, channels: int) -> LoadedDataset:
    """`data` at another image shape (`image_size` pixels square, `channels` 1 or 3; 0 keeps it): bilinear
    resampling, grey repeated into colour, normalised by the reshaped training split's own statistics.
    For example Fashion-MNIST at CIFAR's 3 x 32 x 32: real images, the generators' and models' CIFAR
    sizes, which is what a speed measurement at the paper's scale needs when CIFAR is not at hand."""
    info = data.info
    size, chans = image_size or info.image_size, channels or info.channels
    if not isinstance(size, int) or isinstance(size, bool) or not 8 <= size <= 512:
        raise ConfigError(f"{info.name}.image_size must be an integer from 8 to 512, got {image_size!r}")
    if chans not in (1, 3):
        raise ConfigError(f"{info.name}.channels must be 1 or 3, got {channels!r}")
    train, test = (ImageSet(fit_uint8(part.x, chans, size), part.y) for part in (data.train, data.test))
    pixels = train.x.double() / 255.0
    mean = tuple(float(v) for v in pixels.mean(dim=(0, 2, 3)))
    std = tuple(float(v) for v in pixels.std(dim=(0, 2, 3)))
    new_info = dataclasses.replace(info, channels=chans, image_size=size, mean=mean, std=std)
    return LoadedDataset(new_info, train, test)


def _describe_mnist_like(title: str, files: tuple[RemoteFile, ...]) -> Callable[[str], str]:
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
    """The four EMNIST files as (content or path, name for messages): loose files first, else gzip.zip."""
    names = _emnist_names(split)
    loose = []
    for n in names:
        gz, raw = folder / n, folder / n.removesuffix(".gz")
        loose.append(gz if gz.is_file() else raw if raw.is_file() else None)
    if all(p is not None for p in loose):
        return [(p, str(p)) for p in loose]  # no published per-file md5: checked by format only
    if not download and not (folder / EMNIST_ZIP.name).is_file():
        missing = [str(folder / n) for n, p in zip(names, loose, strict=True) if p is None]
        raise DataError(
            f"missing EMNIST files {', '.join(missing)}.\n" + _describe_emnist(split)(str(folder))
        )
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
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{zip_path} is not a readable zip archive ({e}); replace it") from e


def _load_emnist(split: str) -> Callable[..., LoadedDataset]:
    classes = EMNIST_CLASSES[split]

    def load(folder: Path, download: bool, verify: bool) -> LoadedDataset:
        (xi, xn), (yi, yn), (ti, tn), (ui, un) = _emnist_sources(folder, split, download, verify)
        parts = []
        for images, labels_name in (
            (read_idx_pair(xi, yi, images_name=xn, labels_name=yn), yn),
            (read_idx_pair(ti, ui, images_name=tn, labels_name=un), un),
        ):
            x = images.x.transpose(2, 3).contiguous()  # NIST stores each image transposed
            y = images.y - 1 if split == "letters" else images.y
            parts.append(_check_labels(ImageSet(x, y), len(classes), labels_name))
        info = _mnist_like_info(f"emnist-{split}", parts[0].x, len(classes), classes)
        return LoadedDataset(info, parts[0], parts[1])

    return load


def _describe_emnist(split: str) -> Callable[[str], str]:
    def describe(folder: str) -> str:
        names = "\n".join(f"  {folder}/{n}" for n in _emnist_names(split))
        return (
            f"EMNIST {split}: put the NIST release files in {folder}/:\n{names}\n"
            f"(checked by format; NIST publishes no per-file md5), or the official archive at\n"
            f"  {folder}/{EMNIST_ZIP.name}  md5 {EMNIST_ZIP.md5}  from {EMNIST_ZIP.url}\n"
            "--download (download=True) fetches the archive (about 560 MB) when online."
        )

    return describe


def _describe_cifar(
    title: str, archive: RemoteFile, dir_name: str, members: tuple[str, ...]
) -> Callable[[str], str]:
    def describe(folder: str) -> str:
        lines = [
            f"{title}: put the official archive at",
            f"  {folder}/{archive.name}  md5 {archive.md5}  from {archive.url}",
            f"or its extracted folder {folder}/{dir_name}/ with:",
        ]
        lines += [f"  {folder}/{dir_name}/{m}  md5 {KNOWN_MD5[f'{dir_name}/{m}']}" for m in members]
        lines.append("--download (download=True) fetches the archive when online.")
        return "\n".join(lines)

    return describe


def _no_files(text: str) -> Callable[[str], str]:
    return lambda folder: text


def _medical(module: str, loader: str, needs_folder: bool = True) -> Callable[..., LoadedDataset]:
    """A loader of fedistill.data.medical, imported on first use (it pulls in nibabel, scikit-image, ...)."""

    def load(folder: Path | None, download: bool, verify: bool, **options: object) -> LoadedDataset:
        function = getattr(importlib.import_module(f"fedistill.data.medical.{module}"), loader)
        return function(folder, **options) if needs_folder else function(**options)

    return load


def _medical_text(module: str, function: str = "describe") -> Callable[[str], str]:
    def describe(folder: str) -> str:
        return getattr(importlib.import_module(f"fedistill.data.medical.{module}"), function)(folder)

    return describe


_PATCH_OPTIONS = ("patch_size", "stride", "scale")
_SYNTHETIC_BRAIN_OPTIONS = ("image_size", "train_subjects", "test_subjects", "seed", "slices")


_REGISTRY: dict[str, _Entry] = {
    "digits": _Entry(
        None,
        lambda folder, download, verify, **options: load_digits_dataset(**options),
        _no_files(
            "digits needs no files: it is scikit-learn's embedded copy of the UCI 8x8 handwritten digits."
        ),
        options=("crop_padding",),
    ),
    "mnist": _Entry(
        "mnist",
        _load_mnist_like("mnist", "MNIST", MNIST_FILES, _DIGITS),
        _describe_mnist_like("MNIST", MNIST_FILES),
        options=("image_size", "channels"),
    ),
    "fashion-mnist": _Entry(
        "fashion-mnist",
        _load_mnist_like("fashion-mnist", "Fashion-MNIST", FASHION_MNIST_FILES, FASHION_MNIST_CLASSES),
        _describe_mnist_like("Fashion-MNIST", FASHION_MNIST_FILES),
        options=("image_size", "channels"),
    ),
    **{
        f"emnist-{split}": _Entry("emnist", _load_emnist(split), _describe_emnist(split))
        for split in ("digits", "letters", "balanced", "byclass", "bymerge", "mnist")
    },
    "cifar10": _Entry(
        "cifar10",
        lambda folder, download, verify: load_cifar10(folder, download=download, verify=verify),
        _describe_cifar(
            "CIFAR-10", CIFAR10_ARCHIVE, CIFAR10_DIR, (*CIFAR10_TRAIN, "test_batch", CIFAR10_META)
        ),
    ),
    "cifar100": _Entry(
        "cifar100",
        lambda folder, download, verify, **opts: load_cifar100(
            folder, download=download, verify=verify, **opts
        ),
        _describe_cifar("CIFAR-100", CIFAR100_ARCHIVE, CIFAR100_DIR, ("train", "test", "meta")),
        options=("labels",),
    ),
    "image-folder": _Entry(
        "",
        lambda folder, download, verify, **opts: load_image_folder(folder, **opts),
        _no_files(
            f"image-folder reads your own images from data_dir with the layout {LAYOUT}; "
            "class folder names sorted alphabetically give the labels."
        ),
        options=("channels", "image_size", "crop_padding", "horizontal_flip"),
    ),
    "brats": _Entry(
        "brats",
        _medical("brats", "load_brats"),
        _medical_text("brats"),
        options=(
            "modality",
            "grades",
            "image_size",
            "train_subjects",
            "test_subjects",
            "slices",
            "intensity",
        ),
    ),
    "monuseg": _Entry(
        "monuseg",
        _medical("monuseg", "load_monuseg"),
        _medical_text("monuseg"),
        options=("split", "organs", "train_per_organ", "test_per_organ", *_PATCH_OPTIONS),
    ),
    "cpm17": _Entry("cpm17", _medical("cpm17", "load_cpm17"), _medical_text("cpm17"), options=_PATCH_OPTIONS),
    "tnbc": _Entry(
        "tnbc", _medical("tnbc", "load_tnbc"), _medical_text("tnbc"), options=("test_slides", *_PATCH_OPTIONS)
    ),
    "nuclei-cross-site": _Entry(
        "",
        _medical("cross_site", "load_cross_site"),
        _medical_text("cross_site"),
        options=(*_PATCH_OPTIONS, "tcga_split", "tnbc_test_slides"),
    ),
    "brats-synthetic-lesions": _Entry(
        "brain-mri",
        _medical("brain_synthetic", "load_brats_synthetic"),
        _medical_text("brain_synthetic", "describe_brain_mri"),
        options=(*_SYNTHETIC_BRAIN_OPTIONS, "real_test"),
    ),
    "brain-lesions-real": _Entry(
        "brain-mri",
        _medical("brain_synthetic", "load_real_lesions"),
        _medical_text("brain_synthetic", "describe_brain_mri"),
        options=("image_size", "slices"),
    ),
    "mni152-synthetic-lesions": _Entry(
        None,
        _medical("brain_synthetic", "load_mni152_synthetic", needs_folder=False),
        _no_files(
            "mni152-synthetic-lesions needs no files: semi-synthetic lesions painted into the MNI152 "
            "template that ships inside the nilearn package."
        ),
        options=_SYNTHETIC_BRAIN_OPTIONS,
    ),
    "nuclei-synthetic-sites": _Entry(
        "nuclei",
        _medical("nuclei_synthetic", "load_nuclei_synthetic"),
        _medical_text("nuclei_synthetic"),
        options=("image_size", "patch_size", "stride", "train_images", "test_images", "seed"),
    ),
}


def _mri_entries() -> dict[str, _Entry]:
    """The MRI reconstruction datasets (fedistill.data.mri), loaded through the same interface."""
    from fedistill.data.mri import ENTRIES

    def loader(name: str) -> Callable[..., LoadedDataset]:
        return lambda folder, download, verify, **options: ENTRIES[name].load(folder, **options)

    return {
        name: _Entry(entry.subdir, loader(name), entry.describe, options=tuple(entry.options))
        for name, entry in ENTRIES.items()
    }


_REGISTRY.update(_mri_entries())


def _text_entries() -> dict[str, _Entry]:
    """The text classification datasets (fedistill.data.text): token ids, no download."""
    from fedistill.data.text import ENTRIES

    def loader(name: str) -> Callable[..., LoadedDataset]:
        return lambda folder, download, verify, **options: ENTRIES[name].load(folder, **options)

    return {
        name: _Entry(entry.subdir, loader(name), entry.describe, options=tuple(entry.options))
        for name, entry in ENTRIES.items()
    }


_REGISTRY.update(_text_entries())


def dataset_names() -> list[str]:
    """The dataset names `load_dataset` accepts, default (`digits`) first."""
    return list(_REGISTRY)


def _resolve(name: str) -> str:
    if not isinstance(name, str):
        raise UserError(f"dataset name must be a string, got {name!r}")
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key in _REGISTRY:
        return key
    raise unknown_name("dataset", name, list(_REGISTRY))


def dataset_options(name: str) -> tuple[str, ...]:
    """The options dataset `name` takes (a text dataset's include `model_dir`, its tokenizer)."""
    return _REGISTRY[_resolve(name)].options


def describe_files(name: str, data_dir: str | Path | None = None) -> str:
    """Which files dataset `name` needs, their md5s, where they go under `data_dir` and where to get them."""
    key = _resolve(name)
    entry = _REGISTRY[key]
    base = str(data_dir) if data_dir is not None else "<data_dir>"
    folder = base if not entry.subdir else f"{base.rstrip('/')}/{entry.subdir}"
    return entry.describe(folder)


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    download: bool = False,
    verify: bool = True,
    **options: object,
) -> LoadedDataset:
    """Load dataset `name` (see `dataset_names()`); `options` are dataset-specific (digits: crop_padding;
    cifar100: labels; mnist, fashion-mnist: image_size, channels (see `reshaped`); image-folder: channels,
    image_size, crop_padding, horizontal_flip; the medical sets: see fedistill.data.medical; the text
    sets: see fedistill.data.text).

    `download` fetches missing files (md5-checked) for the datasets that have a canonical URL;
    `verify=False` skips the md5 check of local files (their format is still checked).
    """
    key = _resolve(name)
    entry = _REGISTRY[key]
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        takes = f"it takes {', '.join(entry.options)}" if entry.options else "it takes none"
        raise ConfigError(f"dataset {key!r} does not take option(s) {', '.join(unknown)}; {takes}")
    if entry.subdir is None:
        return entry.load(None, download, verify, **options)
    if data_dir is None:
        raise DataError(
            f"dataset {key!r} needs files and no data directory was given (--data-dir).\n"
            + describe_files(key)
        )
    root = Path(data_dir).expanduser()
    return entry.load(root / entry.subdir if entry.subdir else root, download, verify, **options)
