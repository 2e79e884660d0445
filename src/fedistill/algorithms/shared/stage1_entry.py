"""One entry of the stage-1 cache: a model's weights and, beside them, a manifest of their sha256.

The weights are one safetensors file (the original training's metrics in its header); the manifest
`<entry>.manifest.json` records the file's sha256 when it is written. A file is loaded only when it
matches its record: a flipped byte inside a tensor would otherwise load silently and change every
result distilled from it. An entry without a record (a write cut short, or one older than the records)
is not trusted either. Nothing of the model is touched until the whole entry has been checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from fedistill import disk
from fedistill.checksums import first_mismatch, manifest_files, manifest_text, sha256_of


class DamagedEntry(Exception):
    """A cache entry that must not be used: no checksum record, a mismatch, or unreadable content."""


def record_of(path: Path) -> Path:
    """The checksum record (manifest) of the cache entry at `path`."""
    return path.with_suffix(".manifest.json")


def store_entry(model: nn.Module, path: Path, metrics: dict[str, float]) -> None:
    """Write `model`'s weights and `metrics` at `path`, then their checksum record (each atomically).

    The record comes last, so an entry cut short between the two is retrained rather than trusted.
    OSError naming the file when either cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    disk.save_tensors(state, path, metadata={"metrics": json.dumps(metrics)})
    disk.write_text(record_of(path), manifest_text(path.name, {path.name: sha256_of(path)}))


def load_entry(model: nn.Module, path: Path) -> dict[str, float]:
    """Load the entry at `path` into `model` and return its training metrics, after checking the file
    against its checksum record and its tensors against the model; DamagedEntry (one line) if not."""
    _verify(path)
    try:
        state = load_file(str(path))
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        metrics = {k: float(v) for k, v in json.loads(metadata.get("metrics", "{}")).items()}
    except (OSError, SafetensorError, RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedEntry(_one_line(f"unreadable ({type(exc).__name__}: {exc})")) from None
    expected = {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}
    if {k: (v.shape, v.dtype) for k, v in state.items()} != expected:
        raise DamagedEntry("its tensors do not fit the model")
    with torch.no_grad():
        model.load_state_dict(state)
    return metrics


def _verify(path: Path) -> None:
    record = record_of(path)
    if not record.is_file():
        raise DamagedEntry(f"it has no checksum record ({record.name})")
    try:
        files = manifest_files(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DamagedEntry(_one_line(f"its checksum record {record.name} is unreadable ({exc})")) from None
    if path.name not in files:
        raise DamagedEntry(f"its checksum record {record.name} does not name {path.name}")
    mismatch = first_mismatch(path.parent, {path.name: files[path.name]})
    if mismatch is not None:
        raise DamagedEntry(mismatch)


def _one_line(text: str) -> str:
    return " ".join(text.split())
