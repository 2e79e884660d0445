"""`mni152-t1`: a no-files reconstruction demo, real anatomy imaged by simulated scanners.

The anatomy is nilearn's copy of the ICBM 2009a MNI152 T1 template (an average of 152 adults,
skull-stripped, 1 mm), which ships inside the installed nilearn wheel, so nothing needs downloading.
Sites differ only by simulated, deterministic acquisition differences (`fedistill.data.mri.acquisition`);
the names say which:

  reference         clean: 1% Rician noise
  bias-field-noisy  a +-25% coil-shading field front to back, 4% noise
  low-resolution    a point-spread function of sigma 0.8 pixels, 2% noise
  contrast-shift    a different tissue contrast (gamma 1.6), a 10% left-right field, 2% noise

`sites` (2-4, default 3) takes the first ones. Slices: the axial slices through the brain (foreground
at least a third of the largest), resized to `image_size` (default 64). Split: 16 mm slabs, every 4th
one test, training slices within 4 mm of a test slice dropped (`slab_split`). There is one anatomy,
so every site holds the same training slices and tests on the same test slices, each as its own
scanner images them: the sites differ by acquisition only. Each site's volume is scaled to maximum 1
and is one test subject. The k-space is simulated from the images by the task layer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from fedistill.data.base import LoadedDataset
from fedistill.data.mri.acquisition import Acquisition
from fedistill.data.mri.assemble import BRAIN_SHARE, Volume, build_dataset
from fedistill.data.mri.foreground import foreground_masks
from fedistill.data.mri.nifti import read_slices
from fedistill.data.mri.options import check_image_size, check_options
from fedistill.data.mri.slices import brain_slices, pad_to_square, prepare, resize, scale_to_unit
from fedistill.data.mri.split import slab_split
from fedistill.errors import ConfigError, DataError

NAME = "mni152-t1"
TEMPLATE = "datasets/data/mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz"  # inside the nilearn package
ACQUISITIONS = (
    Acquisition("reference", noise=0.01, seed=1),
    Acquisition("bias-field-noisy", bias=0.25, bias_axes=(0.3, 1.0, 0.0), noise=0.04, seed=2),
    Acquisition("low-resolution", blur_px=0.8, noise=0.02, seed=3),
    Acquisition("contrast-shift", gamma=1.6, bias=0.1, bias_axes=(0.0, 0.0, 1.0), noise=0.02, seed=4),
)
OPTIONS = ("image_size", "sites")


def describe_mni152_t1(folder: str) -> str:
    """Why mni152-t1 needs no files: it images nilearn's MNI152 template with simulated scanners."""
    return (
        "mni152-t1 needs no files: it reads the MNI152 2009a T1 template that ships inside the nilearn "
        "package (a fedistill dependency) and images it with simulated scanners."
    )


def template_path() -> Path:
    """The MNI152 T1 template inside the installed nilearn package, found without importing nilearn (slow)."""
    spec = importlib.util.find_spec("nilearn")  # locate the package without importing it (slow)
    if spec is None or not spec.submodule_search_locations:
        raise DataError("mni152-t1 needs the nilearn package (pip install nilearn), which ships the template")
    path = Path(next(iter(spec.submodule_search_locations))) / TEMPLATE
    if not path.is_file():
        raise DataError(f"the MNI152 template {path} is missing from the nilearn package; reinstall nilearn")
    return path


def _site_volume(
    acq: Acquisition, base: np.ndarray, index: np.ndarray, size: int | None, group: int
) -> Volume:
    native = acq.before_resize(base[index])
    images = scale_to_unit(acq.after_resize(resize(pad_to_square(native), size), index), acq.name)
    return Volume(acq.name, images, index, group, foreground_masks(images))


def load_mni152_t1(folder: object = None, **options: object) -> LoadedDataset:
    """Sites imaging the MNI152 template (options: image_size, default 64; sites, 2-4, default 3)."""
    check_options(NAME, options, OPTIONS)
    size = check_image_size(NAME, options.get("image_size", 64), "native: 233 pixels")
    sites = options.get("sites", 3)
    if isinstance(sites, bool) or not isinstance(sites, int) or not 2 <= sites <= len(ACQUISITIONS):
        raise ConfigError(
            f"{NAME} option sites must be an integer from 2 to {len(ACQUISITIONS)}, got {sites!r}"
        )
    stack = read_slices(template_path())
    base = np.clip(stack.slices, 0.0, None) / max(float(stack.slices.max()), 1e-12)
    index = brain_slices(foreground_masks(prepare(base, size, NAME)), BRAIN_SHARE)
    train_pos, test_pos = slab_split(index * stack.spacing[0])
    train, test = [], []
    for group, acq in enumerate(ACQUISITIONS[:sites]):
        volume = _site_volume(acq, base, index, size, group)
        train.append(volume.subset(train_pos))
        test.append(volume.subset(test_pos))
    return build_dataset(NAME, train, test, tuple(a.name for a in ACQUISITIONS[:sites]))
