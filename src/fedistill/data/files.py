"""Dataset files on disk: checksums, presence checks and verified downloads.

Every error here names the exact path, the expected md5 and what to do, because a
user who hits one is usually offline and has to place the file by hand.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fedistill.errors import DataError

DOWNLOAD_TIMEOUT_S = 30.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """A published file: where it goes under the dataset folder, its md5 and where to get it."""

    name: str  # path relative to the dataset folder
    md5: str
    url: str


def md5_file(path: str | Path, chunk_size: int = _CHUNK) -> str:
    """The md5 hex digest of a file, read in chunks so large archives never sit in memory."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def read_file(path: str | Path) -> bytes:
    """A dataset file's bytes; DataError naming it when it exists but cannot be read (permissions, a disk
    error), not an OSError that reads as a failed write."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"cannot read dataset file {path}: {e.strerror or e}") from e


def md5_bytes(data: bytes) -> str:
    """The MD5 hex digest of `data`, used to check downloads, not for security."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _how_to_get(path: Path, md5: str | None, url: str | None) -> str:
    where = f"put the file at exactly {path}"
    if md5:
        where += f" (md5 {md5})"
    if url:
        where += f", or pass --download (download=True) when online to fetch it from {url}"
    return where


def require_file(path: str | Path, md5: str | None, *, url: str | None = None, verify: bool = True) -> Path:
    """Return `path` if it exists and (when `verify` and `md5` are given) has the expected md5.

    Raises DataError naming the file, the expected and actual md5 and how to get a good copy.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing dataset file {path}: {_how_to_get(path, md5, url)}")
    if verify and md5:
        try:
            actual = md5_file(path)
        except OSError as e:
            raise DataError(f"cannot read dataset file {path}: {e.strerror or e}") from e
        if actual != md5:
            raise DataError(
                f"dataset file {path} is corrupt or a different version: md5 is {actual}, expected {md5}; "
                f"replace it: {_how_to_get(path, md5, url)}"
            )
    return path


def download(url: str, dest: str | Path, md5: str | None, *, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Fetch `url` to `dest` via a temporary file in the same folder, check the md5, then rename.

    The rename is atomic, so an interrupted or corrupt download never leaves a file at `dest`.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name, created here rather than by mkstemp, so that the file gets the usual permissions (umask)
    # and not owner-only ones: a dataset fetched into a shared data folder stays readable by its other users
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    out = tmp.open("xb")
    try:
        digest = hashlib.md5(usedforsecurity=False)
        try:
            with out, urllib.request.urlopen(url, timeout=timeout) as response:
                while chunk := response.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:  # IncompleteRead
            reason = getattr(e, "reason", None) or e
            raise DataError(
                f"cannot download {url} ({reason}); if this machine is offline, "
                f"fetch it elsewhere and put it at exactly {dest}" + (f" (md5 {md5})" if md5 else "")
            ) from e
        actual = digest.hexdigest()
        if md5 and actual != md5:
            raise DataError(
                f"downloaded {url} has md5 {actual}, expected {md5}; nothing was written to {dest}. "
                f"Try again, or fetch it elsewhere and put it at exactly {dest}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch_or_require(
    folder: Path, spec: RemoteFile, *, download_missing: bool = False, verify: bool = True
) -> Path:
    """The checked path of `spec` under `folder`, downloading it first when allowed and absent."""
    path = folder / spec.name
    if download_missing:
        # A download is always verified; an existing bad copy is replaced rather than reported.
        if not path.is_file() or md5_file(path) != spec.md5:
            download(spec.url, path, spec.md5)
        return path
    return require_file(path, spec.md5, url=spec.url, verify=verify)
