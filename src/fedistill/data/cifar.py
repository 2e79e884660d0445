"""CIFAR-10 and CIFAR-100 from the official python-pickle batches.

Either the extracted folder (`cifar-10-batches-py/`, `cifar-100-python/`) or the
official `.tar.gz` archive is read; the archive is streamed with tarfile and never
extracted to disk; the binary and MATLAB versions are not read (a missing-file message names them when they
are in the folder). The batches are pickles, and unpickling runs code named in the
file, so they go through `RestrictedUnpickler`, which builds numpy arrays and
nothing else.
"""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.data.files import RemoteFile, fetch_or_require, md5_bytes, read_file
from fedistill.errors import ConfigError, DataError

CIFAR10_ARCHIVE = RemoteFile(
    "cifar-10-python.tar.gz",
    "c58f30108f718f92721af3b95e74349a",
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
)
CIFAR100_ARCHIVE = RemoteFile(
    "cifar-100-python.tar.gz",
    "eb9058c3a382ffc7106e4002c42a8d85",
    "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
)
#: The binary and MATLAB versions of the archives, and the folders they unpack to: only the python one is read
OTHER_VERSIONS = (
    "cifar-10-binary.tar.gz",
    "cifar-10-matlab.tar.gz",
    "cifar-10-batches-bin",
    "cifar-10-batches-mat",
    "cifar-100-binary.tar.gz",
    "cifar-100-matlab.tar.gz",
    "cifar-100-binary",
    "cifar-100-matlab",
)
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_META = "batches.meta"

# md5s of the extracted files, as published with the archives (the torchvision values).
KNOWN_MD5 = {
    f"{CIFAR10_DIR}/data_batch_1": "c99cafc152244af753f735de768cd75f",
    f"{CIFAR10_DIR}/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    f"{CIFAR10_DIR}/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    f"{CIFAR10_DIR}/data_batch_4": "634d18415352ddfa80567beed471001a",
    f"{CIFAR10_DIR}/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    f"{CIFAR10_DIR}/test_batch": "40351d587109b95175f43aff81a1287e",
    f"{CIFAR10_DIR}/{CIFAR10_META}": "5ff9c542aee3614f3951f8cda6e48888",
    f"{CIFAR100_DIR}/train": "16019d7e3df5f24257cddd939b257f8d",
    f"{CIFAR100_DIR}/test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    f"{CIFAR100_DIR}/meta": "7973b15100ade9c7d40fb424638fde48",
}

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)

_PIXELS = 3 * 32 * 32
_RECONSTRUCT = np.empty(0).__reduce__()[0]  # numpy's array-rebuilding function, whatever module it lives in
# Under pickle protocol 5 (Python 3.14's default) numpy pickles an array as frombuffer(bytes, dtype) instead.
_FROMBUFFER = np.empty(1).__reduce_ex__(5)[0]
# The globals the real batches name: numpy 1.x wrote `numpy.core.multiarray`, numpy 2.x `numpy._core`.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that can rebuild numpy arrays and plain containers and refuses every other global.

    A pickle can name any importable callable (os.system, ...) and have it called
    while loading; refusing in `find_class` stops that before anything runs.
    """

    def __init__(self, file: io.BufferedIOBase | io.BytesIO, *, source: str) -> None:
        super().__init__(file, encoding="bytes")  # the batches were written by Python 2
        self.source = source

    def find_class(self, module: str, name: str) -> object:
        """Only the numpy globals a CIFAR batch needs; anything else is refused, so a crafted file cannot run
        code."""
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(
                f"{self.source} is not a CIFAR batch file: its pickle asks for {module}.{name}, "
                "which is refused (only numpy arrays are allowed); do not use this file"
            ) from None


def restricted_loads(data: bytes, source: str) -> object:
    """Unpickle `data` with RestrictedUnpickler; any malformed content becomes a DataError naming `source`."""
    try:
        return RestrictedUnpickler(io.BytesIO(data), source=source).load()
    except DataError:
        raise
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        struct.error,
        RecursionError,
    ) as e:
        raise DataError(f"{source} is not a valid CIFAR python batch ({type(e).__name__}: {e})") from e


def _get(d: dict, key: str, source: str) -> object:
    for k in (key.encode(), key):  # bytes keys as written by Python 2; str if re-saved by Python 3
        if k in d:
            return d[k]
    raise DataError(f"{source} is not a CIFAR batch file: it has no '{key}' entry")


def _names(value: object, source: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise DataError(f"{source}: the class names are not a list")
    return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in value)


def _parse_batch(data: bytes, source: str, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 from one batch file's bytes."""
    obj = restricted_loads(data, source)
    if not isinstance(obj, dict):
        raise DataError(f"{source} is not a CIFAR batch file: it holds a {type(obj).__name__}, not a dict")
    x = _get(obj, "data", source)
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != _PIXELS:
        desc = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise DataError(f"{source}: 'data' must be a uint8 array of shape (N, {_PIXELS}), got {desc}")
    try:
        y = np.asarray(_get(obj, label_key, source), dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise DataError(f"{source}: '{label_key}' is not a list of integers") from e
    if y.shape != (x.shape[0],):
        raise DataError(f"{source} holds {x.shape[0]} images but {y.size} '{label_key}'")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{source}: labels must be in 0..{num_classes - 1}, found {y.min()}..{y.max()}")
    # Each row is 1024 red, then 1024 green, then 1024 blue bytes, each plane row-major.
    return x.reshape(-1, 3, 32, 32), y


def _check_md5(data: bytes, key: str, source: str, verify: bool, archive: RemoteFile) -> None:
    expected = KNOWN_MD5.get(key)
    if verify and expected is not None and (actual := md5_bytes(data)) != expected:
        raise DataError(
            f"dataset file {source} is corrupt or a different version: md5 is {actual}, expected {expected}; "
            f"replace it with the file from the official {archive.name} ({archive.url})"
        )


def _missing_message(folder: Path, dir_name: str, members: Sequence[str], archive: RemoteFile) -> str:
    others = [name for name in OTHER_VERSIONS if (folder / name).exists()]
    return (
        f"CIFAR files not found in {folder}: put the official {archive.name} (md5 {archive.md5}) "
        f"at exactly {folder / archive.name}, or its extracted folder at {folder / dir_name}/ "
        f"with the files {', '.join(members)}; or pass --download (download=True) when online "
        f"to fetch {archive.url}"
        + "".join(
            f". {name} is another version of the dataset, not read: use the python version" for name in others
        )
    )


def read_cifar_files(
    folder: Path,
    dir_name: str,
    archive: RemoteFile,
    required: Sequence[str],
    optional: Sequence[str] = (),
    *,
    download: bool = False,
    verify: bool = True,
) -> tuple[dict[str, bytes], dict[str, str]]:
    """The bytes of the named batch files, from `folder/dir_name/` if present, else from the archive, and
    each file's name for messages (a member of the archive is `<archive>:<dir_name>/<member>`).

    With `verify`, extracted files are checked against KNOWN_MD5 and the archive against its md5. An
    extracted folder that lacks a required file (an unpacking cut short) gives way to the archive when
    that is there, or is downloaded when `download` is set.
    """
    extracted = folder / dir_name
    wanted = [*required, *optional]
    out: dict[str, bytes] = {}
    complete = all((extracted / member).is_file() for member in required)
    if extracted.is_dir() and (complete or not (download or (folder / archive.name).is_file())):
        for member in wanted:
            path = extracted / member
            if not path.is_file():
                if member in required:
                    raise DataError(
                        f"missing dataset file {path}. "
                        + _missing_message(folder, dir_name, required, archive)
                    )
                continue
            out[member] = read_file(path)
            _check_md5(out[member], f"{dir_name}/{member}", str(path), verify, archive)
        return out, {m: str(extracted / m) for m in out}
    if not download and not (folder / archive.name).is_file():
        raise DataError(_missing_message(folder, dir_name, required, archive))
    archive_path = fetch_or_require(folder, archive, download_missing=download, verify=verify)
    by_name = {f"{dir_name}/{m}": m for m in wanted}
    try:
        with tarfile.open(archive_path, "r:gz") as tar:
            for info in tar:  # one sequential pass: seeking backwards in a .tar.gz re-decompresses
                member = by_name.get(info.name.removeprefix("./"))
                if member is not None and info.isfile():
                    f = tar.extractfile(info)
                    if f is not None:
                        out[member] = f.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:  # zlib: corrupt compressed data
        raise DataError(f"{archive_path} is not a readable .tar.gz archive ({e}); replace it") from e
    absent = [m for m in required if m not in out]
    if absent:
        raise DataError(
            f"{archive_path} lacks {', '.join(f'{dir_name}/{m}' for m in absent)}; "
            f"it is not the official {archive.name} (md5 {archive.md5})"
        )
    return out, {m: f"{archive_path}:{dir_name}/{m}" for m in out}


def _image_set(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> ImageSet:
    x = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    y = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    return ImageSet(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y)))


def load_cifar10(folder: str | Path, *, download: bool = False, verify: bool = True) -> LoadedDataset:
    """CIFAR-10 (50,000 train / 10,000 test, 32x32 RGB) from the archive or extracted folder in `folder`."""
    folder = Path(folder)
    files, src = read_cifar_files(
        folder,
        CIFAR10_DIR,
        CIFAR10_ARCHIVE,
        [*CIFAR10_TRAIN, "test_batch"],
        [CIFAR10_META],
        download=download,
        verify=verify,
    )
    train = _image_set([_parse_batch(files[m], src[m], "labels", 10) for m in CIFAR10_TRAIN])
    test = _image_set([_parse_batch(files["test_batch"], src["test_batch"], "labels", 10)])
    class_names = CIFAR10_CLASSES
    if CIFAR10_META in files:
        meta = restricted_loads(files[CIFAR10_META], src[CIFAR10_META])
        if not isinstance(meta, dict):
            raise DataError(f"{src[CIFAR10_META]} is not a CIFAR meta file")
        class_names = _names(_get(meta, "label_names", src[CIFAR10_META]), src[CIFAR10_META])
        if len(class_names) != 10:
            raise DataError(f"{src[CIFAR10_META]} names {len(class_names)} classes, expected 10")
    info = DatasetInfo(
        name="cifar10",
        channels=3,
        image_size=32,
        num_classes=10,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        crop_padding=4,
        horizontal_flip=True,
        class_names=class_names,
    )
    return LoadedDataset(info=info, train=train, test=test)


def load_cifar100(
    folder: str | Path, *, download: bool = False, verify: bool = True, labels: str = "fine"
) -> LoadedDataset:
    """CIFAR-100 (50,000 train / 10,000 test); `labels`: "fine" (100 classes) or "coarse" (20 classes)."""
    if labels not in ("fine", "coarse"):
        raise ConfigError(f"cifar100 option labels must be 'fine' or 'coarse', got {labels!r}")
    folder = Path(folder)
    num_classes = 100 if labels == "fine" else 20
    files, src = read_cifar_files(
        folder, CIFAR100_DIR, CIFAR100_ARCHIVE, ["train", "test", "meta"], download=download, verify=verify
    )
    key = f"{labels}_labels"
    train = _image_set([_parse_batch(files["train"], src["train"], key, num_classes)])
    test = _image_set([_parse_batch(files["test"], src["test"], key, num_classes)])
    meta = restricted_loads(files["meta"], src["meta"])
    if not isinstance(meta, dict):
        raise DataError(f"{src['meta']} is not a CIFAR meta file")
    class_names = _names(_get(meta, f"{labels}_label_names", src["meta"]), src["meta"])
    if len(class_names) != num_classes:
        raise DataError(f"{src['meta']} names {len(class_names)} {labels} classes, expected {num_classes}")
    info = DatasetInfo(
        name="cifar100",
        channels=3,
        image_size=32,
        num_classes=num_classes,
        mean=CIFAR100_MEAN,
        std=CIFAR100_STD,
        crop_padding=4,
        horizontal_flip=True,
        class_names=class_names,
    )
    return LoadedDataset(info=info, train=train, test=test)
