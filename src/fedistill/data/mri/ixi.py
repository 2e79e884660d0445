"""`ixi`: IXI brain scans (T1 or T2 NIfTI per subject), one of the three sources of FedIOD's Table 9.

Files: `IXI<id>-<site>-<n>-T1.nii.gz` and `-T2.nii.gz` as the IXI-T1 and IXI-T2 archives unpack them,
anywhere under the folder. IXI was scanned at three London hospitals (Guys, HH = Hammersmith,
IOP = Institute of Psychiatry); each slice's group is its hospital, so the `natural` partitioner can
give every hospital its own site.

Slices: the volume is cut into axial slices (`slice_axis`, see `fedistill.data.mri.nifti`), and by
default only the middle slices through the brain are kept (`slices="brain"`: foreground area at
least a third of the volume's largest). Guo et al. (FL-MRCM) keep every slice of the file as stored
(`slices="all"`, `slice_axis="stored"`): the file's third voxel axis, ~150 slices for T1 and ~130 for
T2, the counts the paper quotes; that axis is the acquisition's, which need not be axial.

Split: IXI has no official split. A fixed share of subjects (`test_fraction`, default 0.155: the
paper's 90 test subjects of 581 T1 subjects) is held out whole (`fedistill.data.mri.split`); the
paper's 55 validation subjects stay in training here (a validation split is taken from training).
"""

from __future__ import annotations

import re
from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.mri.assemble import Volume, build_dataset, volume_from_slices
from fedistill.data.mri.nifti import SLICE_AXES, read_slices
from fedistill.data.mri.options import (
    check_choice,
    check_image_size,
    check_max_volumes,
    check_options,
    check_test_fraction,
)
from fedistill.data.mri.split import split_subjects
from fedistill.errors import DataError

NAME = "ixi"
CONTRASTS = ("t1", "t2")
SLICE_CHOICES = ("brain", "all")
KNOWN_SITES = ("Guys", "HH", "IOP")
_FILE = re.compile(r"^(IXI\d+)-([A-Za-z]+)-(\d+)-(T1|T2)\.nii(\.gz)?$")
OPTIONS = ("contrast", "image_size", "slices", "slice_axis", "test_fraction", "max_volumes")


#: What an IXI folder holds, in a few words.
EXPECTED = "IXI's NIfTI files as IXI-T1.tar and IXI-T2.tar unpack them (e.g. IXI002-Guys-0828-T1.nii.gz)"


def describe_ixi(folder: str) -> str:
    """Where to put IXI's T1 or T2 NIfTI files; the three hospitals become the groups."""
    return (
        f"IXI: put the subjects' NIfTI files under {folder}/ (any subfolders), named as the IXI-T1.tar "
        "and IXI-T2.tar archives from brain-development.org unpack them:\n"
        f"  {folder}/IXI002-Guys-0828-T1.nii.gz, {folder}/IXI002-Guys-0828-T2.nii.gz, ...\n"
        "contrast=t1|t2 picks the files; the three hospitals (Guys, HH, IOP) become the groups."
    )


def find_ixi(folder: Path, contrast: str) -> dict[str, Path]:
    """{subject (IXI<id>-<site>-<n>): file} for the contrast's files under `folder`."""
    if not folder.is_dir():
        raise DataError(f"IXI folder {folder} does not exist; expected {EXPECTED} in it")
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("IXI*")):
        m = _FILE.match(path.name)
        if m and m.group(4).lower() == contrast and path.is_file():
            found.setdefault(f"{m.group(1)}-{m.group(2)}-{m.group(3)}", path)
    if not found:
        raise DataError(
            f"no IXI {contrast.upper()} files (IXI*-{contrast.upper()}.nii.gz) under {folder}; expected "
            f"IXI's NIfTI files as IXI-{contrast.upper()}.tar unpacks them "
            f"(e.g. IXI002-Guys-0828-{contrast.upper()}.nii.gz)"
        )
    return found


def site_of(subject: str) -> str:
    """The hospital of an IXI subject (Guys, HH or IOP), from its name."""
    return subject.split("-")[1]


def ixi_volumes(
    folder: Path,
    contrast: str = "t1",
    image_size: int | None = 128,
    slices: str = "brain",
    slice_axis: str = "axial",
    test_fraction: float = 0.155,
    max_volumes: int | None = None,
    group: int | None = None,
) -> tuple[list[Volume], list[Volume], tuple[str, ...]]:
    """(train volumes, test volumes, site names); `group` puts every volume in that one group instead
    of its hospital's (used when IXI is one source of a multi-source set)."""
    contrast = check_choice(NAME, "contrast", contrast, CONTRASTS)
    size = check_image_size(NAME, image_size, "native: 256 pixels")
    keep = check_choice(NAME, "slices", slices, SLICE_CHOICES)
    axis = check_choice(NAME, "slice_axis", slice_axis, SLICE_AXES)
    cap = check_max_volumes(NAME, max_volumes)
    share = check_test_fraction(NAME, test_fraction)
    files = find_ixi(folder, contrast)
    train_ids, test_ids = split_subjects(list(files), share, f"IXI {folder}")
    found = {site_of(s) for s in files}
    sites = [s for s in KNOWN_SITES if s in found] + sorted(found - set(KNOWN_SITES))

    def read(ids: list[str]) -> list[Volume]:
        out = []
        for subject in ids[:cap]:
            stack = read_slices(files[subject], axis)
            g = sites.index(site_of(subject)) if group is None else group
            out.append(volume_from_slices(str(files[subject]), stack.slices, size, keep, g))
        return out

    return read(train_ids), read(test_ids), tuple(sites)


def load_ixi(folder: str | Path, **options: object) -> LoadedDataset:
    """IXI T1 or T2 slices for reconstruction (options: see `ixi_volumes`), one group per hospital."""
    check_options(NAME, options, OPTIONS)
    train, test, sites = ixi_volumes(Path(folder), **options)  # type: ignore[arg-type]
    contrast = check_choice(NAME, "contrast", options.get("contrast", "t1"), CONTRASTS)
    return build_dataset(f"{NAME}-{contrast}", train, test, sites)
