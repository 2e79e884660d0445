"""Atomic checkpoints: tensors in safetensors, everything else in JSON; never pickle.

Nested state (a model's state dict, an optimiser's state dict, counters) is split into a flat
tensor table and a JSON skeleton that points into it, so any state made of tensors, numbers,
strings, lists and dicts round-trips exactly: values, dtypes and memory layouts. The layout matters:
a (32, 1, 8, 8) batch with strides (64, 1, 8, 1) is both contiguous and channels-last, and a
convolution may pick a different kernel (and so round differently) for it than for the same values
with strides (64, 64, 8, 1). safetensors stores contiguous data only, so the strides are kept in the
skeleton and restored on load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from fedistill import disk
from fedistill.checksums import first_mismatch, manifest_files, manifest_text, sha256_of

_TENSOR = "__tensor__"
_STRIDE = "__stride__"
_INTKEYS = "__intkeys__"


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _with_strides(tensor: torch.Tensor, stride: list[int]) -> torch.Tensor:
    """`tensor`'s values in the (dense, non-overlapping) layout `stride`."""
    out = torch.empty_strided(tensor.shape, tuple(stride), dtype=tensor.dtype, device=tensor.device)
    return out.copy_(tensor)


def pack(state: Any, tensors: dict[str, torch.Tensor], path: str = "t") -> Any:
    """Replace every tensor in `state` by a reference into `tensors`; keep the rest as JSON."""
    if isinstance(state, torch.Tensor):
        key = f"{path}#{len(tensors)}"
        copy = state.detach().cpu().clone()  # the layout an in-memory copy keeps (dense layouts survive)
        tensors[key] = copy.contiguous()
        if copy.stride() != _contiguous_strides(tuple(copy.shape)):
            return {_TENSOR: key, _STRIDE: list(copy.stride())}
        return {_TENSOR: key}
    if isinstance(state, dict):
        int_keys = all(isinstance(k, int) for k in state) and bool(state)
        packed = {str(k): pack(v, tensors, f"{path}.{k}") for k, v in state.items()}
        return {_INTKEYS: packed} if int_keys else packed
    if isinstance(state, list | tuple):
        return [pack(v, tensors, f"{path}.{i}") for i, v in enumerate(state)]
    if state is None or isinstance(state, bool | int | float | str):
        return state
    raise TypeError(f"cannot checkpoint a {type(state).__name__} at {path}")


def unpack(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The state `pack` flattened, rebuilt from its JSON skeleton and its tensors (strides and integer keys
    restored)."""
    if isinstance(skeleton, dict):
        if _TENSOR in skeleton:
            tensor = tensors[skeleton[_TENSOR]]
            return _with_strides(tensor, skeleton[_STRIDE]) if _STRIDE in skeleton else tensor
        if _INTKEYS in skeleton:
            return {int(k): unpack(v, tensors) for k, v in skeleton[_INTKEYS].items()}
        return {k: unpack(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [unpack(v, tensors) for v in skeleton]
    return skeleton


def save_state(state: Any, path_stem: Path) -> None:
    """Write `<stem>.safetensors` and `<stem>.json`, each atomically (both at once: write_checkpoint)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = pack(state, tensors)
    disk.save_tensors(tensors, path_stem.with_suffix(".safetensors"))
    disk.write_text(path_stem.with_suffix(".json"), json.dumps(skeleton))


def load_state(path_stem: Path) -> Any:
    """Read the state `save_state` wrote at `<stem>.safetensors` and `<stem>.json`."""
    tensors = load_file(str(path_stem.with_suffix(".safetensors")))
    skeleton = json.loads(path_stem.with_suffix(".json").read_text(encoding="utf-8"))
    return unpack(skeleton, tensors)


MANIFEST = "manifest.json"
#: The names of the parts that held nothing (holds_nothing), in one file for all of them.
EMPTY_PARTS = "empty-parts.json"
#: A record of the runner state that came after manifests: a checkpoint holding it had one.
MANIFESTED_SINCE = "settings"
#: Checkpoints kept: the newest and the one before it, so a damaged newest one has a fallback.
KEEP = 2


class DamagedCheckpoint(Exception):
    """A checkpoint that fails verification: a missing or altered file, or unreadable content."""


def holds_nothing(state: Any) -> bool:
    """Whether a part is an empty state (a stateless client, or one never sampled): a checkpoint writes no
    file for it, only its name in the list of empty parts, and reads it back as `{}`."""
    return isinstance(state, dict) and not state


def write_checkpoint(directory: Path, name: str, parts: dict[str, Any]) -> Path:
    """Write every part that holds something and a manifest of their sha256 into a temporary folder,
    rename it into place, then move `latest` and drop all but the `KEEP` newest checkpoints. A thousand
    idle clients cost no file.

    A run killed at any moment leaves the previous complete checkpoints, or those plus the new one; a
    write that fails (a full disk) removes its temporary folder and raises an OSError naming the file.
    """
    final = directory / name
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory))
    except OSError as exc:
        raise disk.disk_error(exc, final) from exc
    try:
        empty = [part for part, state in parts.items() if holds_nothing(state)]
        for part, state in parts.items():
            if not holds_nothing(state):
                save_state(state, tmp / part)
        if empty:
            disk.write_text(tmp / EMPTY_PARTS, json.dumps(empty))
        files = {f.name: sha256_of(f) for f in sorted(tmp.iterdir())}
        disk.write_text(tmp / MANIFEST, manifest_text(name, files))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except OSError as exc:  # name the file where it was going, not in the temporary folder now removed
        shutil.rmtree(tmp, ignore_errors=True)
        raise disk.disk_error(exc, _final_name(exc.filename, tmp, final)) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    disk.write_text(directory / "latest", name)
    keep = {p.name for p in checkpoints(directory)[:KEEP]} | {name}
    for old in directory.iterdir():
        if old.is_dir() and old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _final_name(filename: object, tmp: Path, final: Path) -> Path:
    """`filename` (a path inside the temporary folder `tmp`, or not) as it reads inside `final`."""
    try:
        return final / Path(str(filename)).relative_to(tmp)
    except ValueError:
        return final


def sweep_temporaries(directory: Path) -> None:
    """Remove the temporary folders and files a write cut short left in `directory` (a killed run's)."""
    if not directory.is_dir():
        return
    for stale in directory.iterdir():
        if not stale.name.startswith("."):
            continue
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.name.endswith(".tmp"):
            stale.unlink(missing_ok=True)


def checkpoints(directory: Path) -> list[Path]:
    """The complete checkpoint folders (temporary ones excluded), newest first. Round numbers are padded to
    five digits only, so a longer name is a later round (round_100000 after round_99999)."""
    if not directory.is_dir():
        return []
    found = (p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    return sorted(found, key=lambda p: (len(p.name), p.name), reverse=True)


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint the `latest` pointer of `directory` names; None when there is none or it is gone."""
    pointer = directory / "latest"
    if not pointer.is_file():
        return None
    path = directory / pointer.read_text(encoding="utf-8").strip()
    return path if path.is_dir() else None


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint after checking every file against its manifest; DamagedCheckpoint if not intact.

    Checkpoints written before manifests existed are read without the hash check; one whose runner state
    records its settings was written with a manifest, so without it nothing of it can be trusted."""
    manifest_path = path / MANIFEST
    manifested = manifest_path.is_file()
    if manifested:
        try:
            files = manifest_files(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DamagedCheckpoint(f"its {exc}") from None  # "its unreadable manifest (...)"
        mismatch = first_mismatch(path, files)
        if mismatch is not None:
            raise DamagedCheckpoint(mismatch)
    try:
        state = read_checkpoint(path)
    except Exception as exc:  # truncated JSON or safetensors, a missing tensor file
        raise DamagedCheckpoint(f"unreadable ({type(exc).__name__}: {exc})") from None
    runner = state.get("runner")
    if not isinstance(runner, dict) or not {"round", "ledger", "metrics", "elapsed"} <= set(runner):
        raise DamagedCheckpoint("its runner state is missing or incomplete")
    if not manifested and MANIFESTED_SINCE in runner:
        raise DamagedCheckpoint(f"its {MANIFEST} is missing")
    return state


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Every state of a checkpoint directory by name, without checking it (see verify_checkpoint); the
    parts that held nothing as `{}`."""
    states = {
        stem.stem: load_state(stem.with_suffix(""))
        for stem in sorted(path.glob("*.json"))
        if stem.name not in (MANIFEST, EMPTY_PARTS)
    }
    listed = path / EMPTY_PARTS
    empty = json.loads(listed.read_text(encoding="utf-8")) if listed.is_file() else []
    return dict(sorted((states | {part: {} for part in empty}).items()))


def save_model(module: torch.nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Export a model's weights as one safetensors file, atomically (fedistill.disk)."""
    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    disk.save_tensors(state, path, metadata or {})
