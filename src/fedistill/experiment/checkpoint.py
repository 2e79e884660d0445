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
from safetensors.torch import load_file, save_file

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
        copy = state.detach().clone()  # the layout an in-memory copy keeps (dense layouts survive)
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
    """Write `<stem>.safetensors` and `<stem>.json` (no atomicity here: see write_checkpoint)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = pack(state, tensors)
    save_file(tensors, str(path_stem.with_suffix(".safetensors")))
    path_stem.with_suffix(".json").write_text(json.dumps(skeleton), encoding="utf-8")


def load_state(path_stem: Path) -> Any:
    tensors = load_file(str(path_stem.with_suffix(".safetensors")))
    skeleton = json.loads(path_stem.with_suffix(".json").read_text(encoding="utf-8"))
    return unpack(skeleton, tensors)


def write_checkpoint(directory: Path, name: str, parts: dict[str, Any]) -> Path:
    """Write every part into a temporary folder, then rename it into place and move `latest`.

    A run killed at any moment leaves either the previous complete checkpoint or the new one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory))
    for part, state in parts.items():
        save_state(state, tmp / part)
    final = directory / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer = directory / ".latest.tmp"
    pointer.write_text(name, encoding="utf-8")
    os.replace(pointer, directory / "latest")
    for old in directory.iterdir():  # keep only the newest checkpoint
        if old.is_dir() and old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    pointer = directory / "latest"
    if not pointer.is_file():
        return None
    path = directory / pointer.read_text(encoding="utf-8").strip()
    return path if path.is_dir() else None


def read_checkpoint(path: Path) -> dict[str, Any]:
    return {stem.stem: load_state(stem.with_suffix("")) for stem in sorted(path.glob("*.json"))}


def save_model(module: torch.nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Export a model's weights as one safetensors file (written to a temp name, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(tmp), metadata=metadata or {})
    os.replace(tmp, path)
