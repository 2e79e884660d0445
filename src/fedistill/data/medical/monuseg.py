"""MoNuSeg / TCGA nuclei (Kumar et al. 2017): H&E `*.tif` tiles with Aperio XML outlines of every nucleus.

Layout: any `*.tif` under the folder, with the `<same name>.xml` anywhere under it (MoNuSeg's training
archive keeps them in `Tissue Images/` and `Annotations/`, its test archive side by side), so both
archives can simply be unpacked into the folder. Each tile's organ comes from its TCGA barcode's tissue
source site (the two characters after `TCGA-`), or from an optional `organs.csv` (columns image,organ)
in the folder, which overrides the barcode.

Splits (`split`):
  "cross-organ" (default): Chang et al.'s (2020) cross-organ protocol, which is Kumar et al.'s: breast,
      liver, kidney and prostate, 4 training and 2 test tiles each (16 + 8), one group per organ.
      Kumar et al.'s own choice of tiles is used where present; other tiles are taken by name.
  "challenge": every tile of MoNuSeg 2018's training set for training and its 14 test tiles (or any
      tile under a folder whose name contains "test") for testing; groups are organs.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.medical import options as opt
from fedistill.data.medical.aperio import read_instances
from fedistill.data.medical.nuclei_sets import (
    Patching,
    WholeImage,
    is_metadata,
    nuclei_dataset,
    patching_options,
    read_rgb,
)
from fedistill.errors import DataError

log = logging.getLogger(__name__)

NAME = "monuseg"
SPLITS = ("cross-organ", "challenge")
CROSS_ORGAN = ("breast", "liver", "kidney", "prostate")

# TCGA tissue source site code -> organ, for every tile of MoNuSeg 2018 (training and test), with the
# organ names MoNuSeg and Kumar et al. use. TCGA files the sites 18, 21, 38, 49 and 50 under its lung
# studies (LUSC, LUAD), but MoNuSeg and Kumar et al. call those six tiles liver, and the cross-organ
# protocol follows them. (Codes: TCGA's tissue source site table.)
TCGA_SITE_ORGAN = {
    "A7": "breast", "AR": "breast", "E2": "breast", "AC": "breast", "AO": "breast",
    "B0": "kidney", "HE": "kidney", "2Z": "kidney", "GL": "kidney", "IZ": "kidney",
    "18": "liver", "21": "liver", "38": "liver", "49": "liver", "50": "liver",
    "G9": "prostate", "CH": "prostate", "EJ": "prostate", "HC": "prostate",
    "DK": "bladder", "G2": "bladder", "CU": "bladder", "ZF": "bladder",
    "AY": "colon", "NH": "colon", "A6": "colon",
    "KB": "stomach", "RD": "stomach",
    "44": "lung", "69": "lung",
    "FG": "brain", "HT": "brain",
}  # fmt: skip

# Kumar et al.'s same-organ test tiles (2 per organ) and training tiles (4 per organ).
KUMAR_TEST = frozenset({
    "TCGA-E2-A1B5-01Z-00-DX1", "TCGA-E2-A14V-01Z-00-DX1", "TCGA-21-5784-01Z-00-DX1",
    "TCGA-21-5786-01Z-00-DX1", "TCGA-B0-5698-01Z-00-DX1", "TCGA-B0-5710-01Z-00-DX1",
    "TCGA-CH-5767-01Z-00-DX1", "TCGA-G9-6362-01Z-00-DX1",
})  # fmt: skip
KUMAR_TRAIN = frozenset({
    "TCGA-A7-A13E-01Z-00-DX1", "TCGA-A7-A13F-01Z-00-DX1", "TCGA-AR-A1AK-01Z-00-DX1",
    "TCGA-AR-A1AS-01Z-00-DX1", "TCGA-18-5592-01Z-00-DX1", "TCGA-38-6178-01Z-00-DX1",
    "TCGA-49-4488-01Z-00-DX1", "TCGA-50-5931-01Z-00-DX1", "TCGA-B0-5711-01Z-00-DX1",
    "TCGA-HE-7128-01Z-00-DX1", "TCGA-HE-7129-01Z-00-DX1", "TCGA-HE-7130-01Z-00-DX1",
    "TCGA-G9-6336-01Z-00-DX1", "TCGA-G9-6348-01Z-00-DX1", "TCGA-G9-6356-01Z-00-DX1",
    "TCGA-G9-6363-01Z-00-DX1",
})  # fmt: skip
# The 14 tiles of MoNuSeg 2018's test set.
CHALLENGE_TEST = frozenset({
    "TCGA-2Z-A9J9-01A-01-TS1", "TCGA-44-2665-01B-06-BS6", "TCGA-69-7764-01A-01-TS1",
    "TCGA-A6-6782-01A-01-BS1", "TCGA-AC-A2FO-01A-01-TS1", "TCGA-AO-A0J2-01A-01-BSA",
    "TCGA-CU-A0YN-01A-02-BSB", "TCGA-EJ-A46H-01A-03-TSC", "TCGA-FG-A4MU-01B-01-TS1",
    "TCGA-GL-6846-01A-01-BS1", "TCGA-HC-7209-01A-01-TS1", "TCGA-HT-8564-01Z-00-DX1",
    "TCGA-IZ-8196-01A-01-BS1", "TCGA-ZF-A9R5-01A-01-TS1",
})  # fmt: skip


#: What the MoNuSeg folder holds, in a few words.
LAYOUT = "MoNuSeg 2018's unpacked archives (Tissue Images/*.tif with same-named Aperio Annotations/*.xml)"


def describe(folder: str) -> str:
    """Where to put MoNuSeg's archives and the optional organs.csv; the data cannot be downloaded."""
    return (
        "MoNuSeg/TCGA nuclei: unpack MoNuSeg 2018's training archive (Tissue Images/*.tif, "
        f"Annotations/*.xml) and, for split=challenge, its test archive into {folder}/; any *.tif with a "
        f"same-named Aperio *.xml below {folder}/ is read. Optional {folder}/organs.csv (columns "
        "image,organ) overrides the organ read from each TCGA barcode. The data come from the MoNuSeg "
        "challenge site (registration) and cannot be downloaded automatically."
    )


def _organ_overrides(folder: Path) -> dict[str, str]:
    path = folder / "organs.csv"
    if not path.is_file():
        return {}
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"cannot read {path} ({e})") from e
    if not rows or not {"image", "organ"} <= set(rows[0][1]):
        raise DataError(f"{path} must have the columns image,organ (one row per tile)")
    overrides = {}
    for line, row in rows:
        image, organ = (row["image"] or "").strip(), (row["organ"] or "").strip().lower()
        if not image and not organ:
            continue  # an empty row, such as a spreadsheet's ",,"
        if not image or not organ:
            cells = ",".join(v for v in row.values() if isinstance(v, str))
            raise DataError(f"{path} line {line}: expected image,organ, got {cells!r}")
        overrides[Path(image).stem] = organ
    return overrides


def organ_of(name: str, overrides: dict[str, str]) -> str | None:
    """A tile's organ: from organs.csv when it names the tile, else from the tissue site of its TCGA barcode;
    None if neither."""
    if name in overrides:
        return overrides[name]
    parts = name.split("-")
    return TCGA_SITE_ORGAN.get(parts[1].upper()) if len(parts) > 1 and parts[0].upper() == "TCGA" else None


def find_tiles(folder: Path) -> dict[str, tuple[Path, Path]]:
    """{name: (image, annotation)} for every tile; a tile without its XML is an error. Hidden files and
    `__MACOSX/` folders are skipped (see `is_metadata`)."""
    if not folder.is_dir():
        raise DataError(f"MoNuSeg folder {folder} does not exist; expected {LAYOUT} in it")
    files = sorted(p for p in folder.rglob("*") if not is_metadata(p, folder) and p.is_file())
    images = [p for p in files if p.suffix.lower() in (".tif", ".tiff")]
    xmls = {p.stem: p for p in files if p.suffix.lower() == ".xml"}
    if not images:
        raise DataError(f"no *.tif tile under {folder}; expected {LAYOUT} there")
    for name in sorted({p.stem for p in images}):
        copies = [str(p) for p in images if p.stem == name]
        if len(copies) > 1:  # neither copy is known to be the one meant
            raise DataError(f"MoNuSeg tile {name} is found twice: {' and '.join(copies)}; keep one of them")
    missing = [f"{p.with_suffix('.xml')}" for p in images if p.stem not in xmls]
    if missing:
        raise DataError(
            f"MoNuSeg tiles without their Aperio XML annotation: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            + "; put each <name>.xml from MoNuSeg's Annotations folder below the folder"
        )
    return {p.stem: (p, xmls[p.stem]) for p in images}


def read_tile(name: str, paths: tuple[Path, Path], group: int) -> WholeImage:
    """One tile as a whole image, its instance map read from its Aperio XML annotation."""
    image = read_rgb(paths[0])
    return WholeImage(name, image, read_instances(paths[1], image.shape[1:]), group)


def _pick(names: list[str], count: int, prefer: frozenset[str], avoid: frozenset[str]) -> list[str]:
    """`count` names: the preferred ones first, then others by name, the avoided ones last."""
    ranked = sorted(names, key=lambda n: (0 if n in prefer else 2 if n in avoid else 1, n))
    return ranked[:count]


def cross_organ_split(
    organ_names: dict[str, list[str]], organs: tuple[str, ...], train_n: int, test_n: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per organ: test tiles (Kumar's first), then training tiles from the rest (Kumar's first). An organ
    with fewer than train_n + test_n tiles is split in the same proportion, with a log line."""
    train, test = {}, {}
    for organ in organs:
        names = sorted(organ_names.get(organ, []))
        if len(names) < 2:
            raise DataError(
                f"monuseg: organ {organ!r} has {len(names)} tile(s); the cross-organ split needs at least 2 "
                "(one to train, one to test). Check organs.csv or the organs option"
            )
        n_test, n_train = test_n, train_n
        if len(names) < train_n + test_n:
            n_test = min(len(names) - 1, max(1, round(len(names) * test_n / (train_n + test_n))))
            n_train = len(names) - n_test
            log.warning(
                "monuseg: organ %s has %d tiles, fewer than %d + %d; using %d for training, %d for testing",
                organ, len(names), train_n, test_n, n_train, n_test,
            )  # fmt: skip
        test[organ] = _pick(names, n_test, KUMAR_TEST, KUMAR_TRAIN)
        rest = [n for n in names if n not in test[organ]]
        train[organ] = _pick(rest, n_train, KUMAR_TRAIN, KUMAR_TEST)
    return train, test


def is_challenge_test(name: str, image: Path, folder: Path) -> bool:
    """Whether a tile belongs to the challenge's test set: by name, or by a "test" folder above it."""
    return name in CHALLENGE_TEST or any(
        "test" in part.lower() for part in image.relative_to(folder).parts[:-1]
    )


def load_tiles(
    folder: Path, split: str, organs: tuple[str, ...], train_n: int, test_n: int
) -> tuple[list[WholeImage], list[WholeImage], tuple[str, ...]]:
    """Whole training and test tiles and the group names (organs)."""
    tiles = find_tiles(folder)
    overrides = _organ_overrides(folder)
    organ = {name: organ_of(name, overrides) for name in tiles}
    unknown = sorted(n for n, o in organ.items() if o is None)
    if unknown:
        log.warning("monuseg: no organ known for %s; add them to organs.csv", ", ".join(unknown))
    if split == "cross-organ":
        by_organ: dict[str, list[str]] = {}
        for name, o in organ.items():
            by_organ.setdefault(o or "unknown", []).append(name)
        train, test = cross_organ_split(by_organ, organs, train_n, test_n)
        group = {o: i for i, o in enumerate(organs)}
        return (
            [read_tile(n, tiles[n], group[o]) for o in organs for n in train[o]],
            [read_tile(n, tiles[n], group[o]) for o in organs for n in test[o]],
            organs,
        )
    names = sorted({o or "unknown" for o in organ.values()})
    group = {o: i for i, o in enumerate(names)}
    train, test = [], []
    for name, paths in tiles.items():
        whole = read_tile(name, paths, group[organ[name] or "unknown"])
        (test if is_challenge_test(name, paths[0], folder) else train).append(whole)
    for wholes, what, where in (
        (test, "test", "MoNuSeg 2018's test archive (its 14 tiles, or tiles under a folder named *test*)"),
        (train, "training", "MoNuSeg 2018's training archive"),
    ):
        if not wholes:
            raise DataError(f"monuseg split=challenge: no {what} tile under {folder}; unpack {where} there")
    return train, test, tuple(names)


def load_monuseg(
    folder: Path,
    *,
    split: str = "cross-organ",
    organs: object = CROSS_ORGAN,
    train_per_organ: int = 4,
    test_per_organ: int = 2,
    patch_size: int = 256,
    stride: int | None = None,
    scale: float = 1.0,
) -> LoadedDataset:
    """Patches of `patch_size` every `stride` (default: patch_size, no overlap) at `scale` (1 = 40×)."""
    split = opt.choice(NAME, "split", split, SPLITS)
    organs = opt.name_list(NAME, "organs", organs)
    train_n = opt.positive_int(NAME, "train_per_organ", train_per_organ)
    test_n = opt.positive_int(NAME, "test_per_organ", test_per_organ)
    patching: Patching = patching_options(NAME, patch_size, stride, scale)
    train, test, groups = load_tiles(Path(folder), split, organs, train_n, test_n)
    return nuclei_dataset(NAME, train, test, patching, groups)
