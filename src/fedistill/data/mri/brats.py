"""`brats-mri`: BraTS 2020 T1 or T2 volumes as a reconstruction source (FedIOD's Table 9, "B").

Files: `<subject>_t1.nii.gz` / `<subject>_t2.nii.gz` anywhere under the folder, as the BraTS 2020
archives unpack them (`MICCAI_BraTS2020_TrainingData/BraTS20_Training_001/BraTS20_Training_001_t1.nii.gz`;
the tumour labels are not needed), and as BraTS 2021 does; BraTS 2023's `<subject>-t1n.nii.gz` /
`<subject>-t2w.nii.gz` too. BraTS volumes are skull-stripped, co-registered, 1 mm, 240x240x155.

Split: by default the official one the paper uses, 369 training subjects (files under a folder whose
name contains "Training") and 125 test subjects (under "Validation": the validation release has the
T1 and T2 images, which is all reconstruction needs). `test_fraction` instead holds out that share of
all subjects found. Subjects of two glioma releases (2018's `Brats18_...` beside 2020's `BraTS20_...`) are
refused: each release holds the earlier ones' patients under new names.

Slices: `slices="protocol"` keeps axial slices 14..134 of the 155, as Guo et al. (FL-MRCM) do ("about
120 slices per subject" in the paper); "brain" keeps the slices whose brain area is at least a third
of the largest; "all" keeps every slice. Guo et al. also zero-pad the 240x240 slices to 256x256; here
`image_size=None` keeps 240x240 (padding adds only empty background).
"""

from __future__ import annotations

import re
from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.mri.assemble import Volume, build_dataset, volume_from_slices
from fedistill.data.mri.nifti import read_slices
from fedistill.data.mri.options import (
    check_choice,
    check_image_size,
    check_max_volumes,
    check_options,
    check_test_fraction,
)
from fedistill.data.mri.split import brats_patient, split_subjects
from fedistill.errors import DataError

NAME = "brats-mri"
CONTRASTS = ("t1", "t2")
#: BraTS 2023's file name for each contrast (`BraTS-GLI-00000-000-t1n.nii.gz` is the native T1)
NAMES_2023 = {"t1": "t1n", "t2": "t2w"}
#: The glioma releases by their subjects' names: each holds the patients of the ones before it under new names
GLIOMA_RELEASES = {
    "2018": "Brats18_",
    "2019": "BraTS19_",
    "2020": "BraTS20_",
    "2021": "BraTS2021_",
    "2023": "BraTS-GLI-",
}
SLICE_CHOICES = ("protocol", "brain", "all")
PROTOCOL_SLICES = range(14, 135)
OPTIONS = ("contrast", "image_size", "slices", "test_fraction", "max_volumes")


#: What a BraTS 2020 folder holds, in a few words.
EXPECTED = (
    "the unpacked BraTS 2020 releases (e.g. MICCAI_BraTS2020_TrainingData/BraTS20_Training_001/"
    "BraTS20_Training_001_t1.nii.gz, and MICCAI_BraTS2020_ValidationData/...)"
)


def describe_brats_mri(folder: str) -> str:
    """Where to put the BraTS 2020 releases for reconstruction."""
    return (
        f"BraTS 2020 (reconstruction): put the unpacked BraTS 2020 releases under {folder}/:\n"
        f"  {folder}/MICCAI_BraTS2020_TrainingData/BraTS20_Training_001/BraTS20_Training_001_t1.nii.gz, "
        "..._t2.nii.gz, ... (training subjects)\n"
        f"  {folder}/MICCAI_BraTS2020_ValidationData/BraTS20_Validation_001/"
        "BraTS20_Validation_001_t1.nii.gz, ... (test subjects)\n"
        "or any subjects' <subject>_t1.nii.gz / _t2.nii.gz files with test_fraction=0.25 to hold out a share."
    )


def find_brats(folder: Path, contrast: str) -> dict[str, Path]:
    """{subject: file} for the `<subject>_<contrast>.nii[.gz]` files (2023: `<subject>-t1n`, `-t2w`)
    under `folder`."""
    if not folder.is_dir():
        raise DataError(f"BraTS folder {folder} does not exist; expected {EXPECTED} in it")
    found: dict[str, Path] = {}
    for ending in (f"_{contrast}", f"-{NAMES_2023[contrast]}"):
        pattern = re.compile(rf"^(.+){ending}\.nii(\.gz)?$")
        for path in sorted(folder.rglob(f"*{ending}.nii*")):
            m = pattern.match(path.name)
            if m and path.is_file():
                found.setdefault(m.group(1), path)
    if not found:
        raise DataError(
            f"no BraTS {contrast.upper()} files (<subject>_{contrast}.nii.gz, or BraTS 2023's "
            f"<subject>-{NAMES_2023[contrast]}.nii.gz) under {folder}; expected {EXPECTED}"
        )
    return found


def _official_split(files: dict[str, Path], folder: Path) -> tuple[list[str], list[str]]:
    def under(subject: str, word: str) -> bool:
        return any(word in part.lower() for part in files[subject].relative_to(folder).parts[:-1])

    train = [s for s in sorted(files) if under(s, "training")]
    test = [s for s in sorted(files) if under(s, "validation")]
    if not train or not test:
        missing = "Training" if not train else "Validation"
        raise DataError(
            f"BraTS under {folder}: no subject under a folder named like *{missing}* (the official split "
            f"puts MICCAI_BraTS2020_TrainingData and MICCAI_BraTS2020_ValidationData there); add it, or "
            "set test_fraction (e.g. 0.25) to hold out a share of the subjects found"
        )
    return train, test


def check_one_release(subjects: list[str], folder: Path) -> None:
    """DataError when `subjects` come from more than one glioma release: one patient's scans would be in
    both, under two names, and could be trained and tested on."""
    example: dict[str, str] = {}
    for subject in sorted(subjects):
        for release, prefix in GLIOMA_RELEASES.items():
            if subject.startswith(prefix):
                example.setdefault(release, subject)
    if len(example) > 1:
        found = ", ".join(f"BraTS {r} ({example[r]} ...)" for r in GLIOMA_RELEASES if r in example)
        raise DataError(
            f"BraTS releases mixed under {folder}: {found}; each release holds the patients of the earlier "
            "ones under new names, so one patient could be both trained and tested on. Keep one release there"
        )


def brats_volumes(
    folder: Path,
    contrast: str = "t1",
    image_size: int | None = 128,
    slices: str = "protocol",
    test_fraction: float | None = None,
    max_volumes: int | None = None,
    group: int = 0,
) -> tuple[list[Volume], list[Volume]]:
    """(train volumes, test volumes), every slice in `group`."""
    contrast = check_choice(NAME, "contrast", contrast, CONTRASTS)
    size = check_image_size(NAME, image_size, "native: 240 pixels")
    choice = check_choice(NAME, "slices", slices, SLICE_CHOICES)
    keep = PROTOCOL_SLICES if choice == "protocol" else choice
    cap = check_max_volumes(NAME, max_volumes)
    share = None if test_fraction is None else check_test_fraction(NAME, test_fraction)
    files = find_brats(folder, contrast)
    if share is None:
        train_ids, test_ids = _official_split(files, folder)
    else:
        train_ids, test_ids = split_subjects(list(files), share, str(folder), patient_of=brats_patient)
    check_one_release([*train_ids, *test_ids], folder)

    def read(ids: list[str]) -> list[Volume]:
        return [
            volume_from_slices(str(files[s]), read_slices(files[s]).slices, size, keep, group)
            for s in ids[:cap]
        ]

    return read(train_ids), read(test_ids)


def load_brats_mri(folder: str | Path, **options: object) -> LoadedDataset:
    """BraTS 2020 T1 or T2 slices for reconstruction (options: see `brats_volumes`)."""
    check_options(NAME, options, OPTIONS)
    train, test = brats_volumes(Path(folder), **options)  # type: ignore[arg-type]
    contrast = check_choice(NAME, "contrast", options.get("contrast", "t1"), CONTRASTS)
    return build_dataset(f"{NAME}-{contrast}", train, test)
