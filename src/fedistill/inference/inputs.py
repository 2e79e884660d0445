"""What `fedistill predict` reads and where each answer goes.

An input is one file or a folder searched recursively (hidden files skipped, names sorted, so the order
is the same everywhere; a folder of answers inside it is left out). Files are told apart by their
suffix: images (every format the `image-folder` dataset trains on, so a model reads what it was trained
on), NIfTI volumes (.nii, .nii.gz) and HDF5 k-space files (.h5, .hdf5); other files in a folder are
ignored. A task takes only some kinds, and a file of another kind is an error that says what the model takes,
rather than a file silently left out of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedistill.data.image_folder import IMAGE_SUFFIXES as TRAINED_IMAGE_SUFFIXES
from fedistill.errors import ConfigError, DataError

IMAGE_SUFFIXES = tuple(sorted(TRAINED_IMAGE_SUFFIXES))
NIFTI_SUFFIXES = (".nii", ".nii.gz")
HDF5_SUFFIXES = (".h5", ".hdf5")
KIND_NAMES = {
    "image": "an image",
    "nifti": "a NIfTI volume",
    "hdf5": "an HDF5 file",
}
WHAT_PREDICT_READS = (
    f"images ({', '.join(s.removeprefix('.').upper() for s in IMAGE_SUFFIXES)}), NIfTI volumes (.nii, "
    ".nii.gz) or HDF5 k-space files (.h5, .hdf5)"
)


@dataclass(frozen=True)
class InputFile:
    """One file to predict on, with its path relative to the input folder (its name for a single file)."""

    path: Path
    relative: Path
    kind: str  # "image" | "nifti" | "hdf5"

    @property
    def stem(self) -> str:
        """The file name without its suffix (both parts of .nii.gz)."""
        name = self.relative.name
        for suffix in (*NIFTI_SUFFIXES, *IMAGE_SUFFIXES, *HDF5_SUFFIXES):
            if name.lower().endswith(suffix):
                return name[: -len(suffix)]
        return self.relative.stem


def kind_of(path: Path) -> str | None:
    """ "image", "nifti", "hdf5" or None, by the file's suffix."""
    name = path.name.lower()
    if name.endswith(NIFTI_SUFFIXES):
        return "nifti"
    if name.endswith(IMAGE_SUFFIXES):
        return "image"
    if name.endswith(HDF5_SUFFIXES):
        return "hdf5"
    return None


def find_inputs(path: Path, answers: Path | None = None) -> list[InputFile]:
    """The files under `path` (or `path` itself) that predict reads, leaving out those in the folder
    `answers` where it lies inside `path` (a former run's answers are no inputs; answers written beside
    their inputs, in `path` itself, leave every input in); DataError when there are none."""
    if not path.exists():
        raise DataError(f"input {path} does not exist; pass an image, a volume or a folder of them")
    if path.is_file():
        kind = kind_of(path)
        if kind is None:
            raise DataError(f"input {path} is not a file predict reads; it reads {WHAT_PREDICT_READS}")
        return [InputFile(path, Path(path.name), kind)]
    found = []
    inside = answers is not None and answers.resolve() != path.resolve()  # the input folder itself: kept
    skipped = answers.resolve() if inside and answers is not None else None
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if any(part.startswith(".") for part in relative.parts) or not file.is_file():
            continue
        if skipped is not None and file.resolve().is_relative_to(skipped):
            continue
        kind = kind_of(file)
        if kind is not None:
            found.append(InputFile(file, relative, kind))
    if not found:
        raise DataError(f"input folder {path} holds no file predict reads; put {WHAT_PREDICT_READS} in it")
    return found


def check_kinds(files: Sequence[InputFile], accepted: dict[str, str], model: str) -> None:
    """DataError naming the first file whose kind is not in `accepted` ({kind: what the model makes of
    it}), with what the model takes instead."""
    for file in files:
        if file.kind not in accepted:
            takes = "; ".join(f"{KIND_NAMES[kind]} ({what})" for kind, what in accepted.items())
            raise DataError(f"{file.path} is {KIND_NAMES[file.kind]}, but {model} takes {takes}")


def output_paths(files: Sequence[InputFile], folder: Path, suffix_of: dict[str, str]) -> list[Path]:
    """Each file's answer in `folder`, at its place relative to the input folder, named like it with the
    suffix `suffix_of[kind]` ("" keeps the file's own suffix)."""
    out = []
    for file in files:
        suffix = suffix_of[file.kind]
        name = file.relative.name if not suffix else file.stem + suffix
        out.append(folder / file.relative.parent / name)
    if len(set(out)) != len(out):
        twins = sorted({str(p) for p in out if out.count(p) > 1})
        raise DataError(
            f"two inputs would write the same answer {twins[0]} (e.g. a.png and a.tif); "
            "rename one or predict them separately"
        )
    return out


def check_free(paths: Sequence[Path], overwrite: bool, inputs: Sequence[InputFile] = ()) -> None:
    """ConfigError when an answer would replace an input, or a file without `overwrite`."""
    sources = {file.path.resolve() for file in inputs}
    for path in paths:
        if path.resolve() in sources:
            raise ConfigError(f"the answer to {path} would replace that input; pass another --output folder")
        if path.exists() and not overwrite:
            raise ConfigError(f"{path} already exists; pass --overwrite to replace it, or another --output")
