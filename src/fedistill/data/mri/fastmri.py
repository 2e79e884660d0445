"""`fastmri-brain`: fastMRI brain HDF5 files as a reconstruction source (FedIOD's Table 9, "F").

A fastMRI file holds one volume: `kspace`, complex, (slices, H, W) single-coil or (slices, coils, H, W)
multi-coil; the targets `reconstruction_rss` (multi-coil) or `reconstruction_esc` (single-coil), 320x320
for brain; and attributes such as `acquisition` (AXT1, AXT1PRE, AXT1POST, AXT2, AXFLAIR), `max`,
`patient_id`. Files with a `mask` dataset (fastMRI's test and challenge releases) hold undersampled
k-space and no target, so they cannot be used.

Target (`target`): "kspace" (default) reconstructs every slice from the fully sampled k-space: the
magnitude of `ifft2c` for single-coil data, the root-sum-of-squares of the coil images for multi-coil
data (fastMRI's own definition of `reconstruction_rss`), centre-cropped to 320x320 as fastMRI crops
its targets (the crop also removes the readout oversampling); "file" takes the file's stored
`reconstruction_rss` (multi-coil) / `reconstruction_esc` (single-coil) instead.

Single coil: fastMRI's brain data are multi-coil only (its single-coil knee data were *emulated* from
the coils, ESC). Here, as in Guo et al.'s single-coil setting, the magnitude target is the image, and
the task layer simulates single-coil k-space from it (zero phase; see `fedistill.data.mri.kspace`).

Contrast (`contrast`): t1 (AXT1, AXT1PRE, AXT1POST), t2 (AXT2), flair (AXFLAIR) or any, read from
the `acquisition` attribute. Split: `train/` for training and `val/` for test (fastMRI's test files
have no targets, so papers test on its validation release; the paper's 2,583 / 860 T1 subjects).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch

from fedistill.data.base import LoadedDataset
from fedistill.data.mri.assemble import Volume, build_dataset, volume_from_slices
from fedistill.data.mri.kspace import ifft2c, root_sum_of_squares
from fedistill.data.mri.options import check_choice, check_image_size, check_max_volumes, check_options
from fedistill.data.mri.slices import center_crop
from fedistill.errors import DataError

NAME = "fastmri-brain"
CONTRASTS = {
    "t1": ("AXT1", "AXT1PRE", "AXT1POST"),
    "t2": ("AXT2",),
    "flair": ("AXFLAIR",),
    "any": (),
}
TARGETS = ("kspace", "file")
SLICE_CHOICES = ("all", "brain")
TARGET_SIZE = 320  # fastMRI's brain targets are 320x320
TRAIN_DIRS = ("train", "multicoil_train", "brain_multicoil_train", "singlecoil_train")
TEST_DIRS = ("val", "multicoil_val", "brain_multicoil_val", "singlecoil_val")
OPTIONS = ("contrast", "image_size", "target", "slices", "max_volumes")


#: What a fastMRI brain folder holds, in a few words.
EXPECTED = "train/ and val/ folders of fastMRI brain .h5 files (e.g. train/file_brain_AXT1_202_2020000.h5)"


def describe_fastmri_brain(folder: str) -> str:
    """Where to put fastMRI's brain training and validation files."""
    return (
        f"fastMRI brain: put the .h5 files of fastMRI's brain_multicoil_train release in {folder}/train/ "
        f"and those of brain_multicoil_val in {folder}/val/ (the test files have no targets):\n"
        f"  {folder}/train/file_brain_AXT1_202_2020000.h5, ...\n"
        f"  {folder}/val/file_brain_AXT1_201_6002740.h5, ...\n"
        "(folders named multicoil_train / multicoil_val also work). contrast=t1|t2|flair|any picks files "
        "by their `acquisition` attribute."
    )


def _split_dir(folder: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (folder / name).is_dir():
            return folder / name
    raise DataError(f"fastMRI: no {' or '.join(names)} folder in {folder}; expected {EXPECTED}")


def _acquisition(f: h5py.File) -> str:
    value = f.attrs.get("acquisition", "")
    return value.decode() if isinstance(value, bytes) else str(value)


def _target_slices(f: h5py.File, path: Path, target: str) -> np.ndarray:
    """The volume's fully sampled magnitude slices (S, h, w), cropped to fastMRI's 320x320."""
    if "mask" in f:
        raise DataError(
            f"{path} holds undersampled k-space (it has a `mask`: a fastMRI test or challenge file) and no "
            "target; use the files of fastMRI's train and val releases"
        )
    if target == "file":
        key = next((k for k in _stored_targets(f) if k in f), None)
        if key is None:
            raise DataError(f"{path} has no reconstruction_rss or reconstruction_esc; use target='kspace'")
        stored = f[key]
        real = np.issubdtype(stored.dtype, np.number) and not np.issubdtype(stored.dtype, np.complexfloating)
        if stored.ndim != 3 or 0 in stored.shape or not real:
            raise DataError(
                f"{path}: `{key}` must be a real (slices, H, W) volume with at least one slice, got "
                f"{stored.dtype} {stored.shape}; use target='kspace'"
            )
        return center_crop(np.asarray(stored, dtype=np.float32), TARGET_SIZE, TARGET_SIZE)
    return kspace_magnitudes(f, path, "is it a fastMRI file?")


def _stored_targets(f: h5py.File) -> tuple[str, str]:
    """The stored targets in the order fastMRI uses them: single-coil files (3-D `kspace`) also hold
    `reconstruction_rss`, made from the original multi-coil data, but their target is `reconstruction_esc`,
    the image of their own k-space."""
    keys = ("reconstruction_rss", "reconstruction_esc")
    return keys[::-1] if "kspace" in f and f["kspace"].ndim == 3 else keys


def kspace_magnitudes(f: h5py.File, path: Path, hint: str) -> np.ndarray:
    """|ifft2c(k-space)| per slice of a file in fastMRI's layout (coils combined by root-sum-of-squares),
    cropped to 320x320; `hint` ends the message when the file has no `kspace`."""
    if "kspace" not in f:
        raise DataError(f"{path} has no `kspace` dataset; {hint}")
    kspace = f["kspace"]
    if kspace.ndim not in (3, 4) or not np.issubdtype(kspace.dtype, np.complexfloating):
        raise DataError(
            f"{path}: `kspace` must be complex (slices, H, W) or (slices, coils, H, W), "
            f"got {kspace.dtype} {kspace.shape}"
        )
    if 0 in kspace.shape:
        raise DataError(f"{path}: `kspace` {kspace.shape} is empty (a dimension of size 0)")
    out = []
    for i in range(kspace.shape[0]):  # one slice at a time: a multi-coil volume can be ~0.5 GB
        images = ifft2c(torch.from_numpy(np.asarray(kspace[i])))
        magnitude = root_sum_of_squares(images, dim=0) if kspace.ndim == 4 else images.abs()
        out.append(center_crop(magnitude.float().numpy(), TARGET_SIZE, TARGET_SIZE))
    return np.stack(out)


def _read_split(
    folder: Path, contrast: str, target: str, size: int | None, keep: str, cap: int | None, group: int
) -> list[Volume]:
    files = sorted(p for p in folder.glob("*.h5") if p.is_file())
    if not files:
        raise DataError(
            f"fastMRI: no .h5 files in {folder}; expected fastMRI brain files there "
            "(e.g. file_brain_AXT1_202_2020000.h5)"
        )
    wanted, seen, volumes = CONTRASTS[contrast], set(), []
    for path in files:
        if cap is not None and len(volumes) >= cap:
            break
        try:
            with h5py.File(path, "r") as f:
                acquisition = _acquisition(f)
                seen.add(acquisition or "(none)")
                if wanted and acquisition not in wanted:
                    continue
                raw = _target_slices(f, path, target)
        except OSError as e:
            raise DataError(f"cannot read HDF5 file {path} ({e}); replace it") from e
        volumes.append(volume_from_slices(str(path), raw, size, keep, group))
    if not volumes:
        raise DataError(
            f"fastMRI: no {contrast.upper()} file in {folder} (acquisitions {', '.join(wanted)}); "
            f"its files have {', '.join(sorted(seen))}"
        )
    return volumes


def fastmri_volumes(
    folder: Path,
    contrast: str = "t1",
    image_size: int | None = 128,
    target: str = "kspace",
    slices: str = "all",
    max_volumes: int | None = None,
    group: int = 0,
) -> tuple[list[Volume], list[Volume]]:
    """(train volumes from train/, test volumes from val/), every slice in `group`."""
    contrast = check_choice(NAME, "contrast", contrast, tuple(CONTRASTS))
    size = check_image_size(NAME, image_size, "native: 320 pixels")
    target = check_choice(NAME, "target", target, TARGETS)
    keep = check_choice(NAME, "slices", slices, SLICE_CHOICES)
    cap = check_max_volumes(NAME, max_volumes)
    if not folder.is_dir():
        raise DataError(f"fastMRI folder {folder} does not exist; expected {EXPECTED} in it")
    train_dir, test_dir = _split_dir(folder, TRAIN_DIRS), _split_dir(folder, TEST_DIRS)
    return (
        _read_split(train_dir, contrast, target, size, keep, cap, group),
        _read_split(test_dir, contrast, target, size, keep, cap, group),
    )


def load_fastmri_brain(folder: str | Path, **options: object) -> LoadedDataset:
    """fastMRI brain slices for reconstruction (options: see `fastmri_volumes`)."""
    check_options(NAME, options, OPTIONS)
    train, test = fastmri_volumes(Path(folder), **options)  # type: ignore[arg-type]
    contrast = check_choice(NAME, "contrast", options.get("contrast", "t1"), tuple(CONTRASTS))
    return build_dataset(f"{NAME}-{contrast}", train, test)
