"""BraTS 2018-2023 whole-tumour segmentation on 2D axial slices, with Chang et al.'s (2020) protocol.

Layouts read (the folder itself or one level below, e.g. `MICCAI_BraTS_2018_Data_Training/`; one release:
releases in several folders below are refused, as the subjects of one are in the others):
  2018/2019: `HGG/<subject>/<subject>_<modality>.nii.gz` and `LGG/<subject>/...`;
  2020:      `<subject>/<subject>_<modality>.nii.gz` plus `name_mapping.csv` (columns `Grade` and
             `BraTS_2020_subject_ID`), which says which subjects are HGG and which LGG;
  2021:      `BraTS2021_00000/BraTS2021_00000_<modality>.nii.gz`, no grades;
  2023:      `BraTS-GLI-00000-000/BraTS-GLI-00000-000-<t1n|t1c|t2w|t2f|seg>.nii.gz`, no grades.
Modalities are t1, t1ce, t2, flair (2023's t1n, t1c, t2w, t2f); the labels are `<subject>_seg` (uncompressed
`.nii` works too; a subject folder with no `_seg` file but exactly one file named like `*seg*.nii*`, as one
BraTS 2020 subject has, uses that one). The releases from 2021 on name no grade (nearly all are
high-grade gliomas): every subject is used, and `grades` must be left unset there.

Protocol (defaults): T2 of the HGG subjects, whole tumour = label > 0. The subjects sorted by name are
split as Chang et al.'s released code does: the first 40 are the test set, the next 170 the training
set. A folder with fewer than 210 subjects is split in the same 40:170 proportion (at least one test
subject), and a log line says so; subjects beyond 210 are left out, also logged. Training subjects are
ranked by tumour volume for the `natural` partition (Chang et al.'s size-sorted sites). Slices: those
with tumour (see `volumes.select_slices`); intensities: 0.5th-99.5th percentile of each volume's brain.
The 240×240 slices are resized to `image_size` (default 128 for CPU work; 240 keeps BraTS' grid; the
paper trains on 224×224 random crops of resized slices, which is augmentation, not part of the data).
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from fedistill.data.base import LoadedDataset
from fedistill.data.medical import options as opt
from fedistill.data.medical.slice_sets import SubjectSlices, slice_dataset, subject_slices
from fedistill.data.medical.volumes import SLICE_RULES, axial_slices, read_volume, scale_to_uint8
from fedistill.data.mri.split import brats_patient as patient_of
from fedistill.errors import DataError

log = logging.getLogger(__name__)

NAME = "brats"
MODALITIES = ("t1", "t1ce", "t2", "flair")
GRADES = ("hgg", "lgg")
#: the releases from 2021 on, which name no grade
UNGRADED = "ungraded"
#: BraTS 2023's file name for each modality (`BraTS-GLI-00000-000-t2w.nii.gz` is the T2)
NAMES_2023 = {"t1": "t1n", "t1ce": "t1c", "t2": "t2w", "flair": "t2f", "seg": "seg"}
INTENSITY_MODES = ("volume-percentile", "slice-max")
CHANG_TRAIN, CHANG_TEST = 170, 40
LAYOUT = (
    "BraTS 2018/2019: <folder>/HGG/<subject>/<subject>_t2.nii.gz and <subject>_seg.nii.gz (and LGG/...); "
    "BraTS 2020: <folder>/<subject>/<subject>_t2.nii.gz, <subject>_seg.nii.gz and <folder>/name_mapping.csv; "
    "BraTS 2021: <folder>/BraTS2021_00000/BraTS2021_00000_t2.nii.gz and _seg.nii.gz; "
    "BraTS 2023: <folder>/BraTS-GLI-00000-000/BraTS-GLI-00000-000-t2w.nii.gz and -seg.nii.gz"
)


def describe(folder: str) -> str:
    """Where to put the BraTS training data (2018-2023), as released; it cannot be downloaded."""
    return (
        f"BraTS 2018-2023 (brain tumour segmentation): put the training data under {folder}/, as released:\n"
        f"  {folder}/HGG/<subject>/<subject>_<t1|t1ce|t2|flair|seg>.nii.gz and {folder}/LGG/...\n"
        "  (2018, 2019),\n"
        f"  or {folder}/<subject>/<subject>_<...>.nii.gz with {folder}/name_mapping.csv (2020),\n"
        f"  or {folder}/BraTS2021_00000/BraTS2021_00000_t2.nii.gz and _seg.nii.gz (2021),\n"
        f"  or {folder}/BraTS-GLI-00000-000/BraTS-GLI-00000-000-<t1n|t1c|t2w|t2f|seg>.nii.gz (2023);\n"
        "  the release's own top folder (e.g. MICCAI_BraTS_2018_Data_Training/) may sit in between.\n"
        "  2021 and 2023 name no grades: every subject is used, and brats.grades stays unset.\n"
        "BraTS needs a registration with the challenge (CBICA Image Processing Portal, or Synapse from 2020 "
        "on) and cannot be downloaded automatically."
    )


def _modality_file(folder: Path, subject: str, modality: str) -> Path | None:
    for stem in (f"{subject}_{modality}", f"{subject}-{NAMES_2023[modality]}"):
        for suffix in (".nii.gz", ".nii"):
            path = folder / f"{stem}{suffix}"
            if path.is_file():
                return path
    if modality == "seg":
        odd = sorted(p for p in folder.glob("*.nii*") if "seg" in p.name.lower())
        if len(odd) == 1:
            return odd[0]
    return None


def _roots(folder: Path) -> list[Path]:
    """The folder and its subfolders: a release's own top folder may sit in between."""
    if not folder.is_dir():
        raise DataError(
            f"BraTS folder {folder} does not exist; expected the BraTS training data in it ({LAYOUT})"
        )
    return [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]


def _grade_folders(folder: Path) -> dict[str, dict[str, Path]]:
    """{grade: {subject: folder}} of the one release in `folder`, or in the one folder below it that holds a
    release (its own top folder); releases in several folders below are refused, not chosen among by name."""
    roots = _roots(folder)
    found = [(root, layout) for root in roots if (layout := _release(root)) is not None]
    if found and (found[0][0] == folder or len(found) == 1):
        return found[0][1]
    if found:
        raise DataError(
            f"BraTS releases in several folders under {folder}: {', '.join(str(r) for r, _ in found)}; brats "
            f"reads one. Move the others out of {folder}, or put BraTS 2018's HGG/ and LGG/ straight in "
            f"{folder}, which is read before any folder below it"
        )
    raise DataError(
        f"no BraTS subjects under {folder}: found neither HGG/ and LGG/ folders, nor name_mapping.csv (BraTS "
        f"2020 needs it for the grades), nor subject folders with a _seg file (2021, 2023); expected {LAYOUT}"
    )


def _release(root: Path) -> dict[str, dict[str, Path]] | None:
    """The subjects by grade of the release laid out in `root` itself (2018/2019's HGG/ and LGG/, 2020's
    name_mapping.csv, or 2021/2023's labelled subject folders), None if there is none."""
    by_grade = {g: root / g.upper() for g in GRADES if (root / g.upper()).is_dir()}
    if by_grade:
        return {g: {p.name: p for p in sorted(d.iterdir()) if p.is_dir()} for g, d in by_grade.items()}
    mapping = root / "name_mapping.csv"
    if mapping.is_file():
        return _from_name_mapping(root, mapping)
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    labelled = {p.name: p for p in folders if _modality_file(p, p.name, "seg")}
    if labelled and not any(name.startswith("BraTS20_") for name in labelled):
        return {UNGRADED: labelled}
    return None


def _from_name_mapping(root: Path, mapping: Path) -> dict[str, dict[str, Path]]:
    try:
        with mapping.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"cannot read {mapping} ({e})") from e
    if not rows or not {"Grade", "BraTS_2020_subject_ID"} <= set(rows[0][1]):
        raise DataError(f"{mapping} lacks the columns Grade and BraTS_2020_subject_ID")
    out: dict[str, dict[str, Path]] = {g: {} for g in GRADES}
    for line, row in rows:
        if row["Grade"] is None or row["BraTS_2020_subject_ID"] is None:
            raise DataError(
                f"{mapping} line {line}: expected a Grade and a BraTS_2020_subject_ID, got a row of "
                f"{sum(v is not None for k, v in row.items() if k is not None)} column(s); replace the file"
            )
        grade, subject = row["Grade"].strip().lower(), row["BraTS_2020_subject_ID"].strip()
        if grade in out and (root / subject).is_dir():
            out[grade][subject] = root / subject
    return out


def split_subjects(names: list[str], train: int, test: int) -> tuple[list[str], list[str]]:
    """Chang et al.'s split: names sorted, the first `test` for testing and the next `train` for training;
    fewer subjects than train + test are split in the same proportion. Scans of a test patient at other
    timepoints (BraTS 2023's `-001`, ...) are not trained on: no patient is in both sets."""
    names = sorted(names)
    if len(names) < 2:
        raise DataError(f"BraTS needs at least 2 subjects (one to train, one to test); found {len(names)}")
    if len(names) < train + test:
        wanted = (train, test)
        test = min(len(names) - 1, max(1, round(len(names) * test / (train + test))))
        train = len(names) - test
        log.warning(
            "brats: %d subjects found, fewer than the %d + %d asked for; split in the same proportion: "
            "%d for training, %d for testing",
            len(names),
            *wanted,
            train,
            test,
        )
    elif len(names) > train + test:
        log.info(
            "brats: %d subjects found; the last %d by name are not used",
            len(names),
            len(names) - train - test,
        )
    tested = {patient_of(n) for n in names[:test]}
    rest = [n for n in names[test:] if patient_of(n) not in tested]
    if len(rest) < len(names) - test:
        log.info(
            "brats: %d scans of the test patients' other timepoints are not used for training",
            len(names) - test - len(rest),
        )
    if not rest:
        raise DataError(
            f"BraTS: every scan after the {test} test subject(s) is of a test patient; no patient is left to "
            "train on. Lower brats.test_subjects or add subjects"
        )
    return rest[:train], names[:test]


def _subject(
    folder: Path, subject: str, modality: str, image_size: int, rule: str, intensity: str
) -> SubjectSlices:
    paths = {m: _modality_file(folder, subject, m) for m in (modality, "seg")}
    separator = "-" if subject.startswith("BraTS-") else "_"
    names = NAMES_2023 if separator == "-" else {m: m for m in NAMES_2023}
    missing = [f"{folder}/{subject}{separator}{names[m]}.nii.gz" for m, p in paths.items() if p is None]
    if missing:
        raise DataError(f"BraTS subject {subject} lacks {', '.join(missing)} (or .nii)")
    volume, zooms = read_volume(paths[modality])
    label, _ = read_volume(paths["seg"])
    if label.shape != volume.shape:
        raise DataError(f"{paths['seg']} has shape {label.shape} but {paths[modality]} has {volume.shape}")
    images, tumour = axial_slices(volume), axial_slices(label) > 0
    brain = images > 0
    scaled = scale_to_uint8(images, brain, intensity, str(paths[modality]))
    return subject_slices(subject, scaled, tumour, brain, (zooms[1], zooms[0], zooms[2]), rule, image_size)


def load_brats(
    folder: Path,
    *,
    modality: str = "t2",
    grades: object = None,
    image_size: int = 128,
    train_subjects: int = CHANG_TRAIN,
    test_subjects: int = CHANG_TEST,
    slices: str = "tumour",
    intensity: str = "volume-percentile",
) -> LoadedDataset:
    """BraTS as 2-D slices of one modality: the chosen grades' subjects (HGG unless `grades` says otherwise;
    every subject of a release without grades) split into train and test, their volumes cut into the slices
    the `slices` rule picks."""
    modality = opt.choice(NAME, "modality", modality, MODALITIES)
    wanted = ("hgg",) if grades is None else opt.name_list(NAME, "grades", grades, GRADES)
    image_size = opt.positive_int(NAME, "image_size", image_size, minimum=8)
    train_subjects = opt.positive_int(NAME, "train_subjects", train_subjects)
    test_subjects = opt.positive_int(NAME, "test_subjects", test_subjects)
    rule = opt.choice(NAME, "slices", slices, SLICE_RULES)
    intensity = opt.choice(NAME, "intensity", intensity, INTENSITY_MODES)
    by_grade = _grade_folders(Path(folder))
    if UNGRADED in by_grade:
        if grades is not None:
            raise DataError(
                f"the BraTS release under {folder} names no grades (2021 and later); leave brats.grades "
                "unset to use every subject"
            )
        wanted = (UNGRADED,)
    subjects = {name: path for g in wanted for name, path in by_grade.get(g, {}).items()}
    if not subjects:
        grades = "/".join(g.upper() for g in wanted)
        raise DataError(f"no {grades} subjects under {folder}; expected {LAYOUT}")
    train_names, test_names = split_subjects(list(subjects), train_subjects, test_subjects)

    def build(names: list[str]) -> list[SubjectSlices]:
        return [_subject(subjects[n], n, modality, image_size, rule, intensity) for n in names]

    return slice_dataset(NAME, build(train_names), build(test_names), image_size)
