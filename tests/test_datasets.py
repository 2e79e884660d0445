"""Dataset loaders on small files written in each published format, and the real MNIST files if present."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import re
import socket
import struct
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import SHARED_DATA  # FEDISTILL_SHARED_DATA, else FEDISTILL_DATA, else beside the checkout
from fedistill.data.cifar import RestrictedUnpickler, load_cifar10, restricted_loads
from fedistill.data.files import RemoteFile, download, md5_bytes, md5_file, require_file
from fedistill.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx, read_idx_pair
from fedistill.data.registry import dataset_names, describe_files, load_dataset
from fedistill.data.text.tokens import read_text_file
from fedistill.errors import ConfigError, DataError, UserError

MNIST_TRAIN_IMAGES_MD5 = "f68b3c2dcbeaaa9fbdd348bbdeb94873"


# ---------------------------------------------------------------- writers for the published formats


def idx_bytes(arr: np.ndarray) -> bytes:
    magic = IMAGES_MAGIC if arr.ndim == 3 else LABELS_MAGIC
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def write_idx(path: Path, arr: np.ndarray, *, gz: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def py2_pickle(obj: object) -> bytes:
    """Pickle the way Python 2's cPickle wrote the CIFAR batches: protocol 2, str as BINSTRING,
    numpy arrays rebuilt by `numpy.core.multiarray._reconstruct` (numpy 1.x paths)."""
    out = bytearray(b"\x80\x02")

    def save(o: object) -> None:
        if o is None:
            out.extend(b"N")
        elif isinstance(o, bool):
            out.extend(b"\x88" if o else b"\x89")
        elif isinstance(o, int):
            out.extend(b"J" + struct.pack("<i", o))
        elif isinstance(o, bytes):
            out.extend(b"T" + struct.pack("<i", len(o)) + o)
        elif isinstance(o, tuple):
            out.extend(b"(")
            for v in o:
                save(v)
            out.extend(b"t")
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                save(v)
            out.extend(b"e")
        elif isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                save(k)
                save(v)
            out.extend(b"u")
        elif isinstance(o, np.ndarray):
            assert o.dtype == np.uint8
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n")
            save((0,))
            save(b"b")
            out.extend(b"tR")  # _reconstruct(ndarray, (0,), 'b')
            out.extend(b"(J\x01\x00\x00\x00")  # state: (1, shape, dtype, fortran, data)
            save(tuple(o.shape))
            out.extend(b"cnumpy\ndtype\n")
            save((b"u1", False, True))
            out.extend(b"R")
            save((3, b"|", None, None, None, -1, -1, 0))
            out.extend(b"b")  # dtype.__setstate__
            out.extend(b"\x89")
            save(np.ascontiguousarray(o).tobytes())
            out.extend(b"tb")  # ndarray.__setstate__
        else:
            raise TypeError(type(o))

    save(obj)
    out.extend(b".")
    return bytes(out)


def cifar_images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3 * 32 * 32), dtype=np.uint8)


def cifar10_files(n: int = 3) -> dict[str, bytes]:
    files = {}
    for i, name in enumerate([*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]):
        labels = [(i + j) % 10 for j in range(n)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": cifar_images(n, i)}
        batch[b"filenames"] = [f"img{j}.png".encode() for j in range(n)]
        files[name] = py2_pickle(batch)
    names = [
        b"airplane",
        b"automobile",
        b"bird",
        b"cat",
        b"deer",
        b"dog",
        b"frog",
        b"horse",
        b"ship",
        b"truck",
    ]
    files["batches.meta"] = py2_pickle({b"label_names": names, b"num_cases_per_batch": n, b"num_vis": 3072})
    return files


def cifar100_files(n: int = 4) -> dict[str, bytes]:
    files = {}
    for i, name in enumerate(["train", "test"]):
        fine = [(7 * j + i) % 100 for j in range(n)]
        batch = {
            b"data": cifar_images(n, 10 + i),
            b"fine_labels": fine,
            b"coarse_labels": [f % 20 for f in fine],
        }
        files[name] = py2_pickle(batch)
    files["meta"] = py2_pickle(
        {
            b"fine_label_names": [f"fine{k}".encode() for k in range(100)],
            b"coarse_label_names": [f"coarse{k}".encode() for k in range(20)],
        }
    )
    return files


def write_folder(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def write_tar_gz(path: Path, prefix: str, files: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{prefix}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def mnist_like(n: int, seed: int, *, size: int = 28, classes: int = 10, first: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size), dtype=np.uint8), rng.integers(first, first + classes, n)


def write_mnist_dir(folder: Path, *, gz: bool = True) -> tuple[np.ndarray, np.ndarray]:
    x, y = mnist_like(5, 0)
    xt, yt = mnist_like(3, 1)
    sfx = ".gz" if gz else ""
    write_idx(folder / f"train-images-idx3-ubyte{sfx}", x, gz=gz)
    write_idx(folder / f"train-labels-idx1-ubyte{sfx}", y, gz=gz)
    write_idx(folder / f"t10k-images-idx3-ubyte{sfx}", xt, gz=gz)
    write_idx(folder / f"t10k-labels-idx1-ubyte{sfx}", yt, gz=gz)
    return x, y


# ---------------------------------------------------------------- files.py


def test_md5_and_require_file(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"hello" * 1000)
    assert md5_file(path, chunk_size=7) == md5_bytes(b"hello" * 1000)
    assert require_file(path, md5_file(path)) == path
    with pytest.raises(DataError) as e:
        require_file(path, "0" * 32, url="https://example.org/a.bin")
    msg = str(e.value)
    assert (
        str(path) in msg and "0" * 32 in msg and md5_file(path) in msg and "https://example.org/a.bin" in msg
    )
    assert require_file(path, "0" * 32, verify=False) == path
    with pytest.raises(DataError, match=r"missing dataset file .*nope\.bin.*--download"):
        require_file(tmp_path / "nope.bin", "1" * 32, url="https://example.org/nope.bin")


def test_a_dataset_file_that_cannot_be_read_is_a_data_error_naming_it(tmp_path: Path, monkeypatch) -> None:
    """A file that exists but cannot be read (permissions, a disk error) is a DataError naming it; a raw
    OSError reached the command line's handler for failed writes ("run stopped: cannot write ...")."""
    files = cifar10_files()
    write_folder(tmp_path / "cifar10" / "cifar-10-batches-py", files)
    write_mnist_dir(tmp_path / "mnist")
    (tmp_path / "text.csv").write_text("x")
    real_read_bytes, real_open = Path.read_bytes, open
    denied = {"data_batch_2", "train-images-idx3-ubyte.gz", "text.csv"}

    def read_bytes(path: Path) -> bytes:
        if path.name in denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real_read_bytes(path)

    def open_(path, *args, **kwargs):
        if Path(path).name in denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr("builtins.open", open_)
    with pytest.raises(DataError, match=r"cannot read dataset file .*data_batch_2: Permission denied"):
        load_dataset("cifar10", tmp_path, verify=False)
    with pytest.raises(DataError, match=r"cannot read dataset file .*train-images-idx3-ubyte\.gz: Perm"):
        load_dataset("mnist", tmp_path)  # the md5 check reads it first
    with pytest.raises(DataError, match=r"cannot read dataset file .*text\.csv: Permission denied"):
        read_text_file(tmp_path / "text.csv")


def test_download_verifies_and_renames_atomically(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    dest = tmp_path / "out" / "dest.bin"
    assert download(src.as_uri(), dest, md5_bytes(b"payload")) == dest
    assert dest.read_bytes() == b"payload"
    bad = tmp_path / "out" / "bad.bin"
    with pytest.raises(DataError, match="expected " + "0" * 32):
        download(src.as_uri(), bad, "0" * 32)
    assert not bad.exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["dest.bin"]  # no temp files left


def test_a_downloaded_file_gets_the_usual_permissions(tmp_path: Path) -> None:
    """The download's temporary came from mkstemp, owner-only (0600), and the rename kept that: a dataset
    fetched into a shared data folder could not be read by the other users of the machine."""
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    dest = tmp_path / "out" / "dest.bin"
    umask = os.umask(0o022)
    try:
        download(src.as_uri(), dest, md5_bytes(b"payload"))
    finally:
        os.umask(umask)
    assert dest.stat().st_mode & 0o777 == 0o644


def test_download_unreachable_says_where_to_put_the_file(tmp_path: Path) -> None:
    dest = tmp_path / "x.gz"
    with pytest.raises(DataError) as e:
        download("http://127.0.0.1:1/x.gz", dest, "ab" * 16, timeout=5)
    assert str(dest) in str(e.value) and "ab" * 16 in str(e.value)
    assert not dest.exists()


def test_download_cut_short_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that drops a chunked transfer mid-file: http.client raises IncompleteRead, which is no
    OSError; it must read as a failed download, not a traceback."""
    monkeypatch.setenv("no_proxy", "*")  # a machine's HTTP proxy would answer instead, failing otherwise
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    served = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        conn.close()
        served.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    dest = tmp_path / "x.gz"
    try:
        with pytest.raises(DataError, match=r"cannot download .*x\.gz.*put it at exactly"):
            download(f"http://127.0.0.1:{server.getsockname()[1]}/x.gz", dest, "ab" * 16, timeout=5)
    finally:
        thread.join(5)
        server.close()
    assert served.is_set(), "the download never reached the server that cuts it short"
    assert list(tmp_path.iterdir()) == []  # nothing at dest, no temporary file left


# ---------------------------------------------------------------- idx.py


@pytest.mark.parametrize("gz", [True, False])
def test_idx_pair_gz_and_raw(tmp_path: Path, gz: bool) -> None:
    x, y = mnist_like(4, 2, size=5)
    images = read_idx_pair(write_idx(tmp_path / "i", x, gz=gz), write_idx(tmp_path / "l", y, gz=gz))
    assert images.x.shape == (4, 1, 5, 5) and images.x.dtype == torch.uint8
    assert torch.equal(images.x[:, 0], torch.from_numpy(x)) and images.y.tolist() == y.tolist()


def test_idx_errors_on_bytes_without_a_name_stay_short() -> None:
    """Content passed as bytes and no name: the message says so, not the repr of every byte."""
    x, y = mnist_like(300, 2)
    data = idx_bytes(x)[:-1]
    with pytest.raises(DataError) as e:
        read_idx(data, magic=IMAGES_MAGIC)
    assert "truncated" in str(e.value) and len(str(e.value)) < 300
    with pytest.raises(DataError) as e:
        read_idx_pair(idx_bytes(x), idx_bytes(y[:-1]))
    assert "300 images" in str(e.value) and len(str(e.value)) < 300


def test_idx_errors_name_the_file(tmp_path: Path) -> None:
    x, y = mnist_like(4, 2, size=5)
    images, labels = write_idx(tmp_path / "imgs.gz", x), write_idx(tmp_path / "labs.gz", y)
    with pytest.raises(DataError, match=r"labs\.gz is not an IDX images file.*0x00000801.*0x00000803"):
        read_idx(labels, magic=IMAGES_MAGIC)
    short = tmp_path / "short"
    short.write_bytes(idx_bytes(x)[:-3])
    with pytest.raises(DataError, match="short is truncated"):
        read_idx(short, magic=IMAGES_MAGIC)
    with pytest.raises(DataError, match=r"imgs\.gz holds 4 images but .*three\.gz holds 3 labels"):
        read_idx_pair(images, write_idx(tmp_path / "three.gz", y[:3]))
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(idx_bytes(x))[:40])
    with pytest.raises(DataError, match=r"broken\.gz is a corrupt gzip file"):
        read_idx(broken, magic=IMAGES_MAGIC)


# ---------------------------------------------------------------- MNIST / Fashion-MNIST layout


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_layout_loads(tmp_path: Path, gz: bool) -> None:
    x, y = write_mnist_dir(tmp_path / "fashion-mnist", gz=gz)
    ds = load_dataset("fashion-mnist", tmp_path, verify=False)
    assert (len(ds.train), len(ds.test)) == (5, 3)
    assert torch.equal(ds.train.x[:, 0], torch.from_numpy(x)) and ds.train.y.tolist() == y.tolist()
    assert ds.info.mean == (0.1307,) and ds.info.std == (0.3081,) and ds.info.image_size == 28
    assert (
        ds.info.crop_padding == 0 and not ds.info.horizontal_flip and ds.info.class_names[9] == "Ankle boot"
    )


def test_mnist_like_sets_reshape_to_cifars_shape(tmp_path: Path) -> None:
    """`image_size` / `channels` give Fashion-MNIST at CIFAR's 3 x 32 x 32: every image resampled, grey
    repeated into three equal channels, statistics from the reshaped training split; labels untouched."""
    x, y = write_mnist_dir(tmp_path / "fashion-mnist")
    ds = load_dataset("fashion-mnist", tmp_path, verify=False, image_size=32, channels=3)
    assert ds.train.x.shape == (5, 3, 32, 32) and ds.test.x.shape == (3, 3, 32, 32)
    assert ds.train.x.dtype == torch.uint8 and ds.train.y.tolist() == y.tolist()
    assert torch.equal(ds.train.x[:, 0], ds.train.x[:, 2])
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(x)[:, None].float() / 255.0, size=(32, 32), mode="bilinear", align_corners=False
    )
    assert torch.equal(ds.train.x[:, 1], (expected[:, 0].clamp(0, 1) * 255.0).round().to(torch.uint8))
    pixels = ds.train.x.double() / 255.0
    assert (ds.info.channels, ds.info.image_size) == (3, 32)
    assert ds.info.mean == pytest.approx((float(pixels.mean()),) * 3)
    assert ds.info.std[0] == pytest.approx(float(pixels[:, 0].std()))
    for bad in (2, True):  # `channels = true` is no channel count, though Python's True == 1
        with pytest.raises(ConfigError, match="channels must be 1 or 3"):
            load_dataset("fashion-mnist", tmp_path, verify=False, channels=bad)
    with pytest.raises(ConfigError, match="image_size must be an integer from 8 to 512"):
        load_dataset("fashion-mnist", tmp_path, verify=False, image_size=4)


def test_mnist_like_augmentation_options(tmp_path: Path) -> None:
    """Fashion-MNIST trains unaugmented by default; `crop_padding` and `horizontal_flip` turn on the usual
    augmentation for every method's local training (the same images otherwise), also at CIFAR's shape;
    bad values are refused with the option's name."""
    from fedistill.data.transforms import augment
    from fedistill.tasks.classification import Classification

    write_mnist_dir(tmp_path / "fashion-mnist")
    plain = load_dataset("fashion-mnist", tmp_path, verify=False)
    flipped = load_dataset("fashion-mnist", tmp_path, verify=False, crop_padding=2, horizontal_flip=True)
    task = Classification()
    assert not task.usual_augment(plain.info) and task.usual_augment(flipped.info)
    assert torch.equal(plain.train.x, flipped.train.x) and flipped.info.mean == plain.info.mean
    assert (flipped.info.crop_padding, flipped.info.horizontal_flip) == (2, True)
    colour = load_dataset("fashion-mnist", tmp_path, verify=False, image_size=32, channels=3, crop_padding=4)
    assert (colour.info.crop_padding, colour.info.image_size) == (4, 32)
    # flips alone: each image is itself or its mirror, and a batch of 64 holds both
    mirror_only = load_dataset("fashion-mnist", tmp_path, verify=False, horizontal_flip=True)
    x = mirror_only.train.x.repeat(13, 1, 1, 1)[:64]
    out = augment(x, mirror_only.info, torch.Generator().manual_seed(0))
    same = [torch.equal(o, i) for o, i in zip(out, x, strict=True)]
    assert (
        all(s or torch.equal(o, i.flip(2)) for s, o, i in zip(same, out, x, strict=True))
        and 0 < sum(same) < 64
    )
    for key, bad, message in (("crop_padding", 9, "from 0 to 8"), ("crop_padding", True, "from 0 to 8"),
                              ("horizontal_flip", 1, "true or false")):  # fmt: skip
        with pytest.raises(ConfigError, match=f"fashion-mnist.{key} must be .*{message}"):
            load_dataset("fashion-mnist", tmp_path, verify=False, **{key: bad})
    # padding of the (resized) image's size lets a crop miss the image: all black, yet labelled
    assert (
        load_dataset("fashion-mnist", tmp_path, verify=False, image_size=8, crop_padding=7).info.crop_padding
        == 7
    )
    with pytest.raises(ConfigError, match=r"fashion-mnist.crop_padding must be .*below image_size 8, got 8"):
        load_dataset("fashion-mnist", tmp_path, verify=False, image_size=8, crop_padding=8)


def test_mnist_md5_mismatch_is_rejected(tmp_path: Path) -> None:
    write_mnist_dir(tmp_path / "mnist")
    with pytest.raises(DataError) as e:
        load_dataset("mnist", tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "mnist" / "train-images-idx3-ubyte.gz") in msg and MNIST_TRAIN_IMAGES_MD5 in msg


def test_mnist_missing_files_say_where_to_put_them(tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        load_dataset("mnist", tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "mnist" / "train-images-idx3-ubyte.gz") in msg and MNIST_TRAIN_IMAGES_MD5 in msg
    assert "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz" in msg


def test_labels_out_of_range_are_rejected(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    write_mnist_dir(folder)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.array([1, 2, 10]))
    with pytest.raises(
        DataError, match=r"t10k-labels-idx1-ubyte\.gz: labels must be in 0\.\.9, found 1\.\.10"
    ):
        load_dataset("mnist", tmp_path, verify=False)


# ---------------------------------------------------------------- CIFAR


def test_cifar10_folder_and_archive_agree(tmp_path: Path) -> None:
    files = cifar10_files()
    write_folder(tmp_path / "a" / "cifar10" / "cifar-10-batches-py", files)
    write_tar_gz(tmp_path / "b" / "cifar10" / "cifar-10-python.tar.gz", "cifar-10-batches-py", files)
    a = load_dataset("cifar10", tmp_path / "a", verify=False)
    b = load_dataset("cifar10", tmp_path / "b", verify=False)
    assert a.train.x.shape == (15, 3, 32, 32) and a.test.x.shape == (3, 3, 32, 32)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    # rows are 1024 red, 1024 green, 1024 blue bytes: channel 1, pixel (2, 5) is byte 1024 + 2 * 32 + 5
    assert int(a.train.x[0, 1, 2, 5]) == int(cifar_images(3, 0)[0, 1024 + 2 * 32 + 5])
    assert a.train.y[:4].tolist() == [0, 1, 2, 1]
    assert a.info.class_names[0] == "airplane" and a.info.crop_padding == 4 and a.info.horizontal_flip
    assert a.info.mean == (0.4914, 0.4822, 0.4465) and a.info.std == (0.2023, 0.1994, 0.2010)


def test_cifar10_archive_checksum_mismatch(tmp_path: Path) -> None:
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    write_tar_gz(archive, "cifar-10-batches-py", cifar10_files())
    with pytest.raises(DataError) as e:
        load_dataset("cifar10", tmp_path)
    assert str(archive) in str(e.value) and "c58f30108f718f92721af3b95e74349a" in str(e.value)


def test_cifar10_batch_checksum_mismatch(tmp_path: Path) -> None:
    write_folder(tmp_path / "cifar-10-batches-py", cifar10_files())
    with pytest.raises(DataError) as e:
        load_cifar10(tmp_path)
    assert "data_batch_1" in str(e.value) and "c99cafc152244af753f735de768cd75f" in str(e.value)


def _flip_bytes(path: Path, start: int, stop: int) -> None:
    """Corrupt `path` in place: bytes start..stop garbled, as a bad disk or transfer would."""
    data = bytearray(path.read_bytes())
    data[start:stop] = bytes(b ^ 0x55 for b in data[start:stop])
    path.write_bytes(bytes(data))


def test_cifar10_corrupt_archive_is_a_data_error(tmp_path: Path) -> None:
    archive = tmp_path / "cifar-10-python.tar.gz"
    write_tar_gz(archive, "cifar-10-batches-py", cifar10_files())
    _flip_bytes(archive, 200, 400)  # inside the deflate stream: zlib fails, not gzip or tarfile
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz is not a readable \.tar\.gz archive"):
        load_cifar10(tmp_path, verify=False)


def test_a_bad_batch_inside_the_cifar_archive_is_named_inside_the_archive(tmp_path: Path) -> None:
    """Read from the archive, a malformed batch was called `cifar10/cifar-10-batches-py/test_batch`: a file
    that is not there, whatever the user looks for."""
    files = cifar10_files()
    files["test_batch"] = py2_pickle({b"data": cifar_images(3, 0), b"labels": [0, 1, 10]})
    archive = tmp_path / "cifar10" / "cifar-10-python.tar.gz"
    write_tar_gz(archive, "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz:cifar-10-batches-py/test_batch: labels"):
        load_dataset("cifar10", tmp_path, verify=False)
    files = cifar100_files()
    files["meta"] = py2_pickle({b"fine_label_names": []})
    write_tar_gz(tmp_path / "cifar100" / "cifar-100-python.tar.gz", "cifar-100-python", files)
    with pytest.raises(DataError, match=r"cifar-100-python\.tar\.gz:cifar-100-python/meta names 0"):
        load_dataset("cifar100", tmp_path, verify=False)


def test_cifar10_archive_is_read_when_the_extracted_folder_is_incomplete(tmp_path: Path) -> None:
    files = cifar10_files()
    write_tar_gz(tmp_path / "cifar-10-python.tar.gz", "cifar-10-batches-py", files)
    write_folder(tmp_path / "cifar-10-batches-py", {k: v for k, v in files.items() if k != "test_batch"})
    ds = load_cifar10(tmp_path, verify=False)  # an unpacking cut short: the archive next to it is whole
    assert ds.train.x.shape == (15, 3, 32, 32) and ds.test.x.shape == (3, 3, 32, 32)
    (tmp_path / "cifar-10-python.tar.gz").unlink()
    with pytest.raises(DataError, match=r"missing dataset file .*cifar-10-batches-py/test_batch"):
        load_cifar10(tmp_path, verify=False)


def test_cifar10_download_replaces_an_incomplete_extracted_folder(tmp_path: Path, monkeypatch) -> None:
    files = cifar10_files()
    published = tmp_path / "published" / "cifar-10-python.tar.gz"
    write_tar_gz(published, "cifar-10-batches-py", files)
    spec = RemoteFile("cifar-10-python.tar.gz", md5_file(published), published.as_uri())
    monkeypatch.setattr("fedistill.data.cifar.CIFAR10_ARCHIVE", spec)
    folder = tmp_path / "data"
    write_folder(folder / "cifar-10-batches-py", {k: v for k, v in files.items() if k != "test_batch"})
    ds = load_cifar10(folder, download=True, verify=False)  # the error said to pass download=True
    assert ds.test.x.shape == (3, 3, 32, 32) and (folder / "cifar-10-python.tar.gz").is_file()


def test_cifar10_missing_everything(tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        load_dataset("cifar10", tmp_path)
    msg = str(e.value)
    assert (
        str(tmp_path / "cifar10" / "cifar-10-python.tar.gz") in msg
        and "c58f30108f718f92721af3b95e74349a" in msg
    )


@pytest.mark.parametrize(
    ("name", "other"),
    [
        ("cifar10", "cifar-10-binary.tar.gz"),
        ("cifar10", "cifar-10-batches-bin"),
        ("cifar100", "cifar-100-binary"),
        ("cifar10", "cifar-10-matlab.tar.gz"),
    ],
)
def test_another_cifar_version_in_place_is_named_as_not_read(tmp_path: Path, name: str, other: str) -> None:
    """The binary (or MATLAB) version in the folder met the same "not found" as an empty folder: the user
    holding it was not told it is the python version that is read."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / other).mkdir() if "." not in other else (folder / other).write_bytes(b"")
    with pytest.raises(DataError, match=rf"{re.escape(other)} is another version of the dataset, not read"):
        load_dataset(name, tmp_path)


def test_cifar100_fine_and_coarse(tmp_path: Path) -> None:
    files = cifar100_files()
    write_tar_gz(tmp_path / "cifar100" / "cifar-100-python.tar.gz", "cifar-100-python", files)
    fine = load_dataset("cifar100", tmp_path, verify=False)
    assert fine.info.num_classes == 100 and fine.info.class_names[7] == "fine7"
    assert fine.train.y.tolist() == [0, 7, 14, 21] and fine.test.x.shape == (4, 3, 32, 32)
    assert fine.info.mean == (0.5071, 0.4867, 0.4408)
    coarse = load_dataset("cifar100", tmp_path, verify=False, labels="coarse")
    assert coarse.info.num_classes == 20 and coarse.train.y.tolist() == [0, 7, 14, 1]
    with pytest.raises(ConfigError, match="labels must be 'fine' or 'coarse', got 'medium'"):
        load_dataset("cifar100", tmp_path, verify=False, labels="medium")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = pickle.dumps({b"data": _Evil(marker)}, protocol=2)
    with pytest.raises(DataError, match=r"refused"):
        restricted_loads(evil, "evil_batch")
    assert not marker.exists()
    # the same file as a CIFAR batch is refused by the loader, not run
    files = cifar10_files()
    files["test_batch"] = evil
    write_folder(tmp_path / "cifar10" / "cifar-10-batches-py", files)
    with pytest.raises(DataError, match=r"test_batch.*refused"):
        load_dataset("cifar10", tmp_path, verify=False)
    assert not marker.exists()


def test_restricted_unpickler_reads_real_batch_format() -> None:
    arr = np.arange(6, dtype=np.uint8).reshape(2, 3)
    for data in (py2_pickle({b"data": arr}), pickle.dumps({b"data": arr}, protocol=4)):
        got = RestrictedUnpickler(io.BytesIO(data), source="x").load()
        assert np.array_equal(got[b"data"], arr) and got[b"data"].dtype == np.uint8
    with pytest.raises(DataError, match="not a valid CIFAR python batch"):
        restricted_loads(b"\x80\x02garbage", "junk")


def test_restricted_unpickler_reads_batches_saved_with_pickle_protocol_5() -> None:
    """numpy pickles an array by `_frombuffer` under protocol 5 (Python 3.14's default): a batch re-saved
    so is an array like any other, not a file to refuse as unsafe."""
    arr = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072) % 251
    got = restricted_loads(pickle.dumps({b"data": arr, b"labels": [1, 2]}, protocol=5), "batch")
    assert np.array_equal(got[b"data"], arr) and got[b"labels"] == [1, 2]
    with pytest.raises(DataError, match="refused"):  # still nothing but numpy's array builders
        restricted_loads(pickle.dumps({b"data": _Evil(Path("never"))}, protocol=5), "evil")


# ---------------------------------------------------------------- EMNIST


def _emnist_files(split: str, first_label: int) -> tuple[dict[str, bytes], np.ndarray]:
    x, y = mnist_like(4, 3, classes=3, first=first_label)
    xt, yt = mnist_like(2, 4, classes=3, first=first_label)
    stem = f"emnist-{split}"
    files = {
        f"{stem}-train-images-idx3-ubyte.gz": gzip.compress(idx_bytes(x)),
        f"{stem}-train-labels-idx1-ubyte.gz": gzip.compress(idx_bytes(y)),
        f"{stem}-test-images-idx3-ubyte.gz": gzip.compress(idx_bytes(xt)),
        f"{stem}-test-labels-idx1-ubyte.gz": gzip.compress(idx_bytes(yt)),
    }
    return files, (x, y)


def test_emnist_loose_files_are_transposed(tmp_path: Path) -> None:
    files, (x, y) = _emnist_files("balanced", 0)
    write_folder(tmp_path / "emnist", files)
    ds = load_dataset("emnist-balanced", tmp_path)
    assert torch.equal(ds.train.x[:, 0], torch.from_numpy(x).transpose(1, 2))
    assert (
        ds.train.y.tolist() == y.tolist() and ds.info.num_classes == 47 and ds.info.name == "emnist-balanced"
    )


def test_emnist_letters_in_zip(tmp_path: Path) -> None:
    files, (_, y) = _emnist_files("letters", 1)
    (tmp_path / "emnist").mkdir()
    with zipfile.ZipFile(tmp_path / "emnist" / "gzip.zip", "w") as zf:
        for name, data in files.items():
            zf.writestr(f"gzip/{name}", data)
    ds = load_dataset("emnist-letters", tmp_path, verify=False)
    assert ds.train.y.tolist() == (y - 1).tolist() and ds.info.num_classes == 26
    assert ds.info.class_names[0] == "A" and ds.train.x.shape == (4, 1, 28, 28)
    with pytest.raises(DataError, match="58c8d27c78d21e728a6bc7b3cc06412e"):
        load_dataset("emnist-letters", tmp_path)  # the fake zip is not the official one


def test_emnist_corrupt_zip_is_a_data_error(tmp_path: Path) -> None:
    files, _ = _emnist_files("digits", 0)
    archive = tmp_path / "emnist" / "gzip.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(f"gzip/{name}", data)
    start = 30 + len(f"gzip/{next(iter(files))}")  # the first member's data: after its header and name
    _flip_bytes(archive, start, start + 5)  # its deflate block header: zlib fails before any CRC check
    with pytest.raises(DataError, match=r"gzip\.zip is not a readable zip archive"):
        load_dataset("emnist-digits", tmp_path, verify=False)


def test_emnist_unzipped_as_released_is_found_in_its_gzip_folder(tmp_path: Path) -> None:
    """Unpacking the release's gzip.zip in emnist/ makes emnist/gzip/; the loose files are found there."""
    files, (x, _) = _emnist_files("balanced", 0)
    write_folder(tmp_path / "emnist" / "gzip", files)
    ds = load_dataset("emnist-balanced", tmp_path)
    assert torch.equal(ds.train.x[:, 0], torch.from_numpy(x).transpose(1, 2))


# ---------------------------------------------------------------- image-folder


def _png(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (10, 6)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def test_image_folder(tmp_path: Path) -> None:
    _png(tmp_path / "train" / "cat" / "a.png", (255, 0, 0))
    _png(tmp_path / "train" / "cat" / "b.jpg", (255, 0, 0))
    _png(tmp_path / "train" / "ant" / "c.png", (0, 0, 255))
    _png(tmp_path / "test" / "cat" / "d.png", (255, 0, 0))
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")
    ds = load_dataset("image-folder", tmp_path, image_size=8)
    assert ds.info.class_names == ("ant", "cat") and ds.info.num_classes == 2
    assert ds.train.x.shape == (3, 3, 8, 8) and ds.train.y.tolist() == [0, 1, 1] and ds.test.y.tolist() == [1]
    assert int(ds.train.x[0, 2].min()) == 255 and int(ds.train.x[1, 0].min()) >= 250  # jpeg is lossy
    assert ds.info.mean[0] == pytest.approx(2 / 3, abs=0.01) and ds.info.mean[2] == pytest.approx(
        1 / 3, abs=0.01
    )
    grey = load_dataset("image-folder", tmp_path, channels=1)
    assert grey.train.x.shape == (3, 1, 32, 32) and grey.info.channels == 1


@pytest.mark.parametrize("channels", [1, 3])
def test_image_folder_reads_wide_grey_images_as_predict_does(tmp_path: Path, channels: int) -> None:
    """16-bit and float grey images are scaled by their own maximum, the rule predict reads them by, so
    a model sees the same pixels at training and at prediction (Pillow's conversion clips them at 255
    or 1: almost every 16-bit image white)."""
    from fedistill.inference.images import read_image, to_channels

    ramp = np.arange(16, dtype=np.float64).reshape(4, 4) / 15
    for split in ("train", "test"):
        for name, image in (("sixteen", Image.fromarray((ramp * 1000).astype(np.uint16))),
                            ("float", Image.fromarray((ramp * 0.5).astype(np.float32), "F"))):  # fmt: skip
            path = tmp_path / split / name / "a.tif"
            path.parent.mkdir(parents=True)
            image.save(path)
    ds = load_dataset("image-folder", tmp_path, channels=channels, image_size=4)
    for row, name in enumerate(("float", "sixteen")):
        read = to_channels(read_image(tmp_path / "train" / name / "a.tif"), channels, Path(name))
        assert ds.train.x[row].permute(1, 2, 0).numpy().tolist() == read.tolist()
        assert int(ds.train.x[row].max()) == 255 and int(ds.train.x[row].min()) == 0


@pytest.mark.parametrize("channels", [1, 3])
def test_image_folder_reads_wide_colour_tiffs_as_predict_does(tmp_path: Path, channels: int) -> None:
    """A 16-bit RGB TIFF (12-bit camera data, say): Pillow keeps each value's high byte, so the images
    trained on were nearly black while predict, reading through tifffile, scales them by their maximum;
    a float RGB TIFF Pillow cannot open at all. Both now read as predict reads them."""
    import tifffile

    from fedistill.inference.images import model_image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name, image in (
            ("sixteen", rng.integers(0, 4096, (6, 5, 3)).astype(np.uint16)),
            ("float", rng.random((6, 5, 3)).astype(np.float32)),
        ):
            path = tmp_path / split / name / "a.tif"
            path.parent.mkdir(parents=True)
            tifffile.imwrite(path, image, photometric="rgb")
    ds = load_dataset("image-folder", tmp_path, channels=channels, image_size=4)
    for row, name in enumerate(("float", "sixteen")):
        expected, _ = model_image(tmp_path / "train" / name / "a.tif", channels, 4)
        assert ds.train.x[row].numpy().tolist() == expected.tolist()
        assert int(ds.train.x[row].max()) > 100  # Pillow gave 15 at most for the 16-bit file


def test_image_folder_errors(tmp_path: Path) -> None:
    _png(tmp_path / "train" / "cat" / "a.png", (1, 2, 3))
    _png(tmp_path / "test" / "dog" / "b.png", (1, 2, 3))
    with pytest.raises(DataError, match="dog"):
        load_dataset("image-folder", tmp_path)
    (tmp_path / "test" / "dog" / "b.png").unlink()
    (tmp_path / "test" / "dog").rmdir()
    (tmp_path / "test" / "cat").mkdir()
    (tmp_path / "test" / "cat" / "good.png").write_bytes((tmp_path / "train" / "cat" / "a.png").read_bytes())
    with pytest.raises(DataError, match=r"1 class folder\(s\) \(cat\); a classifier needs at least 2"):
        load_dataset("image-folder", tmp_path)  # one class: every prediction would be "right"
    _png(tmp_path / "train" / "dog" / "c.png", (4, 5, 6))
    (tmp_path / "test" / "cat" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"bad\.png"):
        load_dataset("image-folder", tmp_path)
    with pytest.raises(ConfigError, match="channels must be 1 or 3, got 2"):
        load_dataset("image-folder", tmp_path, channels=2)


def test_image_folder_names_the_accepted_extensions_for_a_class_folder_of_other_files(tmp_path: Path) -> None:
    """A class folder of photos saved as .heic (or notes, or archives) holds nothing the loader reads: the
    error names the folder, what it found and the extensions that are read, not only "holds no images"."""
    _png(tmp_path / "train" / "cat" / "a.png", (1, 2, 3))
    _png(tmp_path / "test" / "cat" / "b.png", (1, 2, 3))
    (tmp_path / "train" / "dog").mkdir()
    (tmp_path / "train" / "dog" / "IMG_1.HEIC").write_bytes(b"x")
    with pytest.raises(DataError, match=r"train/dog holds no images \(found IMG_1\.HEIC\); .*\.jpg.*\.png"):
        load_dataset("image-folder", tmp_path)
    (tmp_path / "train" / "dog" / "IMG_1.HEIC").unlink()
    with pytest.raises(DataError, match=r"train/dog holds no images \(it is empty\); .*\.jpg.*\.png"):
        load_dataset("image-folder", tmp_path)


def test_image_folder_says_what_a_folder_without_train_and_test_holds(tmp_path: Path) -> None:
    """The usual wrong data_dir: class folders straight in it (no train/ and test/), train/ itself, or a
    folder that is not there. The error names the folders found and what to do, in one line."""
    _png(tmp_path / "flat" / "cat" / "a.png", (1, 2, 3))
    _png(tmp_path / "flat" / "dog" / "b.png", (1, 2, 3))
    with pytest.raises(DataError, match=r"flat has no train/ folder; it holds cat, dog: put the class"):
        load_dataset("image-folder", tmp_path / "flat")
    _png(tmp_path / "split" / "train" / "cat" / "a.png", (1, 2, 3))
    with pytest.raises(DataError, match=r"split/train is itself a train/ folder; set data_dir to .*split"):
        load_dataset("image-folder", tmp_path / "split" / "train")
    with pytest.raises(DataError, match=r"data_dir .*nowhere does not exist; expected the layout"):
        load_dataset("image-folder", tmp_path / "nowhere")


def test_image_folder_refuses_a_flip_option_that_is_no_boolean(tmp_path: Path) -> None:
    """`--set image-folder.horizontal_flip=False` reaches the loader as the text "False", which is truthy:
    taken as it is, it would switch mirrored training images on."""
    from fedistill.tasks.classification import Classification

    _png(tmp_path / "train" / "cat" / "a.png", (1, 2, 3))
    _png(tmp_path / "train" / "dog" / "b.png", (4, 5, 6))
    _png(tmp_path / "test" / "cat" / "c.png", (1, 2, 3))
    assert not Classification().usual_augment(
        load_dataset("image-folder", tmp_path, horizontal_flip=False).info
    )
    for bad in ("False", "false", 0, 1):
        with pytest.raises(ConfigError, match="image-folder option horizontal_flip must be true or false"):
            load_dataset("image-folder", tmp_path, horizontal_flip=bad)


def test_image_folder_names_an_image_too_large_for_pillow(tmp_path: Path, monkeypatch) -> None:
    """Pillow refuses an image of more than twice MAX_IMAGE_PIXELS with DecompressionBombError, which is
    no OSError: it must name the file, not end the run with a traceback."""
    _png(tmp_path / "train" / "cat" / "a.png", (1, 2, 3))
    _png(tmp_path / "train" / "dog" / "big.png", (4, 5, 6), size=(40, 40))
    _png(tmp_path / "test" / "cat" / "c.png", (1, 2, 3))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # 1,000 pixels and more are refused
    with pytest.raises(DataError, match=r"cannot read image .*big\.png"):
        load_dataset("image-folder", tmp_path)


def test_image_folder_names_a_folder_it_cannot_list(tmp_path: Path, monkeypatch) -> None:
    _png(tmp_path / "train" / "cat" / "a.png", (1, 2, 3))
    _png(tmp_path / "train" / "dog" / "b.png", (4, 5, 6))
    _png(tmp_path / "test" / "cat" / "c.png", (1, 2, 3))
    real_iterdir = Path.iterdir

    def iterdir(path: Path):
        if path.name == "dog":
            raise PermissionError(13, "Permission denied", str(path))
        return real_iterdir(path)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    with pytest.raises(DataError, match=r"image-folder: cannot list .*train/dog: Permission denied"):
        load_dataset("image-folder", tmp_path)


def test_image_folder_refuses_a_crop_padding_that_can_crop_the_image_away(tmp_path: Path) -> None:
    """Padding of the image's size or more lets a random crop hold no pixel of the image: an all-black
    training sample with a label. Digits and MNIST refuse such values; so does image-folder."""
    _png(tmp_path / "train" / "cat" / "a.png", (1, 2, 3))
    _png(tmp_path / "train" / "dog" / "b.png", (4, 5, 6))
    _png(tmp_path / "test" / "cat" / "c.png", (1, 2, 3))
    assert load_dataset("image-folder", tmp_path, image_size=8, crop_padding=7).info.crop_padding == 7
    for bad in (8, 40):
        with pytest.raises(ConfigError, match=r"crop_padding must be an integer from 0 to 7 \(image_size 8"):
            load_dataset("image-folder", tmp_path, image_size=8, crop_padding=bad)


# ---------------------------------------------------------------- digits and the registry


def test_digits_split_is_fixed_and_stratified() -> None:
    a, b = load_dataset("digits"), load_dataset("digits")
    assert a.train.x.shape == (1437, 1, 8, 8) and a.test.x.shape == (360, 1, 8, 8)
    assert a.train.x.dtype == torch.uint8 and a.train.y.dtype == torch.int64 and int(a.train.x.max()) == 255
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert a.test.y.bincount().min() >= 35  # stratified: each digit about 36 times in 360
    assert set(a.train.x.unique().tolist()) <= {round(v * 255 / 16) for v in range(17)}
    pixels = a.train.x.double() / 255
    assert a.info.mean[0] == pytest.approx(float(pixels.mean())) and a.info.std[0] == pytest.approx(
        float(pixels.std())
    )


def test_digits_crop_padding_turns_on_the_usual_augmentation() -> None:
    """Digits train unaugmented by default; `crop_padding` gives random crops with black padding, the same
    images (and split) otherwise, and values that would crop the digit away are refused."""
    from fedistill.data.transforms import batches, to_float
    from fedistill.tasks.classification import Classification

    plain, padded = load_dataset("digits"), load_dataset("digits", crop_padding=1)
    task = Classification()
    assert not task.usual_augment(plain.info) and task.usual_augment(padded.info)
    assert torch.equal(plain.train.x, padded.train.x) and padded.info.mean == plain.info.mean
    first = padded.train.subset(torch.arange(64))
    x, _ = next(
        batches(
            first, padded.info, 64, shuffle=False, generator=torch.Generator().manual_seed(0), augment=True
        )
    )
    raw = to_float(first.x, padded.info)
    assert not torch.allclose(x, raw)
    # every augmented image is its original moved by at most one pixel each way, the gap black
    background = -padded.info.mean[0] / padded.info.std[0]
    shifted = torch.nn.functional.pad(raw, (1, 1, 1, 1), value=background)
    for i in range(64):
        assert any(
            torch.allclose(x[i], shifted[i, :, 1 + dy : 9 + dy, 1 + dx : 9 + dx], atol=1e-5)
            for dy in (-1, 0, 1)
            for dx in (-1, 0, 1)
        )
    for bad in (-1, 8, 1.5, True):
        with pytest.raises(ConfigError, match="crop_padding must be an integer from 0 to 7"):
            load_dataset("digits", crop_padding=bad)


def test_subset_takes_indices_or_a_boolean_mask() -> None:
    """`subset(y < 5)` keeps the samples the mask marks, as tensor indexing does; a mask read as the
    indices 0 and 1 gave every sample 0 or sample 1."""
    data = load_dataset("digits").test
    keep = data.y < 5
    mask_subset = data.subset(keep)
    assert len(mask_subset) == int(keep.sum()) and torch.equal(mask_subset.y, data.y[keep])
    assert torch.equal(data.subset(keep.numpy()).x, data.x[keep])
    assert data.subset([3, 1]).y.tolist() == [int(data.y[3]), int(data.y[1])]
    assert len(data.subset(range(4))) == 4 and len(data.subset([])) == 0
    with pytest.raises(ValueError, match="mask"):
        data.subset(keep[:-1])


def test_registry_names_and_errors(tmp_path: Path) -> None:
    assert dataset_names()[0] == "digits" and {"mnist", "emnist-byclass", "cifar100", "image-folder"} <= set(
        dataset_names()
    )
    with pytest.raises(UserError, match=r"did you mean 'cifar10'.*valid: digits"):
        load_dataset("cifr10")
    with pytest.raises(
        DataError, match=r"(?s)no data directory.*<data_dir>/cifar10/cifar-10-python\.tar\.gz"
    ):
        load_dataset("cifar10")
    with pytest.raises(ConfigError, match="labels"):
        load_dataset("digits", labels="coarse")
    assert "58c8d27c78d21e728a6bc7b3cc06412e" in describe_files("emnist-digits")
    assert str(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz") in describe_files("MNIST", tmp_path)
    assert "cifar-100-python.tar.gz" in describe_files("cifar-100")


# ---------------------------------------------------------------- the real files, when available


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_real_mnist_files(name: str) -> None:
    if not (SHARED_DATA / name / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"no {name} files under {SHARED_DATA} (set FEDISTILL_DATA)")
    ds = load_dataset(name, SHARED_DATA)  # verify=True: md5s must match
    assert (len(ds.train), len(ds.test)) == (60000, 10000)
    assert ds.train.x.shape == (60000, 1, 28, 28) and sorted(ds.train.y.unique().tolist()) == list(range(10))


def test_augment_on_a_dataset_that_names_no_augmentation_says_it_changes_nothing(caplog) -> None:
    """`augment = "on"` on digits trained exactly as "off" without a word: digits name neither a crop nor a
    flip. The set-up now says so; with `crop_padding` it augments and says nothing."""
    import logging

    from fedistill.config import RunConfig, build_config
    from fedistill.engine.setup import validate_setup

    base = {"clients": 2, "rounds": 1, "model": "mlp", "augment": "on"}
    with caplog.at_level(logging.WARNING, logger="fedistill"):
        validate_setup(build_config(RunConfig(), base))
    assert "augment = 'on' changes nothing on digits" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedistill"):
        validate_setup(build_config(RunConfig(), base | {"digits": {"crop_padding": 1}}))
    assert "changes nothing" not in caplog.text
