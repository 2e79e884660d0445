"""Reader for IDX files (MNIST, Fashion-MNIST, EMNIST), gzip-compressed or raw.

The format is a 4-byte big-endian magic number 0x0000 08 <ndim> (0x08 = unsigned
byte), then <ndim> big-endian uint32 sizes, then the bytes. Everything is checked so
a truncated download or a swapped file is reported by name instead of mis-training.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from fedistill.data.base import ImageSet
from fedistill.errors import DataError

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dims: count, rows, columns
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dim: count
_GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(source: Path | bytes, name: str) -> bytes:
    if isinstance(source, bytes):
        data = source
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise DataError(f"cannot read IDX file {name}: {e}") from e
    if data[:2] == _GZIP_MAGIC:  # by content, not by file name: both spellings occur in the wild
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{name} is a corrupt gzip file ({e}); replace it with a good copy") from e
    return data


def _name(source: Path | bytes, name: str | None, kind: str) -> str:
    """`name`, else the path; content given as bytes is called by its kind, not by the repr of its bytes."""
    if name is not None:
        return name
    return f"IDX {kind} data given as bytes" if isinstance(source, bytes) else str(source)


def read_idx(source: Path | bytes, *, magic: int, name: str | None = None) -> np.ndarray:
    """Decode one IDX file into a read-only uint8 array, requiring the given magic number."""
    name = _name(source, name, {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}.get(magic, "file"))
    data = _read_bytes(source, name)
    if len(data) < 4:
        raise DataError(f"{name} is not an IDX file: only {len(data)} bytes")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        kind = {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}.get(magic, "IDX")
        raise DataError(
            f"{name} is not an IDX {kind} file: magic number 0x{found:08x}, expected 0x{magic:08x}"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{name} is truncated: the IDX header needs {header} bytes, the file has {len(data)}")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        state = "truncated" if len(data) < expected else "longer than its header says"
        raise DataError(
            f"{name} is {state}: dims {dims} need {expected} bytes, the (decompressed) file has {len(data)}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_pair(
    images: Path | bytes,
    labels: Path | bytes,
    *,
    images_name: str | None = None,
    labels_name: str | None = None,
) -> ImageSet:
    """An images file (N, H, W) and its labels file (N,) as an ImageSet of shape (N, 1, H, W)."""
    images_name = _name(images, images_name, "images")
    labels_name = _name(labels, labels_name, "labels")
    x = read_idx(images, magic=IMAGES_MAGIC, name=images_name)
    y = read_idx(labels, magic=LABELS_MAGIC, name=labels_name)
    if x.shape[0] != y.shape[0]:
        raise DataError(
            f"{images_name} holds {x.shape[0]} images but {labels_name} holds {y.shape[0]} labels; "
            "the two files do not belong together"
        )
    if x.shape[1] == 0 or x.shape[2] == 0:
        raise DataError(f"{images_name} has empty images of size {x.shape[1]}x{x.shape[2]}")
    x_t = torch.from_numpy(x.copy()).unsqueeze(1)  # copy: frombuffer arrays are read-only
    y_t = torch.from_numpy(y.astype(np.int64))
    return ImageSet(x_t, y_t)
