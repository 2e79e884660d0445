"""Atomic file writes that fail as one OSError.

Each writer puts its data in a hidden temporary file in the target's folder and renames it over the
target, so a reader sees the old file or the new one, never half of one. Any failure removes the
temporary; an I/O failure (a full disk, a folder gone read-only, safetensors' own SafetensorError)
becomes an OSError whose `filename` is the target and whose `strerror` says why in a few words, so the
command line can report it in one line instead of a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The OS error number inside the text of safetensors' SafetensorError (a Rust I/O error), in either of
#: its spellings: `I/O error: No space left on device (os error 28)` or `Os { code: 28, ... }`.
_RUST_ERRNO = re.compile(r"os error (\d+)|code: (\d+)")


def disk_error(exc: BaseException, path: Path) -> OSError:
    """`exc` as an OSError naming `path`, with the reason in a few words (errno kept when known)."""
    if isinstance(exc, OSError) and exc.strerror:
        return OSError(exc.errno, exc.strerror, path)
    text = str(exc)
    found = _RUST_ERRNO.search(text)
    if found:
        code = int(found.group(1) or found.group(2))
        return OSError(code, os.strerror(code), path)
    if "no space left" in text.lower():
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return OSError(None, text.strip() or type(exc).__name__, path)


def _is_safetensors_error(exc: BaseException) -> bool:
    """safetensors' own error type, matched by name: importing safetensors here would load it for every
    text write."""
    return type(exc).__name__ == "SafetensorError"


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp)` on a hidden temporary file beside `path`, then rename it over `path`.

    On any failure the temporary is removed and an OSError naming `path` is raised (see disk_error)."""
    path = Path(path)
    # a fresh name per write (two writers never share one); created by `write` itself, so the file gets
    # the usual permissions (umask), not mkstemp's owner-only ones
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:  # Ctrl-C mid-write too leaves no temporary behind
        with contextlib.suppress(OSError):  # the folder is gone or read-only: nothing was left there
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) or _is_safetensors_error(exc):
            raise disk_error(exc, path) from exc
        raise  # a programming error (a bad tensor, a wrong type) stays what it is


def write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    write_atomic(path, lambda tmp: tmp.write_bytes(data))


def save_tensors(
    tensors: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, str] | None = None
) -> None:
    """Write `tensors` as one safetensors file at `path` atomically (`metadata` in its header when given)."""
    from safetensors.torch import save_file

    table = dict(tensors)
    extra = None if metadata is None else dict(metadata)

    def write(tmp: Path) -> None:
        save_file(table, str(tmp), metadata=extra)
        sort_header_metadata(tmp)

    write_atomic(path, write)


def sort_header_metadata(path: Path) -> None:
    """Rewrite a safetensors file's header in place with its metadata keys sorted. The library writes them
    in a random order (a hash map), so two identical saves gave files with different bytes; sorted, equal
    tensors and metadata give equal files. The header keeps its length (padded with spaces, as the format
    allows), so no tensor moves; a header that would grow (another JSON escaping) is left as it is."""
    with path.open("r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        if "__metadata__" not in header:
            return
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) <= size:
            f.seek(8)
            f.write(text.ljust(size, b" "))
