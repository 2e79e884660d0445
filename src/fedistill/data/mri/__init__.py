"""MRI reconstruction data: k-space and undersampling masks, the standard files' loaders, real-anatomy
stand-ins.

A reconstruction dataset holds fully sampled magnitude slices (`x`, float32 (N, 1, H, W) in [0, 1],
each volume scaled to maximum 1) and their foreground masks (`y`, int64 (N, H, W)); the undersampled
input is made from `x` and a mask by `kspace.zero_filled`. Datasets, by name (`ENTRIES`):

  fastmri-brain   fastMRI brain HDF5 files                    <data_dir>/fastmri/{train,val}/*.h5
  ixi             IXI T1/T2 NIfTI                              <data_dir>/ixi/IXI*-T1.nii.gz, ...
  brats-mri       BraTS 2020 T1/T2 NIfTI                       <data_dir>/brats/**/<subject>_t1.nii.gz, ...
  mri-cross-site  the three above, one group per source        <data_dir>/{fastmri,brats,ixi}/
  brain-t1-sites  four real T1 volumes, one per site (semi-synthetic: simulated k-space)
                                                               <data_dir>/brain-mri/*.nii.gz
  mni152-t1       nilearn's MNI152 template through simulated scanners (no files)

Each entry is (subdir under data_dir, or None when no files are needed; load(folder, **options);
describe(folder) -> which files go where; the option names load takes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from fedistill.data.base import LoadedDataset
from fedistill.data.mri import brain_sites, brats, cross_site, fastmri, ixi, mni152
from fedistill.data.mri.brain_sites import describe_brain_t1_sites, load_brain_t1_sites
from fedistill.data.mri.brats import describe_brats_mri, load_brats_mri
from fedistill.data.mri.cross_site import describe_mri_cross_site, load_mri_cross_site
from fedistill.data.mri.fastmri import describe_fastmri_brain, load_fastmri_brain
from fedistill.data.mri.ixi import describe_ixi, load_ixi
from fedistill.data.mri.kspace import (
    data_consistency,
    fft2c,
    ifft2c,
    root_sum_of_squares,
    undersample,
    zero_filled,
)
from fedistill.data.mri.masks import (
    EquispacedExactMaskFunc,
    EquispacedMaskFunc,
    MaskFunc,
    RandomMaskFunc,
    SliceMasks,
    mask_function,
)
from fedistill.data.mri.mni152 import describe_mni152_t1, load_mni152_t1


class Entry(NamedTuple):
    """How an MRI dataset is found, loaded and described, and which options it takes."""

    subdir: str | None  # folder under data_dir; "" = data_dir itself; None = needs no files
    load: Callable[..., LoadedDataset]  # (folder, **options)
    describe: Callable[[str], str]  # (folder shown to the user) -> which files go where
    options: tuple[str, ...]


ENTRIES: dict[str, Entry] = {
    "fastmri-brain": Entry("fastmri", load_fastmri_brain, describe_fastmri_brain, fastmri.OPTIONS),
    "ixi": Entry("ixi", load_ixi, describe_ixi, ixi.OPTIONS),
    "brats-mri": Entry("brats", load_brats_mri, describe_brats_mri, brats.OPTIONS),
    "mri-cross-site": Entry("", load_mri_cross_site, describe_mri_cross_site, cross_site.OPTIONS),
    "brain-t1-sites": Entry(
        brain_sites.SUBDIR, load_brain_t1_sites, describe_brain_t1_sites, brain_sites.OPTIONS
    ),
    "mni152-t1": Entry(None, load_mni152_t1, describe_mni152_t1, mni152.OPTIONS),
}

__all__ = [
    "ENTRIES",
    "EquispacedExactMaskFunc",
    "EquispacedMaskFunc",
    "MaskFunc",
    "RandomMaskFunc",
    "SliceMasks",
    "data_consistency",
    "describe_brain_t1_sites",
    "describe_brats_mri",
    "describe_fastmri_brain",
    "describe_ixi",
    "describe_mni152_t1",
    "describe_mri_cross_site",
    "fft2c",
    "ifft2c",
    "load_brain_t1_sites",
    "load_brats_mri",
    "load_fastmri_brain",
    "load_ixi",
    "load_mni152_t1",
    "load_mri_cross_site",
    "mask_function",
    "root_sum_of_squares",
    "undersample",
    "zero_filled",
]
