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

from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.catalog import ALIASES, DATASETS
from fedistill.errors import ConfigError, DataError, UserError, unknown_name
from fedistill.plugins import import_declared

#: The entry-point group whose modules add datasets to `DATASETS` when imported (a package's pyproject.toml:
#: `[project.entry-points."fedistill.datasets"] my-scans = "my_package.my_scans"`), so that every process
#: (the command line, Flower's nodes) knows them
PLUGIN_GROUP = "fedistill.datasets"


def dataset_names() -> list[str]:
    """The dataset names `load_dataset` accepts, default (`digits`) first."""
    return list(DATASETS)


def canonical_dataset_name(name: str) -> str:
    """The registered name of dataset `name`, whichever spelling a user typed (case, `_` for `-`, an alias
    such as `sst-2` or `fmnist`); the unknown-name error when it names none."""
    if not isinstance(name, str):
        raise UserError(f"dataset name must be a string, got {name!r}")
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key in DATASETS:
        return key
    if key in PLUGIN_ERRORS:
        raise UserError(f"dataset {key!r} is declared by an installed package, but {PLUGIN_ERRORS[key]}")
    raise unknown_name("dataset", name, list(DATASETS))


#: Datasets cut from one release, whose training images overlap: EMNIST's splits all come from NIST Special
#: Database 19 (byclass holds every character of the others), which also holds the scans MNIST was drawn from.
SAME_RELEASE = (frozenset({"mnist", *(n for n in DATASETS if n.startswith("emnist-"))}),)


def same_images(name: str, other: str) -> bool:
    """Whether datasets `name` and `other` may hold the same training images: one dataset (any alias), or
    two splits of one release (`SAME_RELEASE`). Distilling on such a dataset would put a federation's
    private training images on its server."""
    a, b = canonical_dataset_name(name), canonical_dataset_name(other)
    return a == b or any(a in release and b in release for release in SAME_RELEASE)


def dataset_options(name: str) -> tuple[str, ...]:
    """The options dataset `name` takes (a text dataset's include `model_dir`, its tokenizer)."""
    return DATASETS[canonical_dataset_name(name)].options


def describe_files(name: str, data_dir: str | Path | None = None) -> str:
    """Which files dataset `name` needs, their md5s, where they go under `data_dir` and where to get them."""
    key = canonical_dataset_name(name)
    entry = DATASETS[key]
    base = str(data_dir) if data_dir is not None else "<data_dir>"
    folder = base if not entry.subdir else f"{base.rstrip('/')}/{entry.subdir}"
    return entry.describe(folder)


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    download: bool = False,
    verify: bool = True,
    test_alone: bool = False,
    **options: object,
) -> LoadedDataset:
    """Load dataset `name` (see `dataset_names()`); `options` are dataset-specific (digits: crop_padding;
    cifar100: labels; mnist, fashion-mnist: image_size, channels, crop_padding, horizontal_flip (see
    `mnist_like`); image-folder: channels, image_size, crop_padding, horizontal_flip; the medical sets: see
    fedistill.data.medical; the text sets: see fedistill.data.text).

    `download` fetches missing files (md5-checked) for the datasets that have a canonical URL;
    `verify=False` skips the md5 check of local files (their format is still checked); `test_alone=True` lets
    a dataset whose loader can (`DatasetEntry.test_alone`: the image and mask folders) read a folder holding
    a test set alone, with an empty training set (other datasets read their files as always).
    """
    key = canonical_dataset_name(name)
    entry = DATASETS[key]
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
    if test_alone and entry.test_alone:
        options = {**options, "test_alone": True}
    root = Path(data_dir).expanduser()
    return entry.load(root / entry.subdir if entry.subdir else root, download, verify, **options)


#: Declared dataset modules that failed to import: their name -> why (imported last, so that such a module
#: may use this module's names)
PLUGIN_ERRORS: dict[str, str] = import_declared(PLUGIN_GROUP)
