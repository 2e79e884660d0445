"""The medical segmentation datasets: loaders on small files written here in each dataset's real format,
the semi-synthetic stand-ins, and patching/stitching."""

from __future__ import annotations

import logging
import re
import shutil

import nibabel as nib
import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from scipy.io import savemat

from conftest import SHARED_DATA
from fedistill.data.medical import brain_synthetic, lesions
from fedistill.data.medical.aperio import read_instances
from fedistill.data.medical.brats import split_subjects
from fedistill.data.medical.nuclei_sets import read_rgb
from fedistill.data.medical.patches import (
    extract_patches,
    patch_starts,
    relabel,
    stitch,
    stitch_by_meta,
    stitch_instances,
)
from fedistill.data.medical.volumes import read_volume
from fedistill.data.registry import dataset_names, describe_files, load_dataset
from fedistill.errors import ConfigError, DataError

BRAIN_MRI = SHARED_DATA / "brain-mri"
NUCLEI = SHARED_DATA / "nuclei"

# --------------------------------------------------------------------------------------------------
# patching and stitching


@pytest.mark.parametrize(
    ("shape", "size", "stride"),
    [
        ((3, 37, 50), 16, 16),
        ((3, 37, 50), 16, 10),
        ((1, 64, 64), 64, 64),
        ((3, 10, 12), 16, 8),
        ((2, 33, 16), 16, 5),
    ],
)
def test_stitch_undoes_patching_exactly(shape, size, stride):
    image = np.random.default_rng(0).integers(0, 256, size=shape).astype(np.uint8)
    patches, rows, cols = extract_patches(image, size, stride)
    assert patches.shape[1:] == (shape[0], size, size)
    assert rows.max() + size >= shape[1] or shape[1] < size
    whole = stitch(torch.from_numpy(patches).float(), rows, cols, shape[1], shape[2])
    np.testing.assert_array_equal(whole, image)
    if shape[1] < size:  # padded with zeros at the bottom
        assert (patches[0, :, shape[1] :, :] == 0).all()


def test_patch_starts_cover_the_image_and_end_flush():
    assert patch_starts(100, 32, 32) == [0, 32, 64, 68]
    assert patch_starts(64, 32, 16) == [0, 16, 32]
    assert patch_starts(10, 32, 16) == [0]


def test_stitch_by_meta_and_instances_rebuild_whole_images():
    rng = np.random.default_rng(1)
    images = [rng.random((2, 20, 27)), rng.random((2, 9, 9))]
    instances = [rng.integers(0, 5, (20, 27)), rng.integers(0, 3, (9, 9))]
    values, ids, meta = [], [], {k: [] for k in ("subject", "row", "col", "height", "width")}
    for s, (x, y) in enumerate(zip(images, instances, strict=True)):
        p, r, c = extract_patches(x, 8, 6)
        q, _, _ = extract_patches(y, 8, 6)
        values.append(p)
        ids.append(q)
        for key, v in (("subject", s), ("row", r), ("col", c), ("height", x.shape[1]), ("width", x.shape[2])):
            meta[key].append(np.broadcast_to(np.asarray(v), r.shape))
    meta = {k: np.concatenate(v) for k, v in meta.items()}
    wholes = stitch_by_meta(np.concatenate(values), meta)
    maps = stitch_instances(np.concatenate(ids), meta)
    for s in range(2):
        np.testing.assert_allclose(wholes[s], images[s])
        np.testing.assert_array_equal(maps[s], instances[s])
    np.testing.assert_array_equal(relabel(np.array([[0, 7, 7], [3, 0, 9]])), [[0, 2, 2], [1, 0, 3]])


# --------------------------------------------------------------------------------------------------
# BraTS


def _nifti(path, data, spacing=10.0):
    nib.save(nib.Nifti1Image(np.asarray(data), np.diag([spacing, spacing, spacing, 1.0])), str(path))


def _brats_subject(folder, name, cube, suffix=".nii.gz", seg_name=None, names=None):
    """A 24×24×8 volume of 10 mm voxels (BraTS' 240 mm field of view) with a tumour cube of side `cube`;
    `names` maps the modalities to another release's file names (BraTS 2023: {"t2": "-t2w", ...})."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(cube)
    yy, xx = np.mgrid[:24, :24]
    disk = (yy - 12) ** 2 + (xx - 12) ** 2 < 100
    volume = np.where(disk[:, :, None], 100 + rng.random((24, 24, 8)) * 50, 0).astype(np.float32)
    seg = np.zeros((24, 24, 8), np.uint8)
    seg[8 : 8 + cube, 8 : 8 + cube, 2 : 2 + cube] = 2
    seg[8, 8, 2] = 4  # any label > 0 is whole tumour
    names = names or {m: f"_{m}" for m in ("t1", "t1ce", "t2", "flair", "seg")}
    for modality in ("t1", "t1ce", "t2", "flair"):
        _nifti(folder / f"{name}{names[modality]}{suffix}", volume * (2 if modality == "t2" else 1))
    _nifti(folder / (seg_name or f"{name}{names['seg']}{suffix}"), seg)


def test_brats_2018_layout_split_groups_and_meta(tmp_path, caplog):
    cubes = {"Brats18_A_1": 3, "Brats18_B_1": 1, "Brats18_C_1": 4, "Brats18_D_1": 2, "Brats18_E_1": 5}
    for name, cube in cubes.items():
        _brats_subject(tmp_path / "brats" / "HGG" / name, name, cube)
    _brats_subject(tmp_path / "brats" / "LGG" / "Brats18_L_1", "Brats18_L_1", 2)
    with caplog.at_level(logging.WARNING):
        data = load_dataset("brats", tmp_path, image_size=24, slices="brain")
    assert "same proportion" in caplog.text  # 5 subjects: 4 train + 1 test, not 170 + 40
    assert data.info.task == "semantic-segmentation" and data.info.num_classes == 2
    assert data.train.x.dtype == torch.uint8 and data.train.x.shape[1:] == (1, 24, 24)
    assert data.train.y.dtype == torch.int64 and set(data.train.y.unique().tolist()) == {0, 1}
    # the first subject by name is the test set; the others are ranked by tumour size
    assert data.group_names == ("Brats18_B_1", "Brats18_D_1", "Brats18_C_1", "Brats18_E_1")
    assert len(data.test) == 8 and set(data.test_meta["subject"].tolist()) == {0}
    assert data.test_meta["slice"].tolist() == list(range(8))
    tumour = [int(data.train.y[data.train_groups == g].sum()) for g in range(4)]
    assert tumour == [1, 2**3, 4**3, 5**3]  # the training subjects' cubes, smallest first

    tumour_only = load_dataset(
        "brats", tmp_path, image_size=24, grades="HGG,LGG", train_subjects=3, test_subjects=2
    )
    assert len(tumour_only.group_names) == 3 and bool((tumour_only.train.y.flatten(1).sum(1) > 0).all())
    assert tumour_only.test_meta["subject"].max() == 1  # Brats18_A_1 and Brats18_B_1
    # 20 mm = 2 slices either side of Brats18_A_1's tumour (slices 2..4)
    margin = load_dataset("brats", tmp_path, image_size=16, slices="margin")
    assert margin.test_meta["slice"].tolist() == list(range(7))


def test_brats_2020_layout_with_name_mapping(tmp_path):
    root = tmp_path / "brats" / "MICCAI_BraTS2020_TrainingData"
    _brats_subject(root / "BraTS20_Training_001", "BraTS20_Training_001", 2, suffix=".nii")
    _brats_subject(
        root / "BraTS20_Training_002", "BraTS20_Training_002", 3, seg_name="W39_1998.09.19_Segm.nii"
    )
    _brats_subject(root / "BraTS20_Training_003", "BraTS20_Training_003", 1)
    (root / "name_mapping.csv").write_text(
        "Grade,BraTS_2019_subject_ID,BraTS_2020_subject_ID\n"
        "HGG,a,BraTS20_Training_001\nHGG,b,BraTS20_Training_002\nLGG,c,BraTS20_Training_003\n"
    )
    data = load_dataset("brats", tmp_path, image_size=24, modality="flair", intensity="slice-max")
    assert data.group_names == ("BraTS20_Training_002",) and len(data.test) > 0
    assert int(data.train.x.max()) == 255  # each slice scaled by its own maximum


BRATS_2023 = {"t1": "-t1n", "t1ce": "-t1c", "t2": "-t2w", "flair": "-t2f", "seg": "-seg"}


@pytest.mark.parametrize("release", ["2021", "2023"])
def test_brats_2021_and_2023_layouts_use_every_subject(tmp_path, release):
    """The releases from 2021 on name no grade and 2023 renamed the files; both read as 2018's do."""
    root = tmp_path / "brats" / f"BraTS{release}_TrainingData"
    cubes = {1: 3, 2: 1, 3: 4}
    for i, cube in cubes.items():
        name = f"BraTS2021_{i:05d}" if release == "2021" else f"BraTS-GLI-{i:05d}-000"
        _brats_subject(root / name, name, cube, names=BRATS_2023 if release == "2023" else None)
    data = load_dataset("brats", tmp_path, image_size=24, slices="brain")
    assert len(data.group_names) == 2 and set(data.test_meta["subject"].tolist()) == {0}
    tumour = sorted(int(data.train.y[data.train_groups == g].sum()) for g in range(2))
    assert tumour == [1**3, 4**3]  # subject 1 (cube 3), the first by name, is the test subject
    with pytest.raises(DataError, match=r"names no grades.*leave brats\.grades unset"):
        load_dataset("brats", tmp_path, image_size=24, grades="hgg")
    first = sorted(root.iterdir())[1]
    expected = f"{first.name}_t2.nii.gz" if release == "2021" else f"{first.name}-t2w.nii.gz"
    (first / expected).unlink()
    with pytest.raises(DataError, match=re.escape(expected)):
        load_dataset("brats", tmp_path, image_size=24)
    assert len(load_dataset("brats", tmp_path, image_size=24, modality="t1").group_names) == 2


def test_two_brats_releases_each_in_its_own_folder_are_refused_not_picked_by_name(tmp_path):
    """BraTS 2018 for segmentation and 2020 for reconstruction both go under brats/; unpacked there in their
    own top folders, segmentation read 2020 (its folder sorts first) instead of the 2018 its configs name."""
    brats = tmp_path / "brats"
    for i in (1, 2):
        name = f"Brats18_2013_{i}_1"
        _brats_subject(brats / "MICCAI_BraTS_2018_Data_Training" / "HGG" / name, name, 2)
        name = f"BraTS20_Training_00{i}"
        _brats_subject(brats / "MICCAI_BraTS2020_TrainingData" / name, name, 3)
    (brats / "MICCAI_BraTS2020_TrainingData" / "name_mapping.csv").write_text(
        "Grade,BraTS_2020_subject_ID\nHGG,BraTS20_Training_001\nHGG,BraTS20_Training_002\n"
    )
    with pytest.raises(DataError, match=r"MICCAI_BraTS2020_TrainingData.*MICCAI_BraTS_2018_Data_Training"):
        load_dataset("brats", tmp_path, image_size=24)
    # BraTS 2018's HGG/ straight in brats/ is the segmentation set's, whatever else is below it
    (brats / "MICCAI_BraTS_2018_Data_Training" / "HGG").rename(brats / "HGG")
    data = load_dataset("brats", tmp_path, image_size=24)
    assert data.group_names == ("Brats18_2013_2_1",)


def test_brats_2020_without_its_name_mapping_is_refused(tmp_path):
    """2020 subjects are HGG and LGG; without name_mapping.csv the grades are unknown, not ungraded."""
    root = tmp_path / "brats" / "MICCAI_BraTS2020_TrainingData"
    for i in (1, 2):
        _brats_subject(root / f"BraTS20_Training_00{i}", f"BraTS20_Training_00{i}", 2)
    with pytest.raises(DataError, match=r"name_mapping\.csv"):
        load_dataset("brats", tmp_path, image_size=24)


def test_brats_missing_files_and_bad_options(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("brats", tmp_path)
    _brats_subject(tmp_path / "brats" / "HGG" / "S1", "S1", 2)
    _brats_subject(tmp_path / "brats" / "HGG" / "S2", "S2", 2)
    (tmp_path / "brats" / "HGG" / "S2" / "S2_seg.nii.gz").unlink()
    with pytest.raises(DataError, match=r"S2_seg\.nii\.gz"):
        load_dataset("brats", tmp_path, image_size=16)
    with pytest.raises(ConfigError, match="modality"):
        load_dataset("brats", tmp_path, modality="t3")
    with pytest.raises(ConfigError, match="grades"):
        load_dataset("brats", tmp_path, grades="GBM")
    with pytest.raises(ConfigError, match="does not take"):
        load_dataset("brats", tmp_path, colour=1)


# --------------------------------------------------------------------------------------------------
# nuclei: MoNuSeg/TCGA, CPM-17, TNBC, cross-site


def _aperio(squares) -> str:
    regions = "".join(
        f'<Region Id="{i}" Type="0"><Attributes/><Vertices>'
        + "".join(
            f'<Vertex X="{x}" Y="{y}" Z="0"/>' for x, y in ((c, r), (c + s, r), (c + s, r + s), (c, r + s))
        )
        + "</Vertices></Region>"
        for i, (r, c, s) in enumerate(squares, start=1)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<Annotations MicronsPerPixel="0.25"><Annotation Id="1"><Regions>'
        '<RegionAttributeHeaders><AttributeHeader Id="9999" Name="Region"/></RegionAttributeHeaders>'
        f"{regions}</Regions><Plots/></Annotation></Annotations>"
    )


def _tile(folder, name, squares, annotations=None):
    folder.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(len(name)).integers(100, 200, (40, 40, 3)).astype(np.uint8)
    tifffile.imwrite(folder / f"{name}.tif", rgb, photometric="rgb")
    (annotations or folder).mkdir(parents=True, exist_ok=True)
    ((annotations or folder) / f"{name}.xml").write_text(_aperio(squares))


MONUSEG_TILES = {  # name: organ by its tissue source site
    "TCGA-A7-A13E-01Z-00-DX1": "breast",
    "TCGA-E2-A1B5-01Z-00-DX1": "breast",  # Kumar et al.'s test tile
    "TCGA-AR-A1AK-01Z-00-DX1": "breast",
    "TCGA-B0-5711-01Z-00-DX1": "kidney",
    "TCGA-B0-5698-01Z-00-DX1": "kidney",  # Kumar et al.'s test tile
}


def _monuseg(root):
    for name in MONUSEG_TILES:
        _tile(root / "Tissue Images", name, [(4, 4, 6), (20, 25, 8), (30, 30, 12)], root / "Annotations")
    _tile(root / "MoNuSegTestData", "TCGA-AC-A2FO-01A-01-TS1", [(5, 5, 5)])


def test_aperio_outlines_become_instances(tmp_path):
    path = tmp_path / "a.xml"
    path.write_text(_aperio([(4, 4, 6), (20, 25, 8), (6, 8, 4)]))  # the third overlaps the first
    instances = read_instances(path, (40, 40))
    assert instances.dtype == np.int64 and instances.max() == 3
    assert instances[7, 5] == 1 and instances[24, 29] == 2 and instances[8, 10] == 3
    assert 30 <= (instances == 2).sum() <= 81


def test_monuseg_cross_organ_split_groups_and_stitching(tmp_path):
    _monuseg(tmp_path / "monuseg")
    data = load_dataset(
        "tcga",
        tmp_path,
        organs="breast,kidney",
        train_per_organ=1,
        test_per_organ=1,
        patch_size=16,
        stride=12,
    )
    assert data.info.task == "instance-segmentation" and data.info.channels == 3
    assert data.group_names == ("breast", "kidney")
    assert data.train.x.shape[1:] == (3, 16, 16) and data.train.x.dtype == torch.uint8
    patches_per_tile = len(patch_starts(40, 16, 12)) ** 2
    assert len(data.train) == len(data.test) == 2 * patches_per_tile
    assert (
        np.bincount(data.train_groups).tolist()
        == np.bincount(data.test_groups).tolist()
        == [patches_per_tile] * 2
    )
    for y in data.train.y:  # ids 1..n per patch
        ids = y.unique().tolist()
        assert ids == list(range(len(ids)))
    # Kumar et al.'s test tiles are the test set: stitching gives back each whole tile and instance map
    maps = stitch_instances(data.test_meta["image_instances"], data.test_meta)
    wholes = stitch_by_meta(data.test.x.float(), data.test_meta)
    first = tifffile.imread(tmp_path / "monuseg" / "Tissue Images" / "TCGA-E2-A1B5-01Z-00-DX1.tif")
    np.testing.assert_array_equal(wholes[0], first.transpose(2, 0, 1))
    expected = read_instances(tmp_path / "monuseg" / "Annotations" / "TCGA-E2-A1B5-01Z-00-DX1.xml", (40, 40))
    np.testing.assert_array_equal(maps[0], expected)
    assert data.test_meta["height"].tolist() == [40] * len(data.test)


def test_monuseg_organs_csv_scale_challenge_split_and_missing_xml(tmp_path, caplog):
    root = tmp_path / "monuseg"
    _monuseg(root)
    (root / "organs.csv").write_text("image,organ\nTCGA-AR-A1AK-01Z-00-DX1.tif,kidney\n")
    data = load_dataset(
        "monuseg", tmp_path, organs=["kidney"], train_per_organ=2, test_per_organ=1, patch_size=20
    )
    assert data.group_names == ("kidney",) and len(data.train) == 2 * 4 and len(data.test) == 4
    with caplog.at_level(logging.WARNING):
        load_dataset("monuseg", tmp_path, organs="breast", patch_size=40)  # 3 tiles (AC is breast) for 4 + 2
    assert "using 2 for training, 1 for testing" in caplog.text
    half = load_dataset("monuseg", tmp_path, split="challenge", patch_size=20, scale=0.5)
    assert len(half.test) == 1 and len(half.train) == 5  # 20×20 after scaling: one patch per tile
    assert half.group_names == ("breast", "kidney")  # AC: breast (test); AR: kidney by organs.csv
    (root / "Annotations" / "TCGA-B0-5711-01Z-00-DX1.xml").unlink()
    with pytest.raises(DataError, match=r"TCGA-B0-5711-01Z-00-DX1\.xml"):
        load_dataset("monuseg", tmp_path)
    with pytest.raises(ConfigError, match="split"):
        load_dataset("monuseg", tmp_path, split="random")


def _cpm17(root):
    for split, count in (("train", 2), ("test", 1)):
        for i in range(count):
            (root / split / "Images").mkdir(parents=True, exist_ok=True)
            (root / split / "Labels").mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((30, 34, 3), 50 * i + 60, np.uint8)).save(
                root / split / "Images" / f"image_{i:02d}.png"
            )
            inst = np.zeros((30, 34), np.int32)
            inst[2:8, 2:9], inst[20:28, 25:33] = 5, 9  # ids need not be consecutive in the files
            savemat(root / split / "Labels" / f"image_{i:02d}.mat", {"inst_map": inst, "type_map": inst > 0})


def test_cpm17_reads_png_and_mat_instance_maps(tmp_path):
    _cpm17(tmp_path / "cpm17")
    data = load_dataset("cell17", tmp_path, patch_size=16, stride=16)
    assert data.group_names == ("cpm17",) and data.train.x.shape[1:] == (3, 16, 16)
    assert len(data.train) == 2 * len(data.test) == 2 * 2 * 3
    maps = stitch_instances(data.test_meta["image_instances"], data.test_meta)
    assert maps[0].max() == 2 and maps[0][3, 3] == 1 and maps[0][21, 26] == 2
    (tmp_path / "cpm17" / "test" / "Labels" / "image_00.mat").unlink()
    with pytest.raises(DataError, match=r"image_00\.mat"):
        load_dataset("cpm17", tmp_path)


def _tnbc(root, patients=3):
    for p in range(1, patients + 1):
        for folder in (f"Slide_{p:02d}", f"GT_{p:02d}"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(2):
            Image.fromarray(np.full((24, 24, 4), 80 + p, np.uint8)).save(
                root / f"Slide_{p:02d}" / f"{p:02d}_{i}.png"
            )
            mask = np.zeros((24, 24), np.uint8)
            mask[2:6, 2:6] = mask[6:9, 6:9] = 255  # touching at a corner: one instance (8-connectivity)
            mask[15:20, 15:20] = 255
            Image.fromarray(mask).save(root / f"GT_{p:02d}" / f"{p:02d}_{i}.png")


def test_tnbc_patients_split_and_connected_components(tmp_path):
    _tnbc(tmp_path / "tnbc")
    data = load_dataset("tnbc", tmp_path, patch_size=24)
    assert data.group_names == ("Slide_01", "Slide_02", "Slide_03")
    assert data.train_groups.tolist() == [0, 0, 1, 1] and data.test_groups.tolist() == [2, 2]
    assert data.train.x.shape == (4, 3, 24, 24) and int(data.train.y[0].max()) == 2
    chosen = load_dataset("tnbc", tmp_path, patch_size=24, test_slides=[1])
    assert chosen.test_groups.tolist() == [0, 0]
    with pytest.raises(ConfigError, match="test_slides"):
        load_dataset("tnbc", tmp_path, test_slides=[7])
    (tmp_path / "tnbc" / "GT_02" / "02_1.png").unlink()
    with pytest.raises(DataError, match=r"GT_02/02_1\.png"):
        load_dataset("tnbc", tmp_path)


def test_tnbc_unzipped_as_released_is_found_in_its_top_folder(tmp_path):
    """The release's zip unpacks into TNBC_NucleiSegmentation/ (beside a __MACOSX folder)."""
    _tnbc(tmp_path / "tnbc" / "TNBC_NucleiSegmentation")
    (tmp_path / "tnbc" / "__MACOSX").mkdir()
    data = load_dataset("tnbc", tmp_path, patch_size=24)
    assert data.group_names == ("Slide_01", "Slide_02", "Slide_03") and data.train.x.shape == (4, 3, 24, 24)


def test_malformed_label_and_volume_files_stop_with_a_line_naming_them(tmp_path):
    """A truncated .mat (scipy's MatReadError, or IndexError within the header), an inst_map with negative or
    NaN ids and a NIfTI header with an unknown datatype (nibabel's HeaderDataError) are DataErrors that name
    the file, not tracebacks."""
    _cpm17(tmp_path / "cpm17")
    (tmp_path / "cpm17" / "train" / "Labels" / "image_00.mat").write_bytes(b"")
    with pytest.raises(DataError, match=r"image_00\.mat"):
        load_dataset("cpm17", tmp_path)
    label = tmp_path / "cpm17" / "train" / "Labels" / "image_00.mat"
    savemat(label, {"inst_map": np.zeros((16, 16))})
    label.write_bytes(label.read_bytes()[:100])  # cut short inside the 128-byte MATLAB header
    with pytest.raises(DataError, match=r"cannot read MATLAB file .*image_00\.mat"):
        load_dataset("cpm17", tmp_path)
    for bad, found in ((-1.0, r"-1\.\.0"), (np.nan, r"0\.\.0 and NaN")):
        savemat(label, {"inst_map": np.where(np.eye(16, dtype=bool), bad, 0.0)})
        with pytest.raises(
            DataError, match=rf"image_00\.mat: inst_map must hold instance ids >= 0 .*got {found}"
        ):
            load_dataset("cpm17", tmp_path)
    volume = tmp_path / "bad.nii"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.float32), np.eye(4)), volume)
    raw = bytearray(volume.read_bytes())
    raw[70:72] = (77).to_bytes(2, "little")  # the datatype code: not one NIfTI defines
    volume.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"bad\.nii"):
        read_volume(volume)


def test_a_brats_volume_with_nan_voxels_is_a_data_error_naming_it(tmp_path):
    """NaN voxels (a float volume resampled by some tool) were scaled to 0 in silence: black pixels in the
    scan, or background in the label map, with a percentile or slice maximum taken around them."""
    for name in ("S1", "S2"):
        _brats_subject(tmp_path / "brats" / "HGG" / name, name, 2)
    path = tmp_path / "brats" / "HGG" / "S2" / "S2_t2.nii.gz"
    volume = np.asarray(nib.load(path).dataobj, dtype=np.float32)
    volume[12, 12, 3] = np.nan
    _nifti(path, volume)
    with pytest.raises(DataError, match=r"S2_t2\.nii\.gz.*NaN"):
        load_dataset("brats", tmp_path, image_size=16)


def test_a_compressed_tiff_tile_is_read(tmp_path):
    """LZW-compressed TIFFs need a codec tifffile does not ship; Pillow reads them."""
    tile = np.random.default_rng(0).integers(0, 255, (12, 10, 3), dtype=np.uint8)
    path = tmp_path / "tile.tif"
    Image.fromarray(tile).save(path, compression="tiff_lzw")
    assert read_rgb(path).shape == (3, 12, 10)
    assert np.array_equal(read_rgb(path), tile.transpose(2, 0, 1))


def test_a_tiff_cut_short_in_its_header_is_a_data_error(tmp_path):
    path = tmp_path / "tile.tif"
    tifffile.imwrite(path, np.zeros((4, 4, 3), np.uint8))
    path.write_bytes(path.read_bytes()[:5])  # byte order, magic and half the first IFD's offset
    with pytest.raises(DataError, match=r"cannot read image .*tile\.tif"):
        read_rgb(path)


@pytest.mark.parametrize("compression", [None, "tiff_lzw"])
def test_a_tiff_cut_short_before_its_directory_is_a_data_error(tmp_path, compression):
    """libtiff and Pillow write a TIFF's image directory after its pixels, so a file cut short anywhere has
    no image directory left: reading its first page ended in an IndexError traceback."""
    path = tmp_path / "tile.tif"
    tile = np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    Image.fromarray(tile).save(path, compression=compression)
    assert np.array_equal(read_rgb(path), tile.transpose(2, 0, 1))
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(DataError, match=r"cannot read image .*tile\.tif"):
        read_rgb(path)


def test_a_deflate_tiff_cut_short_in_its_pixels_is_a_data_error(tmp_path):
    """A Deflate (zlib) TIFF cut short inside its compressed pixels ended in a bare zlib.error traceback."""
    path = tmp_path / "tile.tif"
    tile = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    tifffile.imwrite(path, tile, compression="zlib")
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])
    with pytest.raises(DataError, match=r"cannot read image .*tile\.tif"):
        read_rgb(path)


@pytest.mark.parametrize("length", [5, 200])
def test_a_cut_short_nuclei_synthetic_tiff_is_a_data_error(tmp_path, length):
    """The semi-synthetic nuclei's TIFFs cut short (in the header: struct.error; in Deflate pixels:
    zlib.error) ended in a traceback."""
    folder = tmp_path / "nuclei"
    folder.mkdir()
    grey = np.random.default_rng(0).integers(0, 60000, (32, 32), dtype=np.uint16)
    tifffile.imwrite(folder / "fluorescence_image.tif", grey)
    tifffile.imwrite(folder / "fluorescence_instances.tif", grey, compression="zlib")
    cut = folder / "fluorescence_instances.tif"
    cut.write_bytes(cut.read_bytes()[:length])
    with pytest.raises(DataError, match=r"cannot read"):
        load_dataset("nuclei-synthetic-sites", tmp_path)


def test_cross_site_one_group_per_source(tmp_path):
    _cpm17(tmp_path / "cpm17")
    _monuseg(tmp_path / "monuseg")
    _tnbc(tmp_path / "tnbc")
    data = load_dataset("nuclei-cross-site", tmp_path, patch_size=24)
    assert data.group_names == ("cpm17", "tcga", "tnbc")
    assert set(data.train_groups.tolist()) == set(data.test_groups.tolist()) == {0, 1, 2}
    subjects = data.test_meta["subject"]
    assert len(np.unique(subjects)) == 1 + 1 + 2  # whole test images, numbered across the sources
    with pytest.raises(DataError, match="cpm17"):
        load_dataset("nuclei-cross-site", tmp_path / "tnbc")


# --------------------------------------------------------------------------------------------------
# semi-synthetic stand-ins


def test_lesions_stay_inside_the_brain():
    zz, yy, xx = np.mgrid[:30, :30, :30]
    brain = (zz - 15) ** 2 + (yy - 15) ** 2 + (xx - 15) ** 2 < 144
    volume = np.where(brain, 0.5, 0.0).astype(np.float32)
    from scipy import ndimage

    depth = ndimage.distance_transform_edt(brain)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        painted, mask = lesions.paint_lesion(volume, brain, depth, 2.0, lesions.draw_look(rng), rng)
        assert mask.any() and not (mask & ~brain).any()
        assert (painted[~brain] == 0).all() and painted[mask].mean() > 0.7  # brighter than the host


def test_mni152_synthetic_needs_no_files_and_is_deterministic():
    options = {"image_size": 32, "train_subjects": 6, "test_subjects": 2}
    first = load_dataset("mni152-synthetic-lesions", **options)
    again = load_dataset("mni152-synthetic-lesions", **options)
    other = load_dataset("mni152-synthetic-lesions", seed=1, **options)
    assert torch.equal(first.train.x, again.train.x) and torch.equal(first.test.y, again.test.y)
    assert not torch.equal(first.train.x[:5], other.train.x[:5])
    assert first.info.task == "semantic-segmentation" and first.train.x.shape[1:] == (1, 32, 32)
    assert sorted(set(first.train_groups.tolist())) == list(range(6))
    assert all(n.startswith("synthetic-mni152-train-") for n in first.group_names)
    lesion = first.train.y.bool()
    assert lesion.flatten(1).any(1).all()  # slice rule "tumour": every slice shows a lesion
    assert (first.train.x[:, 0][lesion] > 0).all()  # lesions are inside the (non-zero) brain
    assert set(first.test_meta["subject"].tolist()) == {0, 1}


def test_mni152_synthetic_default_has_enough_sites():
    data = load_dataset("mni152-synthetic-lesions")
    assert data.info.image_size == 64 and len(set(data.train_groups.tolist())) == 40


def _need(*paths):
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        pytest.skip(f"shared data files absent: {', '.join(missing)}")


def test_brats_synthetic_lesions_from_real_brains():
    _need(BRAIN_MRI / brain_synthetic.COLIN27, BRAIN_MRI / brain_synthetic.MNI152)
    options = {"image_size": 32, "train_subjects": 4, "test_subjects": 2}
    data = load_dataset("brats-synthetic-lesions", SHARED_DATA, **options)
    again = load_dataset("brats-synthetic-lesions", SHARED_DATA, **options)
    assert torch.equal(data.train.x, again.train.x) and torch.equal(data.train.y, again.train.y)
    assert {n.split("-")[1] for n in data.group_names} == {"colin27", "mni152"}
    assert (data.train.x[:, 0][data.train.y.bool()] > 0).all()


def test_real_lesions_test_only_and_as_extra_test_subjects():
    _need(*(BRAIN_MRI / f"lesion_brain{i}_{k}.nii.gz" for i in (1, 2) for k in ("image", "label")))
    real = load_dataset("brain-lesions-real", SHARED_DATA, image_size=32)
    assert len(real.train) == 0 and 0 < len(real.test) <= 7 + 3 and int(real.test.y.sum()) > 0
    assert set(real.test_meta["subject"].tolist()) == {0, 1}
    _need(BRAIN_MRI / brain_synthetic.COLIN27, BRAIN_MRI / brain_synthetic.MNI152)
    mixed = load_dataset(
        "brats-synthetic-lesions",
        SHARED_DATA,
        image_size=32,
        train_subjects=2,
        test_subjects=1,
        real_test=True,
    )
    flags = mixed.test_meta["real"]
    assert flags.sum() == len(real.test) and set(mixed.test_meta["subject"][flags == 1].tolist()) == {1, 2}


def test_nuclei_synthetic_sites():
    _need(NUCLEI / "fluorescence_image.tif", NUCLEI / "fluorescence_instances.tif")
    options = {"image_size": 64, "patch_size": 32, "train_images": 2, "test_images": 1}
    data = load_dataset("nuclei-synthetic-sites", SHARED_DATA, **options)
    again = load_dataset("nuclei-synthetic-sites", SHARED_DATA, **options)
    assert torch.equal(data.train.x, again.train.x) and torch.equal(data.test.y, again.test.y)
    assert len(data.group_names) == 3 and all("synthetic" in n for n in data.group_names)
    assert (
        np.bincount(data.train_groups).tolist() == [2 * 4] * 3
        and np.bincount(data.test_groups).tolist() == [4] * 3
    )
    assert data.train.x.shape[1:] == (3, 32, 32) and data.info.task == "instance-segmentation"
    maps = stitch_instances(data.test_meta["image_instances"], data.test_meta)
    assert all(m.shape == (64, 64) and m.max() > 0 for m in maps.values())


def test_registry_knows_the_medical_datasets(tmp_path):
    names = set(dataset_names())
    assert {"brats", "monuseg", "cpm17", "tnbc", "nuclei-cross-site", "mni152-synthetic-lesions"} <= names
    assert {"brats-synthetic-lesions", "brain-lesions-real", "nuclei-synthetic-sites"} <= names
    assert f"{tmp_path}/brats/HGG/" in describe_files("brats", tmp_path)
    brats = describe_files("brats", tmp_path)  # every release the loader reads, 2021's and 2023's names too
    assert "BraTS2021_00000_t2.nii.gz" in brats and "BraTS-GLI-00000-000-<t1n|t1c|t2w|t2f|seg>" in brats
    assert "needs no files" in describe_files("mni152-synthetic-lesions")
    with pytest.raises(DataError, match="colin27_t1_brain"):
        load_dataset("brats-synthetic-lesions", tmp_path)
    with pytest.raises(DataError, match=r"fluorescence_image\.tif"):
        load_dataset("nuclei-synthetic-sites", tmp_path)
    with pytest.raises(ConfigError, match="image_size"):
        load_dataset("mni152-synthetic-lesions", image_size="big")


def test_a_stride_longer_than_the_patch_is_refused_before_any_patch_is_cut(tmp_path):
    """Patches every `stride` > `patch_size` pixels leave strips of the image in no patch: training would skip
    them and the test set could not be stitched back into whole images."""
    with pytest.raises(ValueError, match="stride"):
        patch_starts(100, 32, 40)
    _cpm17(tmp_path / "cpm17")
    with pytest.raises(ConfigError, match=r"cpm17 option stride must be at most the patch_size \(16\)"):
        load_dataset("cpm17", tmp_path, patch_size=16, stride=20)
    assert len(load_dataset("cpm17", tmp_path, patch_size=16, stride=16).test) == 2 * 3


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_a_grey_image_with_alpha_is_read_as_grey(tmp_path, suffix):
    """Grey plus alpha (Pillow's LA, a 2-sample TIFF): the grey is repeated and the alpha dropped."""
    grey = np.random.default_rng(1).integers(0, 255, (6, 7), dtype=np.uint8)
    pixels = np.stack([grey, np.full_like(grey, 255)], axis=2)
    path = tmp_path / f"tile{suffix}"
    if suffix == ".png":
        Image.fromarray(pixels, "LA").save(path)
    else:
        tifffile.imwrite(path, pixels, photometric="minisblack", extrasamples=["unassalpha"])
    np.testing.assert_array_equal(read_rgb(path), np.stack([grey] * 3))


def test_macos_metadata_files_beside_the_data_are_ignored(tmp_path):
    """Archives made on a Mac carry `__MACOSX/` folders and `._<name>` files (AppleDouble metadata, no image)
    named like every image and label; they are skipped, not read as tiles."""
    apple_double = b"\x00\x05\x16\x07" + bytes(100)
    root = tmp_path / "monuseg"
    _monuseg(root)
    for path in list(root.rglob("*.*")):
        for twin in (root / "__MACOSX" / path.relative_to(root), path):
            twin.with_name(f"._{path.name}").parent.mkdir(parents=True, exist_ok=True)
            twin.with_name(f"._{path.name}").write_bytes(apple_double)
    data = load_dataset("monuseg", tmp_path, split="challenge", patch_size=40)
    assert len(data.train) == len(MONUSEG_TILES) and len(data.test) == 1
    _cpm17(tmp_path / "cpm17")
    _tnbc(tmp_path / "tnbc")
    for path in [*(tmp_path / "cpm17").rglob("*.*"), *(tmp_path / "tnbc").rglob("*.png")]:
        path.with_name(f"._{path.name}").write_bytes(apple_double)
    assert len(load_dataset("cpm17", tmp_path, patch_size=16).train) == 2 * 2 * 3
    assert len(load_dataset("tnbc", tmp_path, patch_size=24).train) == 4


def test_tnbc_test_slides_named_twice_count_once(tmp_path):
    _tnbc(tmp_path / "tnbc")
    data = load_dataset("tnbc", tmp_path, patch_size=24, test_slides="1, 2, 2")
    assert data.test_groups.tolist() == [0, 0, 1, 1] and data.train_groups.tolist() == [2, 2]
    with pytest.raises(ConfigError, match="some but not all"):
        load_dataset("tnbc", tmp_path, test_slides=[1, 2, 3, 3])


def test_an_annotation_of_another_image_size_is_a_data_error_not_nuclei_cut_off(tmp_path):
    """Outlines drawn on the tile at twice the scale (or on another, larger image) mostly fall off the image:
    they were clipped or dropped in silence, leaving a target map with a few nuclei, or none."""
    path = tmp_path / "tile.xml"
    path.write_text(_aperio([(2 * r, 2 * c, 2 * s) for r, c, s in [(4, 4, 6), (20, 25, 8), (30, 30, 12)]]))
    with pytest.raises(
        DataError, match=r"tile\.xml: 2 of the 3 nucleus outlines lie wholly outside the 40x40"
    ):
        read_instances(path, (40, 40))
    # a stray outline among many is an annotator's slip, not another image's annotation
    path.write_text(_aperio([(3 * i, 3 * i, 2) for i in range(12)] + [(50, 50, 4)]))
    assert read_instances(path, (40, 40)).max() == 12


def test_aperio_negative_regions_are_holes_not_nuclei(tmp_path):
    """ImageScope marks an exclusion (a hole cut from the annotation) with NegativeROA="1" on its Region."""
    path = tmp_path / "a.xml"
    xml = _aperio([(4, 4, 12), (9, 9, 3), (20, 25, 8)])
    path.write_text(xml.replace('<Region Id="2"', '<Region Id="2" NegativeROA="1"'))
    instances = read_instances(path, (40, 40))
    assert instances.max() == 2  # the two nuclei; the negative region is not a third
    assert (instances[9:13, 9:13] == 0).all() and instances[5, 5] == 1 and instances[24, 29] == 2
    assert (instances == 1).sum() == 13 * 13 - 4 * 4


def test_a_short_row_of_monuseg_organs_csv_is_a_data_error_naming_it(tmp_path):
    root = tmp_path / "monuseg"
    _monuseg(root)
    (root / "organs.csv").write_text(
        "image,organ\nTCGA-A7-A13E-01Z-00-DX1.tif,breast\n,\nTCGA-B0-5711-01Z-00-DX1\n"
    )
    with pytest.raises(DataError, match=r"organs\.csv line 4: expected image,organ, got 'TCGA-B0-5711"):
        load_dataset("monuseg", tmp_path, organs="breast,kidney", train_per_organ=1, test_per_organ=1)


def test_an_annotation_in_another_xml_format_is_a_data_error_not_an_empty_map(tmp_path):
    """ASAP's XML outlines nuclei with <Coordinate> points: read as Aperio's it would give no nucleus."""
    path = tmp_path / "a.xml"
    path.write_text(
        '<?xml version="1.0"?><ASAP_Annotations><Annotations><Annotation Name="n1" Type="Polygon">'
        '<Coordinates><Coordinate Order="0" X="4" Y="4"/><Coordinate Order="1" X="9" Y="4"/>'
        '<Coordinate Order="2" X="9" Y="9"/></Coordinates></Annotation></Annotations></ASAP_Annotations>'
    )
    with pytest.raises(DataError, match=r"a\.xml is not an Aperio ImageScope annotation .*ASAP_Annotations"):
        read_instances(path, (20, 20))


def test_brats_scans_of_one_patient_never_straddle_the_split():
    """BraTS-<set>-<patient>-<timepoint>: a patient's other scans are not trained on when one is tested."""
    names = ["BraTS-GLI-00003-000", "BraTS-GLI-00001-001", "BraTS-GLI-00002-000", "BraTS-GLI-00001-000"]
    train, test = split_subjects(names, train=2, test=1)
    assert test == ["BraTS-GLI-00001-000"] and train == ["BraTS-GLI-00002-000", "BraTS-GLI-00003-000"]
    # without timepoints (2018-2021 names) the split is the plain one
    assert split_subjects(["S3", "S1", "S2", "S4"], train=2, test=1) == (["S2", "S3"], ["S1"])
    with pytest.raises(DataError, match="no patient is left to train on"):
        split_subjects(["BraTS-GLI-00001-000", "BraTS-GLI-00001-001"], train=2, test=1)


def test_a_nifti_of_rgb_or_complex_voxels_is_a_data_error_naming_its_type(tmp_path):
    """Colour (RGB24) and complex voxels have no one intensity; they were a NumPy traceback or lost their
    imaginary part without a word."""
    rgb = np.zeros((4, 4, 4), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    nib.save(nib.Nifti1Image(rgb, np.eye(4)), tmp_path / "rgb.nii")
    with pytest.raises(
        DataError, match=r"rgb\.nii holds voxels of type RGB; expected one real number per voxel"
    ):
        read_volume(tmp_path / "rgb.nii")
    nib.save(nib.Nifti1Image(np.ones((4, 4, 4), np.complex64), np.eye(4)), tmp_path / "c.nii")
    with pytest.raises(DataError, match=r"c\.nii holds voxels of type complex64"):
        read_volume(tmp_path / "c.nii")


def test_a_short_row_of_brats_name_mapping_is_a_data_error_naming_it(tmp_path):
    root = tmp_path / "brats"
    _brats_subject(root / "BraTS20_Training_001", "BraTS20_Training_001", 2)
    (root / "name_mapping.csv").write_text("Grade,BraTS_2020_subject_ID\nHGG,BraTS20_Training_001\nLGG\n")
    with pytest.raises(
        DataError, match=r"name_mapping\.csv line 3: expected a Grade and a BraTS_2020_subject_ID"
    ):
        load_dataset("brats", tmp_path, image_size=24)


def test_the_challenge_split_without_monuseg_test_tiles_is_a_data_error(tmp_path):
    """Without MoNuSeg's test archive the cross-site set had no TCGA test image at all, and said nothing."""
    _cpm17(tmp_path / "cpm17")
    _monuseg(tmp_path / "monuseg")
    _tnbc(tmp_path / "tnbc")
    shutil.rmtree(tmp_path / "monuseg" / "MoNuSegTestData")
    with pytest.raises(DataError, match=r"split=challenge.*no test tile.*test archive"):
        load_dataset("nuclei-cross-site", tmp_path, patch_size=24)
    with pytest.raises(DataError, match=r"split=challenge.*no test tile"):
        load_dataset("monuseg", tmp_path, split="challenge", patch_size=40)


@pytest.mark.parametrize("compression", [None, "lzw"])
def test_a_palette_tiff_is_read_in_its_colours_not_as_grey_indices(tmp_path, compression):
    """An indexed-colour TIFF holds palette indices; its colours are the colormap's (16 bits per channel)."""
    colormap = np.zeros((3, 256), np.uint16)
    colormap[:, 1] = (65535, 0, 0)
    colormap[:, 2] = (0, 0, 65535)
    colormap[:, 3] = (0, 32896, 0)
    path = tmp_path / "tile.tif"
    indices = np.array([[0, 1], [2, 3]], np.uint8)
    if compression is None:
        tifffile.imwrite(path, indices, photometric="palette", colormap=colormap)
    else:  # read through Pillow: tifffile lacks the codec without imagecodecs
        image = Image.fromarray(indices, "P")
        image.putpalette((colormap[:, :256].T // 257).astype(np.uint8).ravel().tolist())
        image.save(path, compression="tiff_lzw")
    expected = [[[0, 0, 0], [255, 0, 0]], [[0, 0, 255], [0, 128, 0]]]
    assert read_rgb(path).transpose(1, 2, 0).tolist() == expected
