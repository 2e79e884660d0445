"""Cross-site nuclei (the FedIOD paper's Table 4): CPM-17, TCGA (MoNuSeg) and TNBC, one site each.

One data folder holds the three datasets in their own subfolders, each in its own layout:
`cpm17/` (see cpm17.py), `monuseg/` (monuseg.py) and `tnbc/` (tnbc.py). Each source is one group, in
the paper's order (Cell17, TCGA, TNBC), for training and test alike, so the `natural` partition with 3
clients gives one source per client and test tables can be read per source. TCGA's split is MoNuSeg
2018's own by default (`tcga_split = "challenge"`: its training tiles and its 14 test tiles), since the
paper takes "the training set" of each source; "cross-organ" uses Kumar et al.'s 16 + 8 tiles instead.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.medical import cpm17, monuseg, tnbc
from fedistill.data.medical import options as opt
from fedistill.data.medical.nuclei_sets import WholeImage, nuclei_dataset, patching_options

NAME = "nuclei-cross-site"
SOURCES = ("cpm17", "tcga", "tnbc")
SUBFOLDERS = ("cpm17", "monuseg", "tnbc")


def describe(folder: str) -> str:
    """Where to put the three nuclei datasets of the cross-site set, each in its own layout."""
    return "\n".join(
        [f"Cross-site nuclei: three subfolders of {folder}/, each in its dataset's own layout:"]
        + [
            "  " + module.describe(f"{folder}/{sub}")
            for module, sub in zip((cpm17, monuseg, tnbc), SUBFOLDERS, strict=True)
        ]
    )


def _as_group(wholes: list[WholeImage], group: int) -> list[WholeImage]:
    return [replace(w, group=group) for w in wholes]


def load_cross_site(
    folder: Path,
    *,
    patch_size: int = 256,
    stride: int | None = None,
    scale: float = 1.0,
    tcga_split: str = "challenge",
    tnbc_test_slides: object = None,
) -> LoadedDataset:
    """CPM-17, MoNuSeg and TNBC as one dataset, each dataset a group (a site of the natural partition)."""
    patching = patching_options(NAME, patch_size, stride, scale)
    tcga_split = opt.choice(NAME, "tcga_split", tcga_split, monuseg.SPLITS)
    root = Path(folder)
    cpm_train = cpm17.read_split(root / "cpm17", "train", group=0)
    cpm_test = cpm17.read_split(root / "cpm17", "test", group=0)
    tcga_train, tcga_test, _ = monuseg.load_tiles(root / "monuseg", tcga_split, monuseg.CROSS_ORGAN, 4, 2)
    tnbc_train, tnbc_test, _ = tnbc.load_tnbc_images(root / "tnbc", tnbc_test_slides, group_of=lambda s: 2)
    train = [*cpm_train, *_as_group(tcga_train, 1), *tnbc_train]
    test = [*cpm_test, *_as_group(tcga_test, 1), *tnbc_test]
    return nuclei_dataset(NAME, train, test, patching, SOURCES)
