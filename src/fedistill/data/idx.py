"""Reader for IDX files (MNIST, Fashion-MNIST, EMNIST), gzip-compressed or raw.

The format is a 4-byte big-endian magic number 0x0000 08 <ndim> (0x08 = unsigned
byte), then <ndim> big-endian uint32 sizes, then the bytes. Everything is checked so
a truncated download or a swapped file is reported by name instead of mis-training.
The pixels are streamed into the array that is returned, so a large file (EMNIST
byclass: 550 MB decompressed) costs one copy of its pixels, not three.
"""

from __future__ import annotations

import gzip
import io
import zlib
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from fedistill.data.base import ImageSet
from fedistill.errors import DataError

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dims: count, rows, columns
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dim: count
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20  # bytes staged at a time when the images are transposed on the way in


class _Stream:
    """The decompressed bytes of an IDX file, read in pieces; read errors become DataErrors naming it."""

    def __init__(self, source: Path | bytes, name: str, stack: ExitStack) -> None:
        self.name = name
        try:
            raw: BinaryIO = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")  # noqa: SIM115
            stack.enter_context(raw)
            self.gzipped = raw.read(2) == _GZIP_MAGIC  # by content, not by file name: both spellings occur
            raw.seek(0)
        except OSError as e:
            raise DataError(f"cannot read IDX file {name}: {e}") from e
        self.file: BinaryIO = stack.enter_context(gzip.GzipFile(fileobj=raw)) if self.gzipped else raw

    def _error(self, e: Exception) -> DataError:
        if self.gzipped:
            return DataError(f"{self.name} is a corrupt gzip file ({e}); replace it with a good copy")
        return DataError(f"cannot read IDX file {self.name}: {e}")

    def fill(self, buffer: memoryview) -> int:
        """Read into `buffer` until it is full or the file ends; the number of bytes read."""
        done = 0
        try:
            while done < len(buffer) and (got := self.file.readinto(buffer[done:])):
                done += got
        except (OSError, EOFError, zlib.error) as e:
            raise self._error(e) from e
        return done

    def rest(self) -> int:
        """Read to the end (so a corrupt gzip stream is found); the number of bytes that were left."""
        scratch, total = memoryview(bytearray(1 << 16)), 0
        while got := self.fill(scratch):
            total += got
        return total


def _name(source: Path | bytes, name: str | None, kind: str) -> str:
    """`name`, else the path; content given as bytes is called by its kind, not by the repr of its bytes."""
    if name is not None:
        return name
    return f"IDX {kind} data given as bytes" if isinstance(source, bytes) else str(source)


def _dims(name: str, magic: int, head: bytes, length: int) -> tuple[int, ...]:
    """The sizes in the header `head` of a file of `length` decompressed bytes; a DataError if it is not
    an IDX file with `magic` or its length does not match them."""
    if length < 4:
        raise DataError(f"{name} is not an IDX file: only {length} bytes")
    found = int.from_bytes(head[:4], "big")
    if found != magic:
        kind = {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}.get(magic, "IDX")
        raise DataError(
            f"{name} is not an IDX {kind} file: magic number 0x{found:08x}, expected 0x{magic:08x}"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if length < header:
        raise DataError(f"{name} is truncated: the IDX header needs {header} bytes, the file has {length}")
    dims = _sizes(head, ndim)
    expected = header + int(np.prod(dims, dtype=np.int64))
    if length != expected:
        state = "truncated" if length < expected else "longer than its header says"
        raise DataError(
            f"{name} is {state}: dims {dims} need {expected} bytes, the (decompressed) file has {length}"
        )
    return dims


def _sizes(head: bytes | bytearray, ndim: int) -> tuple[int, ...]:
    """The `ndim` big-endian uint32 sizes after the magic number in the header `head`."""
    return tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))


def _read_body(stream: _Stream, dims: tuple[int, ...], transposed: bool) -> tuple[np.ndarray | None, int]:
    """The pixels (last two axes swapped if `transposed`) and how many bytes were read; None for the array
    when the file ends early or the sizes cannot be allocated (a broken header)."""
    shape = (*dims[:-2], dims[-1], dims[-2]) if transposed else dims
    try:
        out = np.empty(shape, dtype=np.uint8)
    except (MemoryError, ValueError):
        return None, 0
    if not transposed or out.size == 0:
        done = stream.fill(memoryview(out.reshape(-1)))
        return (out if done == out.size else None), done
    item = dims[-2] * dims[-1]
    batch = np.empty((max(1, _CHUNK // item), dims[-2], dims[-1]), dtype=np.uint8)
    done = 0
    for start in range(0, dims[0], len(batch)):
        count = min(len(batch), dims[0] - start)
        got = stream.fill(memoryview(batch[:count].reshape(-1)))
        done += got
        if got < count * item:
            return None, done
        out[start : start + count] = batch[:count].transpose(0, 2, 1)
    return out, done


def read_idx(
    source: Path | bytes, *, magic: int, name: str | None = None, transposed: bool = False
) -> np.ndarray:
    """Decode one IDX file into a new uint8 array, requiring the given magic number; `transposed` swaps the
    last two axes as the file is read (NIST stores each EMNIST image transposed)."""
    name = _name(source, name, {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}.get(magic, "file"))
    header = 4 + 4 * (magic & 0xFF)
    with ExitStack() as stack:
        stream = _Stream(source, name, stack)
        head = bytearray(header)
        got = stream.fill(memoryview(head))
        out, done = None, 0
        if got == header and int.from_bytes(head[:4], "big") == magic:
            dims = _sizes(head, magic & 0xFF)
            out, done = _read_body(stream, dims, transposed and len(dims) >= 2)
        length = got + done + stream.rest()  # to the end: a corrupt gzip stream is reported first
        _dims(name, magic, bytes(head), length)
    if out is None:  # unreachable unless the header is valid yet unallocatable and the file is that long
        raise DataError(f"{name} holds more data than this machine can load")
    return out


def read_idx_pair(
    images: Path | bytes,
    labels: Path | bytes,
    *,
    images_name: str | None = None,
    labels_name: str | None = None,
    transposed: bool = False,
) -> ImageSet:
    """An images file (N, H, W) and its labels file (N,) as an ImageSet of shape (N, 1, H, W), or
    (N, 1, W, H) with `transposed`."""
    images_name = _name(images, images_name, "images")
    labels_name = _name(labels, labels_name, "labels")
    x = read_idx(images, magic=IMAGES_MAGIC, name=images_name, transposed=transposed)
    y = read_idx(labels, magic=LABELS_MAGIC, name=labels_name)
    if x.shape[0] != y.shape[0]:
        raise DataError(
            f"{images_name} holds {x.shape[0]} images but {labels_name} holds {y.shape[0]} labels; "
            "the two files do not belong together"
        )
    rows, cols = (x.shape[2], x.shape[1]) if transposed else (x.shape[1], x.shape[2])
    if rows == 0 or cols == 0:
        raise DataError(f"{images_name} has empty images of size {rows}x{cols}")
    x_t = torch.from_numpy(x).unsqueeze(1)  # a fresh array: the tensor shares it, no copy
    y_t = torch.from_numpy(y.astype(np.int64))
    return ImageSet(x_t, y_t)
