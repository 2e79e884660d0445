"""A Decathlon or nnU-Net `dataset.json`: the class names of its labels, the names of its image channels."""

from __future__ import annotations

import json
from pathlib import Path

from fedistill.data.base import is_plain_int
from fedistill.errors import DataError

NAME = "nifti-folder"


def named_channels(path: Path) -> tuple[str, dict[int, str]]:
    """Where dataset.json names the image channels (the Decathlon's "modality", nnU-Net v2's
    "channel_names") and their names by number, for messages: ("", {}) without (a broken file is refused
    where its labels are read)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return "", {}
    for key in ("modality", "channel_names"):
        names = found.get(key) if isinstance(found, dict) else None
        if isinstance(names, dict):
            named = {int(k): str(v) for k, v in names.items() if str(k).strip().isdigit()}
            return f"{path.name}'s {key}", named
    return "", {}


def label_names(path: Path) -> tuple[str, ...] | None:
    """The class names by value of a `dataset.json`'s "labels" (Decathlon's or nnU-Net v2's), or None."""
    by_value = _labels(path)
    if by_value is None:
        return None
    return tuple(by_value.get(v, "background" if v == 0 else f"class-{v}") for v in range(max(by_value) + 1))


def foreground_name(path: Path) -> str | None:
    """The name of the one value above 0 a `dataset.json`'s "labels" name, for `foreground = true` (every
    value above 0 one class); None where it names none or several, or cannot be read as names by value
    (nnU-Net's overlapping regions, which that option reads as one class, are no error)."""
    try:
        by_value = _labels(path) or {}
    except DataError:
        return None
    above = [name for value, name in by_value.items() if value > 0]
    return above[0] if len(above) == 1 else None


def _labels(path: Path) -> dict[int, str] | None:
    """A `dataset.json`'s "labels" as {value: name}, or None without a file or labels."""
    if not path.is_file():
        return None
    try:
        labels = json.loads(path.read_text(encoding="utf-8")).get("labels")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        raise DataError(f"{NAME}: cannot read {path} ({e}); fix it, or move it away") from e
    if not isinstance(labels, dict) or not labels:
        return None
    by_value: dict[int, str] = {}
    for key, value in labels.items():
        if isinstance(value, str) and key.strip().isdigit():  # the Decathlon's {"1": "spleen"}
            number, name = int(key), value.strip()
        elif is_plain_int(value) and value >= 0:  # nnU-Net v2's {"spleen": 1}
            number, name = int(value), key.strip()
        else:
            raise DataError(
                f'{NAME}: {path} labels {key!r}: {value!r}, neither the Decathlon\'s "1": "name" nor '
                f'nnU-Net\'s "name": 1 (region-based labels overlap); set {NAME}.classes by value'
            )
        if number in by_value or not name:
            raise DataError(f"{NAME}: {path} names the label value {number} twice, or with no name")
        by_value[number] = name
    return by_value
