"""A medical or MRI dataset pointed at a missing or empty folder fails with one line (a DataError): which
folder, and what was expected in it. The full which-files-go-where text stays in each dataset's describe
(the datasets reference page), not in the error."""

import pytest

from fedistill.cli import main
from fedistill.data import mri
from fedistill.data.registry import DATASETS, load_dataset
from fedistill.errors import DataError

#: Every medical and MRI dataset that reads files (mni152-t1 and mni152-synthetic-lesions need none).
FILE_DATASETS = (
    "brats",
    "monuseg",
    "cpm17",
    "tnbc",
    "nuclei-cross-site",
    "brats-synthetic-lesions",
    "brain-lesions-real",
    "nuclei-synthetic-sites",
    "fastmri-brain",
    "ixi",
    "brats-mri",
    "mri-cross-site",
    "brain-t1-sites",
    "nifti-folder",
)

#: Folders that exist but hold nothing a loader can read, one level further in.
NESTED_EMPTY = {
    "brats": ("brats/HGG", "brats/LGG"),
    "cpm17": ("cpm17/train/Images",),
    "fastmri-brain": ("fastmri/train", "fastmri/val"),
    "brats-mri": ("brats/MICCAI_BraTS2020_TrainingData",),
    "nuclei-cross-site": ("cpm17", "monuseg", "tnbc"),
    "mri-cross-site": ("fastmri", "brats", "ixi"),
    "nifti-folder": ("imagesTr", "labelsTr"),
}


def _one_line_error(name: str, data_dir) -> str:
    with pytest.raises(DataError) as err:
        load_dataset(name, data_dir)
    message = str(err.value)
    assert "\n" not in message, message
    assert "expected" in message, message
    return message


def test_every_mri_dataset_with_files_is_covered():
    assert {name for name, entry in mri.ENTRIES.items() if entry.subdir is not None} <= set(FILE_DATASETS)
    assert all(DATASETS[name].subdir is not None for name in FILE_DATASETS)


@pytest.mark.parametrize("name", FILE_DATASETS)
def test_a_missing_folder_is_one_line(tmp_path, name):
    folder = tmp_path / DATASETS[name].subdir
    message = _one_line_error(name, tmp_path)
    assert str(folder) in message


@pytest.mark.parametrize("name", FILE_DATASETS)
def test_an_empty_folder_is_one_line(tmp_path, name):
    folder = tmp_path / DATASETS[name].subdir
    folder.mkdir(parents=True, exist_ok=True)
    message = _one_line_error(name, tmp_path)
    assert str(folder) in message


@pytest.mark.parametrize("name", sorted(NESTED_EMPTY))
def test_empty_subfolders_are_one_line(tmp_path, name):
    for sub in NESTED_EMPTY[name]:
        (tmp_path / sub).mkdir(parents=True)
    message = _one_line_error(name, tmp_path)
    assert str(tmp_path) in message


def test_the_command_line_prints_the_one_line_and_exits_2(tmp_path, capsys):
    (tmp_path / "ixi").mkdir()
    places = ["--data-dir", str(tmp_path), "--out", str(tmp_path / "runs"), "--quiet"]
    code = main(["run", "--dataset", "ixi", *places, "--algorithm", "fedavg", "--rounds", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == [err], err
    assert err.startswith("fedistill: error: no IXI T1 files") and "IXI002-Guys-0828-T1.nii.gz" in err


def test_a_monuseg_tile_found_twice_is_named_instead_of_one_copy_read_silently(tmp_path):
    """The same tile name in two folders below monuseg/ (a release unpacked twice, a copy beside the
    original) would have kept one of them silently; neither is known to be the one meant."""
    from fedistill.data.medical.monuseg import find_tiles

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "TCGA-1.tif").write_bytes(b"")
        (tmp_path / folder / "TCGA-1.xml").write_text("<Annotations/>")
    with pytest.raises(DataError, match=r"MoNuSeg tile TCGA-1 is found twice: .*a/TCGA-1.tif.*b/TCGA-1.tif"):
        find_tiles(tmp_path)


@pytest.mark.parametrize(
    ("name", "value"), [("brats-mri", 2), ("brats-mri", "x"), ("ixi", 0.0), ("ixi", True)]
)
def test_a_wrong_test_fraction_names_its_dataset_before_any_file_is_read(tmp_path, capsys, name, value):
    """An MRI loader's test_fraction error names the dataset, as every dataset option's error does, and
    comes before the missing files are looked for."""
    argv = ["run", "--dry-run", "--dataset", name, "--model", "unet-fastmri", "--algorithm", "fedavg"]
    argv += ["--data-dir", str(tmp_path), "--set", f"{name}.test_fraction={value!r}".replace("True", "true")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fedistill: error: {name} option test_fraction must be a number in (0, 1), got {value!r}"
