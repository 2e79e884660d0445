"""EMNIST loading: the arrays pinned bit for bit against the raw files, and its peak memory bounded."""

from __future__ import annotations

import gzip
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedistill.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx_pair
from fedistill.data.mnist_like import load_emnist


def _idx(arr: np.ndarray) -> bytes:
    magic = IMAGES_MAGIC if arr.ndim == 3 else LABELS_MAGIC
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape) + arr.tobytes()


def _split_files(split: str, n_train: int, n_test: int, rows: int, cols: int) -> dict[str, bytes]:
    """Gzip IDX files as NIST names them, with images that are not symmetric so a transpose shows."""
    rng = np.random.default_rng(7)
    first = 1 if split == "letters" else 0
    files = {}
    for part, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, size=(n, rows, cols), dtype=np.uint8)
        y = rng.integers(first, first + 10, size=n, dtype=np.uint8)
        files[f"emnist-{split}-{part}-images-idx3-ubyte.gz"] = gzip.compress(_idx(x), compresslevel=1)
        files[f"emnist-{split}-{part}-labels-idx1-ubyte.gz"] = gzip.compress(_idx(y), compresslevel=1)
    return files


def _expected(images_gz: bytes, labels_gz: bytes, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What the loader has always returned, computed from the raw bytes: IDX pixels (N, H, W) transposed
    to (N, 1, W, H) uint8 contiguous, labels int64 (letters shifted from 1..26 to 0..25)."""
    raw, lab = gzip.decompress(images_gz), gzip.decompress(labels_gz)
    n, h, w = struct.unpack(">III", raw[4:16])
    x = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, h, w)
    y = np.frombuffer(lab, dtype=np.uint8, offset=8).astype(np.int64)
    x_t = torch.from_numpy(x.copy()).unsqueeze(1).transpose(2, 3).contiguous()
    y_t = torch.from_numpy(y)
    return x_t, (y_t - 1 if split == "letters" else y_t)


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert got.is_contiguous() and torch.equal(got, want)


@pytest.mark.parametrize("split", ["balanced", "letters"])
@pytest.mark.parametrize("layout", ["loose", "zip"])
def test_emnist_arrays_match_the_raw_files(tmp_path: Path, split: str, layout: str) -> None:
    files = _split_files(split, 37, 11, 28, 28)
    if layout == "loose":
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
    else:
        with zipfile.ZipFile(tmp_path / "gzip.zip", "w") as zf:
            for name, data in files.items():
                zf.writestr(f"gzip/{name}", data)
    ds = load_emnist(split)(tmp_path, download=False, verify=False)
    for part, got in (("train", ds.train), ("test", ds.test)):
        x, y = _expected(
            files[f"emnist-{split}-{part}-images-idx3-ubyte.gz"],
            files[f"emnist-{split}-{part}-labels-idx1-ubyte.gz"],
            split,
        )
        _assert_same(got.x, x)
        _assert_same(got.y, y)
    assert ds.info.image_size == 28


def test_non_square_transposed_images_swap_their_sides(tmp_path: Path) -> None:
    files = _split_files("digits", 5, 3, 6, 9)
    images, labels = (files[f"emnist-digits-train-{k}-ubyte.gz"] for k in ("images-idx3", "labels-idx1"))
    got = read_idx_pair(images, labels, transposed=True)
    x, y = _expected(images, labels, "digits")
    assert got.x.shape == (5, 1, 9, 6)
    _assert_same(got.x, x)
    _assert_same(got.y, y)
    plain = read_idx_pair(images, labels)
    _assert_same(plain.x, x.transpose(2, 3).contiguous())


def test_emnist_peak_memory_is_about_one_copy_of_the_images(tmp_path: Path) -> None:
    """tracemalloc sees numpy's and Python's allocations (the loader's image tensors are numpy-backed);
    a second full copy of the 20,000 images would push the peak past the bound."""
    n, m = 20_000, 1_000
    files = _split_files("byclass", n, m, 28, 28)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    del files
    decompressed = (n + m) * 28 * 28
    tracemalloc.start()
    try:
        ds = load_emnist("byclass")(tmp_path, download=False, verify=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ds.train.x.shape == (n, 1, 28, 28)
    assert peak < 1.25 * decompressed, f"peak {peak} bytes for {decompressed} bytes of images"
