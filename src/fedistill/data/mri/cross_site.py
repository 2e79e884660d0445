"""`mri-cross-site`: fastMRI, BraTS 2020 and IXI in one dataset, one group per source: Table 9's setting.

FedIOD (following Guo et al., FL-MRCM) gives each site one MRI source and tests on every source's test
set. Here each source is read by its own loader from its subfolder (`fastmri/`, `brats/`, `ixi/`, the
same folders the single-source datasets use), with the same contrast and image size; every training
slice's group is its source (the `natural` partitioner makes each source a site) and every test slice
carries its source in `test_groups` and its volume in `test_meta["subject"]`, so results can be
reported per test source as in the paper's table.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.mri import brats, fastmri, ixi
from fedistill.data.mri.assemble import Volume, build_dataset
from fedistill.data.mri.brats import brats_volumes, describe_brats_mri
from fedistill.data.mri.fastmri import describe_fastmri_brain, fastmri_volumes
from fedistill.data.mri.ixi import describe_ixi, ixi_volumes
from fedistill.data.mri.options import check_choice, check_image_size, check_max_volumes, check_options
from fedistill.errors import ConfigError, DataError

NAME = "mri-cross-site"
CONTRASTS = ("t1", "t2")
OPTIONS = ("contrast", "image_size", "sources", "max_volumes")
# subfolder -> (group name, describe)
SOURCES: dict[str, tuple[str, Callable[[str], str]]] = {
    "fastmri": ("fastMRI", describe_fastmri_brain),
    "brats": ("BraTS2020", describe_brats_mri),
    "ixi": ("IXI", describe_ixi),
}
#: What each source's subfolder holds, in a few words.
EXPECTED = {"fastmri": fastmri.EXPECTED, "brats": brats.EXPECTED, "ixi": ixi.EXPECTED}


def describe_mri_cross_site(folder: str) -> str:
    """Where to put each source of the MRI cross-site set, one subfolder each."""
    parts = [f"MRI cross-site: one subfolder of {folder}/ per source (sources=... picks a subset):"]
    parts += [describe(f"{folder}/{key}") for key, (_, describe) in SOURCES.items()]
    return "\n".join(parts)


def _sources(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ConfigError(
            f"{NAME} option sources must be a non-empty list of {', '.join(SOURCES)}, got {value!r}"
        )
    keys = tuple(check_choice(NAME, "sources", str(s), tuple(SOURCES), value) for s in items)
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{NAME} option sources must not list a source twice, got {value!r}")
    return keys


def _read(key: str, folder: Path, contrast: str, size: int | None, cap: int | None, group: int):
    if key == "fastmri":
        return fastmri_volumes(folder, contrast, size, max_volumes=cap, group=group)
    if key == "brats":
        return brats_volumes(folder, contrast, size, max_volumes=cap, group=group)
    train, test, _ = ixi_volumes(folder, contrast, size, max_volumes=cap, group=group)
    return train, test


def load_mri_cross_site(folder: str | Path, **options: object) -> LoadedDataset:
    """Options: contrast (t1, t2), image_size (default 128; None = each source's native size, which
    differ, so only with a single source), sources (default all three, in this order: the group ids),
    max_volumes (per source and split). The sources' defaults apply otherwise (BraTS: the official
    split and Guo et al.'s slices 14-134; IXI: 15.5% of subjects held out, brain slices; fastMRI: val
    as test)."""
    check_options(NAME, options, OPTIONS)
    root = Path(folder)
    contrast = check_choice(NAME, "contrast", options.get("contrast", "t1"), CONTRASTS)
    keys = _sources(options.get("sources", tuple(SOURCES)))
    size = check_image_size(NAME, options.get("image_size", 128), "each source's own, so one source only")
    cap = check_max_volumes(NAME, options.get("max_volumes"))
    missing = [key for key in keys if not (root / key).is_dir()]
    if missing:
        expected = "; ".join(f"{k}/: {EXPECTED[k]}" for k in missing)
        raise DataError(
            f"MRI cross-site: missing source folder(s) {', '.join(str(root / k) for k in missing)} "
            f"(or drop them with sources=...); expected {expected}"
        )
    train: list[Volume] = []
    test: list[Volume] = []
    for group, key in enumerate(keys):
        tr, te = _read(key, root / key, contrast, size, cap, group)
        train += tr
        test += te
    names = tuple(SOURCES[k][0] for k in keys)
    return build_dataset(f"{NAME}-{contrast}", train, test, names)
