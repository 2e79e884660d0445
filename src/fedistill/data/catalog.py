"""The dataset declarations: each name's folder under `data_dir`, its loader, the text that says which
files go where, and the options it takes; and the aliases users may type instead of a name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedistill.data.base import LoadedDataset
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
from fedistill.data.files import RemoteFile
from fedistill.data.image_folder import LAYOUT, load_image_folder
from fedistill.data.mask_folder import LAYOUT as MASK_LAYOUT
from fedistill.data.mask_folder import load_mask_folder
from fedistill.data.mnist_like import (
    DIGIT_CLASSES,
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_FILES,
    MNIST_FILES,
    describe_emnist,
    describe_mnist_like,
    load_emnist,
    load_mnist_like,
)

ALIASES = {
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
class DatasetEntry:
    """How to load one dataset and how to tell the user which files it needs."""

    subdir: str | None  # folder under data_dir; None: needs no files ("" = data_dir itself)
    load: Callable[..., LoadedDataset]  # (folder, download, verify, **options)
    describe: Callable[[str], str]  # (folder shown to the user) -> which files go where
    options: tuple[str, ...] = ()
    #: the loader reads a folder holding a test set alone (`test_alone=True`: an empty training set), as the
    #: server of sites with their own data may hold when it holds out no validation split
    test_alone: bool = False


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
_SYNTHETIC_BRAIN_OPTIONS = (
    "image_size",
    "train_subjects",
    "test_subjects",
    "seed",
    "slices",
    "synthesis",
    "randomised_fraction",
)


DATASETS: dict[str, DatasetEntry] = {
    "digits": DatasetEntry(
        None,
        lambda folder, download, verify, **options: load_digits_dataset(**options),
        _no_files(
            "digits needs no files: it is scikit-learn's embedded copy of the UCI 8x8 handwritten digits."
        ),
        options=("crop_padding",),
    ),
    "mnist": DatasetEntry(
        "mnist",
        load_mnist_like("mnist", "MNIST", MNIST_FILES, DIGIT_CLASSES),
        describe_mnist_like("MNIST", MNIST_FILES),
        options=("image_size", "channels", "crop_padding", "horizontal_flip"),
    ),
    "fashion-mnist": DatasetEntry(
        "fashion-mnist",
        load_mnist_like("fashion-mnist", "Fashion-MNIST", FASHION_MNIST_FILES, FASHION_MNIST_CLASSES),
        describe_mnist_like("Fashion-MNIST", FASHION_MNIST_FILES),
        options=("image_size", "channels", "crop_padding", "horizontal_flip"),
    ),
    **{
        f"emnist-{split}": DatasetEntry("emnist", load_emnist(split), describe_emnist(split))
        for split in ("digits", "letters", "balanced", "byclass", "bymerge", "mnist")
    },
    "cifar10": DatasetEntry(
        "cifar10",
        lambda folder, download, verify: load_cifar10(folder, download=download, verify=verify),
        _describe_cifar(
            "CIFAR-10", CIFAR10_ARCHIVE, CIFAR10_DIR, (*CIFAR10_TRAIN, "test_batch", CIFAR10_META)
        ),
    ),
    "cifar100": DatasetEntry(
        "cifar100",
        lambda folder, download, verify, **opts: load_cifar100(
            folder, download=download, verify=verify, **opts
        ),
        _describe_cifar("CIFAR-100", CIFAR100_ARCHIVE, CIFAR100_DIR, ("train", "test", "meta")),
        options=("labels",),
    ),
    "image-folder": DatasetEntry(
        "",
        lambda folder, download, verify, **opts: load_image_folder(folder, **opts),
        _no_files(
            f"image-folder reads your own images from data_dir with the layout {LAYOUT}; "
            "class folder names sorted alphabetically give the labels (or the option classes, in order)."
        ),
        options=("channels", "image_size", "crop_padding", "horizontal_flip", "classes"),
        test_alone=True,
    ),
    "mask-folder": DatasetEntry(
        "",
        lambda folder, download, verify, **opts: load_mask_folder(folder, **opts),
        _no_files(
            f"mask-folder reads your own 2D images and their label masks from data_dir with the layout "
            f"{MASK_LAYOUT}; each mask value is a class (0 the background; 0/255 masks read as 0/1)."
        ),
        options=("channels", "image_size", "classes", "foreground"),
        test_alone=True,
    ),
    "brats": DatasetEntry(
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
    "nifti-folder": DatasetEntry(
        "",
        _medical("nifti_folder", "load_nifti_folder"),
        _medical_text("nifti_folder"),
        options=("image_size", "window", "classes", "foreground", "slices", "channel", "test_fraction"),
        test_alone=True,
    ),
    "monuseg": DatasetEntry(
        "monuseg",
        _medical("monuseg", "load_monuseg"),
        _medical_text("monuseg"),
        options=("split", "organs", "train_per_organ", "test_per_organ", *_PATCH_OPTIONS),
    ),
    "cpm17": DatasetEntry(
        "cpm17", _medical("cpm17", "load_cpm17"), _medical_text("cpm17"), options=_PATCH_OPTIONS
    ),
    "tnbc": DatasetEntry(
        "tnbc", _medical("tnbc", "load_tnbc"), _medical_text("tnbc"), options=("test_slides", *_PATCH_OPTIONS)
    ),
    "nuclei-cross-site": DatasetEntry(
        "",
        _medical("cross_site", "load_cross_site"),
        _medical_text("cross_site"),
        options=(*_PATCH_OPTIONS, "tcga_split", "tnbc_test_slides"),
    ),
    "brats-synthetic-lesions": DatasetEntry(
        "brain-mri",
        _medical("brain_synthetic", "load_brats_synthetic"),
        _medical_text("brain_synthetic", "describe_brain_mri"),
        options=(*_SYNTHETIC_BRAIN_OPTIONS, "real_test", "real_skull", "real_intensity"),
    ),
    "brain-lesions-real": DatasetEntry(
        "brain-mri",
        _medical("brain_synthetic", "load_real_lesions"),
        _medical_text("brain_synthetic", "describe_brain_mri"),
        options=("image_size", "slices", "skull", "intensity"),
    ),
    "mni152-synthetic-lesions": DatasetEntry(
        None,
        _medical("brain_synthetic", "load_mni152_synthetic", needs_folder=False),
        _no_files(
            "mni152-synthetic-lesions needs no files: semi-synthetic lesions painted into the MNI152 "
            "template that ships inside the nilearn package."
        ),
        options=_SYNTHETIC_BRAIN_OPTIONS,
    ),
    "nuclei-synthetic-sites": DatasetEntry(
        "nuclei",
        _medical("nuclei_synthetic", "load_nuclei_synthetic"),
        _medical_text("nuclei_synthetic"),
        options=("image_size", "patch_size", "stride", "train_images", "test_images", "seed"),
    ),
}


def _mri_entries() -> dict[str, DatasetEntry]:
    """The MRI reconstruction datasets (fedistill.data.mri), loaded through the same interface."""
    from fedistill.data.mri import ENTRIES

    def loader(name: str) -> Callable[..., LoadedDataset]:
        return lambda folder, download, verify, **options: ENTRIES[name].load(folder, **options)

    return {
        name: DatasetEntry(entry.subdir, loader(name), entry.describe, options=tuple(entry.options))
        for name, entry in ENTRIES.items()
    }


DATASETS.update(_mri_entries())


def _text_entries() -> dict[str, DatasetEntry]:
    """The text classification datasets (fedistill.data.text): token ids, no download."""
    from fedistill.data.text import ENTRIES

    def loader(name: str) -> Callable[..., LoadedDataset]:
        return lambda folder, download, verify, **options: ENTRIES[name].load(folder, **options)

    return {
        name: DatasetEntry(entry.subdir, loader(name), entry.describe, options=tuple(entry.options))
        for name, entry in ENTRIES.items()
    }


DATASETS.update(_text_entries())
