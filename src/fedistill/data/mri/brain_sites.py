"""`brain-t1-sites`: four real T1 brain volumes, one per site, for cross-site reconstruction.

A stand-in for FedIOD's Table 9 setting (sites holding different MRI sources) built from real
anatomy: the four T1 volumes of the shared `brain-mri/` folder, each a site with its own scanner,
subject and preprocessing, as fastMRI, BraTS and IXI differ in the paper:

  Colin27       one healthy adult, 27 scans averaged (low noise), with skull, 1 mm
  MNI152-2009a  the ICBM 2009a template, an average of 152 adults, skull-stripped (like BraTS), 1 mm
  patient-1     a patient's axial contrast-enhanced T1 with a lesion, with skull, 6.5 mm slices
  patient-2     a second such patient

Only T1 is available: there is no real T2 volume, so the paper's T2 half has no stand-in. The images
are real; their k-space is simulated from the magnitude slices by the task layer (zero phase,
single coil; see `fedistill.data.mri.kspace`), so this is *semi-synthetic* reconstruction data.

Slices: axial, those through the brain (foreground area at least a third of the volume's largest),
padded to square, resized to `image_size` (default 64), each volume scaled to maximum 1.
Split, per volume (`fedistill.data.mri.split.slab_split`): 16 mm slabs, every 4th slab (the 2nd, 6th,
...) is test, and training slices within 4 mm of a test slice are dropped, so no test slice has a
near-duplicate neighbour in training; 1 mm volumes give ~25 test slices each, the 6.5 mm patient
volumes ~5.
"""

from __future__ import annotations

from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.mri.assemble import Volume, build_dataset, volume_from_slices
from fedistill.data.mri.nifti import read_slices
from fedistill.data.mri.options import check_image_size, check_options
from fedistill.data.mri.split import slab_split
from fedistill.errors import ConfigError, DataError

NAME = "brain-t1-sites"
SUBDIR = "brain-mri"
SITES = (
    ("Colin27", "colin27_t1.nii.gz"),
    ("MNI152-2009a", "mni152_2009a_t1.nii.gz"),
    ("patient-1", "lesion_brain1_image.nii.gz"),
    ("patient-2", "lesion_brain2_image.nii.gz"),
)
OPTIONS = ("image_size",)


def describe_brain_t1_sites(folder: str) -> str:
    """Which four real T1 volumes, one per site, brain-t1-sites reads, and where to put them."""
    files = "\n".join(f"  {folder}/{file}  ({site})" for site, file in SITES)
    return (
        f"brain-t1-sites: four real T1 volumes, one per site, in {folder}/:\n{files}\n"
        "Colin 27 from the MRIcron templates, MNI152 2009a from nilearn's data, the two patients from "
        "pyradiomics' test data (NRRD converted to NIfTI, voxels unchanged)."
    )


def split_volume(volume: Volume, slice_mm: float) -> tuple[Volume, Volume]:
    """(train, test) parts of one volume by slabs along the slice axis."""
    train, test = slab_split(volume.slice_index * slice_mm)
    return volume.subset(train), volume.subset(test)


def load_brain_t1_sites(folder: str | Path, **options: object) -> LoadedDataset:
    """The four volumes as four sites (options: image_size, default 64; None = native, which differ)."""
    check_options(NAME, options, OPTIONS)
    size = check_image_size(NAME, options.get("image_size", 64), "not here: the volumes' native sizes differ")
    if size is None:
        raise ConfigError(f"{NAME} needs an integer image_size: its volumes' native sizes differ")
    root = Path(folder)
    missing = [file for _, file in SITES if not (root / file).is_file()]
    if missing:
        raise DataError(
            f"{NAME}: no {', '.join(missing)} in {root}; expected its four real T1 volumes there "
            f"({', '.join(file for _, file in SITES)})"
        )
    train, test = [], []
    for group, (_, file) in enumerate(SITES):
        stack = read_slices(root / file)
        volume = volume_from_slices(str(root / file), stack.slices, size, "brain", group)
        tr, te = split_volume(volume, stack.spacing[0])
        train.append(tr)
        test.append(te)
    return build_dataset(NAME, train, test, tuple(site for site, _ in SITES))
