"""sha256 manifests: how files written earlier are recognised as exactly those files when read back.

A manifest records the sha256 of each file it names, as JSON `{"name": ..., "files": {file: sha256}}`.
A truncated file fails to load, but a flipped byte inside a tensor loads without complaint and changes
every number computed from it; only the checksum notices. The run directory's checkpoints and the
sites' stage-1 cache both keep such manifests, so both detect the same damage the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file at `path`, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_text(name: str, files: Mapping[str, str]) -> str:
    """The JSON text of a manifest called `name` recording `files` ({file name: sha256})."""
    return json.dumps({"name": name, "files": dict(files)}, indent=1)


def manifest_files(text: str) -> dict[str, str]:
    """The {file name: sha256} a manifest's text records; ValueError when it is not a manifest."""
    try:
        manifest: Any = json.loads(text)
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable manifest ({exc})") from None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ValueError("unreadable manifest (file names and checksums must be strings)")
    return files


def first_mismatch(folder: Path, files: Mapping[str, str]) -> str | None:
    """Why the files of `folder` are not those `files` recorded (the first one missing or altered); None
    when every one matches its checksum."""
    for name, digest in files.items():
        path = Path(folder) / name
        if not path.is_file():
            return f"{name} is missing"
        if sha256_of(path) != digest:
            return f"{name} does not match its checksum"
    return None
