"""nifti-folder: a user's own NIfTI scans and label volumes, in the Medical Segmentation Decathlon / nnU-Net
layout or mask-folder's, read as 2D axial slices; and `fedistill predict` on a model trained on them."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from conftest import SHARED_DATA
from fedistill.config import RunConfig, build_config
from fedistill.data.base import DatasetInfo
from fedistill.data.medical.nifti_folder import model_slices, scaled_slices
from fedistill.data.registry import load_dataset
from fedistill.data.transforms import to_float
from fedistill.errors import ConfigError, DataError, PartitionError
from fedistill.tasks import make_task

SHAPE = (24, 20, 12)  # X, Y, Z voxels
RAS = np.diag([1.0, 1.5, 3.0, 1.0])


def _save(path: Path, data: np.ndarray, affine: np.ndarray = RAS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, affine), str(path))
    return path


def _synthetic_case(seed: int, shape: tuple[int, int, int] = SHAPE) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic scan: noisy tissue (about 100) on a zero background, with a bright blob (about 300)
    whose label is 1; the blob's place and size vary with `seed`."""
    rng = np.random.default_rng(seed)
    x, y, z = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    centre = [rng.uniform(0.35, 0.65) * n for n in shape]
    radius = rng.uniform(3.0, 5.0)
    blob = ((x - centre[0]) ** 2 + (y - centre[1]) ** 2 + ((z - centre[2]) * 2.0) ** 2) <= radius**2
    image = 100.0 + 10.0 * rng.normal(size=shape) + 200.0 * blob
    image[:2] = 0.0  # a strip of zero background the percentile scale leaves out
    return image.astype(np.float32), blob.astype(np.uint8)


def _msd(root: Path, cases: int = 4, test: int = 0, labels: dict | None = None, suffix: str = "") -> Path:
    """A Decathlon folder of synthetic cases: imagesTr/labelsTr, `test` more in imagesTs/labelsTs."""
    for i in range(cases + test):
        image, label = _synthetic_case(i)
        images, labelled = ("imagesTr", "labelsTr") if i < cases else ("imagesTs", "labelsTs")
        _save(root / images / f"case_{i:03d}{suffix}.nii.gz", image)
        _save(root / labelled / f"case_{i:03d}.nii.gz", label)
    if labels is not None:
        (root / "dataset.json").write_text(json.dumps({"name": "blobs", "labels": labels}), encoding="utf-8")
    return root


def _labelled_slices(label: np.ndarray) -> int:
    return int(label.reshape(-1, label.shape[2]).any(axis=0).sum())


def test_a_decathlon_folder_gives_labelled_slices_one_group_per_case_and_its_class_names(tmp_path) -> None:
    root = _msd(tmp_path / "Task01_Blobs", cases=3, test=1, labels={"0": "background", "1": "blob"})
    (root / "imagesTr" / "._case_000.nii.gz").write_bytes(b"\x00\x05\x16\x07")  # macOS' AppleDouble file
    data = load_dataset("nifti-folder", tmp_path, image_size=16)  # the task's folder one level down
    counts = [_labelled_slices(_synthetic_case(i)[1]) for i in range(4)]
    assert data.info.class_names == ("background", "blob") and data.info.num_classes == 2
    assert len(data.train) == sum(counts[:3]) and len(data.test) == counts[3]
    assert data.train.x.shape[1:] == (1, 16, 16) and data.train.x.dtype == torch.uint8
    assert all(bool(y.any()) for y in data.train.y)  # "labelled": every kept slice shows the blob
    assert sorted(data.group_names) == ["case_000", "case_001", "case_002"]
    assert np.bincount(data.train_groups).tolist() == sorted(counts[:3])  # ranked by label volume
    assert data.test_meta["subject"].tolist() == [0] * counts[3]
    every = load_dataset("nifti-folder", root, image_size=16, slices="all")
    assert len(every.train) == 3 * SHAPE[2] and len(every.test) == SHAPE[2]


def test_nnunet_channel_files_and_its_dataset_json_form(tmp_path, caplog) -> None:
    root = _msd(tmp_path / "d", cases=3, suffix="_0000", labels={"background": 0, "blob": 1})
    for i in range(3):  # a second channel: the first one inverted
        image = nib.load(str(root / "imagesTr" / f"case_{i:03d}_0000.nii.gz")).get_fdata()
        _save(root / "imagesTr" / f"case_{i:03d}_0001.nii.gz", (400.0 - image).astype(np.float32))
    first = load_dataset("nifti-folder", root, image_size=16)
    with caplog.at_level(logging.INFO):
        second = load_dataset("nifti-folder", root, image_size=16, channel=1)
    assert "nifti-folder: channel 1 read from each case's <case>_0001 file" in caplog.text
    assert first.info.class_names == ("background", "blob")
    assert torch.equal(first.train.y, second.train.y)
    inside = first.train.y.bool()
    assert first.train.x[:, 0][inside].float().mean() > 200 > second.train.x[:, 0][inside].float().mean()
    missing = r"case case_000 under .* has no channel 2 \(case_000_0002.nii.gz"
    with pytest.raises(DataError, match=missing) as e:
        load_dataset("nifti-folder", root, image_size=16, channel=2)
    assert str(e.value).endswith("it has 0000, 0001); set nifti-folder.channel to one every case has (0, 1)")


# Task01_BrainTumour's dataset.json: its four MR sequences, in the order of each image file's 4th axis
MODALITIES = {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"}
LPS = np.diag([-1.0, -1.0, 1.0, 1.0])


def _stored_lps(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same voxels stored right-to-left and anterior-to-back, with the affine that says so."""
    shift = np.eye(4)
    shift[:2, 3] = [-(n - 1) for n in data.shape[:2]]
    return np.ascontiguousarray(data[::-1, ::-1]), RAS @ LPS @ shift


def _four_d(root: Path, cases: int = 3, shown: int = 1, channels: dict | None = MODALITIES) -> Path:
    """A Decathlon folder as Task01_BrainTumour's, stored LPS: each case one 4-D image file (X, Y, Z, 4)
    whose blob shows in channel `shown` alone (the others: the tissue without it) and a 3-D label file."""
    for i in range(cases):
        image, label = _synthetic_case(i)
        stack = np.stack([np.where(label > 0, 100.0, image) * (1 + c) for c in range(4)], axis=-1)
        stack[..., shown] = image
        _save(root / "imagesTr" / f"case_{i:03d}.nii.gz", *_stored_lps(stack.astype(np.float32)))
        _save(root / "labelsTr" / f"case_{i:03d}.nii.gz", *_stored_lps(label))
    if channels is not None:
        key = "modality" if channels is MODALITIES else "channel_names"
        json_text = json.dumps({"labels": {"0": "background", "1": "tumour"}, key: channels})
        (root / "dataset.json").write_text(json_text, encoding="utf-8")
    return root


def test_a_decathlon_4d_file_gives_the_channel_asked_for_as_a_3d_file_of_it_would(tmp_path, caplog) -> None:
    """Channel 1 of 4-D files stored LPS gives exactly the slices of 3-D RAS files of that channel; the
    read is logged once, with the channel's name in dataset.json."""
    four = _four_d(tmp_path / "Task01_BrainTumour")
    three = _msd(tmp_path / "three", cases=3)  # channel 1's volumes, stored RAS
    with caplog.at_level(logging.INFO):
        picked = load_dataset("nifti-folder", four, image_size=16, channel=1)
    plain = load_dataset("nifti-folder", three, image_size=16)
    assert torch.equal(picked.train.x, plain.train.x) and torch.equal(picked.train.y, plain.train.y)
    assert torch.equal(picked.test.x, plain.test.x) and picked.info.class_names == ("background", "tumour")
    read = [r.getMessage() for r in caplog.records if "read from" in r.getMessage()]
    assert read == [
        "nifti-folder: channel 1 (T1w, dataset.json's modality) read from each case's 4-D image file of 4 "
        "volumes"
    ]
    flair = load_dataset("nifti-folder", four, image_size=16)  # channel 0: the blob does not show
    inside = picked.train.y.bool()
    assert picked.train.x[:, 0][inside].float().mean() > 200 > flair.train.x[:, 0][inside].float().mean()


def test_read_volume_reads_a_channel_of_a_4d_file_as_the_3d_file_of_it(tmp_path) -> None:
    from fedistill.data.medical.volumes import read_volume

    stack = np.random.default_rng(0).random((6, 20, 24, 3)).astype(np.float32)
    four = _save(tmp_path / "four.nii.gz", stack, OBLIQUE)
    for channel in range(3):
        alone = _save(
            tmp_path / f"alone_{channel}.nii.gz", np.ascontiguousarray(stack[..., channel]), OBLIQUE
        )
        volume, zooms = read_volume(four, channel)
        expected, expected_zooms = read_volume(alone)
        np.testing.assert_array_equal(volume, expected)
        assert volume.shape == (20, 24, 6) and zooms == expected_zooms == (10.0, 10.0, 3.0)
    with pytest.raises(DataError, match=r"four.nii.gz holds 3 volumes; it has no volume 3"):
        read_volume(four, 3)
    with pytest.raises(DataError, match=r"alone_0.nii.gz holds one volume \(3-D\); it has no volume 1"):
        read_volume(tmp_path / "alone_0.nii.gz", 1)


def _spoiled_4d(root: Path, spoil: str) -> Path:
    _four_d(root, channels={"0": "T2", "1": "ADC"} if spoil == "nnU-Net names" else MODALITIES)
    if spoil == "no dataset.json":
        (root / "dataset.json").unlink()
    elif spoil == "a 3-D case":
        _save(root / "imagesTr" / "case_001.nii.gz", _synthetic_case(1)[0])
    elif spoil == "4-D label":
        _save(root / "labelsTr" / "case_001.nii.gz", np.zeros((*SHAPE, 2), np.uint8))
    elif spoil == "3-D files":
        shutil.rmtree(root)
        _msd(root, cases=3)
    elif spoil == "3-D test cases":
        _msd(root, cases=0, test=4)
    return root


@pytest.mark.parametrize(
    ("spoil", "channel", "words"),
    [
        (
            "",
            4,
            "{d}/imagesTr/case_000.nii.gz holds 4 volumes, so nifti-folder.channel = 4 picks none; set it "
            "to one of 0 to 3 (dataset.json's modality: 0 FLAIR, 1 T1w, 2 t1gd, 3 T2w)",
        ),
        (
            "nnU-Net names",
            4,
            "{d}/imagesTr/case_000.nii.gz "
            "holds 4 volumes, so nifti-folder.channel = 4 picks none; set it to one of 0 to 3 "
            "(dataset.json's channel_names: 0 T2, 1 ADC)",
        ),
        (
            "no dataset.json",
            7,
            "{d}/imagesTr/case_000.nii.gz "
            "holds 4 volumes, so nifti-folder.channel = 7 picks none; set it to one of 0 to 3",
        ),
        (
            "a 3-D case",
            1,
            "the image files under {d}/imagesTr hold different numbers of volumes "
            "(case_000.nii.gz 4, case_001.nii.gz 1); give every case the same channels",
        ),
        (
            "4-D label",
            1,
            "{d}/labelsTr/case_001.nii.gz holds a 4-D image of shape (24, 20, 12, 2); expected "
            "one 3-D volume; a label file holds one label volume, which the image's channels share",
        ),
        (
            "3-D test cases",
            0,
            "the image files under {d}/imagesTr hold 4 volumes each but those under "
            "{d}/imagesTs 1; give the test cases the same channels",
        ),
        (
            "3-D files",
            1,
            "{d}/imagesTr/case_000.nii.gz holds one volume (a 3-D image), so nifti-folder.channel "
            "= 1 picks none; leave it out, or give each case's channels in one 4-D file or as nnU-Net's "
            "<case>_0001.nii.gz files",
        ),
    ],
)
def test_a_4d_folder_it_cannot_read_is_one_line_naming_the_files_and_channels(
    tmp_path, spoil, channel, words
):
    root = _spoiled_4d(tmp_path / "d", spoil)
    with pytest.raises(DataError) as caught:
        load_dataset("nifti-folder", root, image_size=16, channel=channel)
    assert str(caught.value) == "nifti-folder: " + words.format(d=root)


def test_the_train_test_layout_with_uncompressed_files(tmp_path) -> None:
    for i in range(3):
        image, label = _synthetic_case(i)
        part = "train" if i < 2 else "test"
        _save(tmp_path / part / "images" / f"c{i}.nii", image)
        _save(tmp_path / part / "masks" / f"c{i}.nii", label)
    data = load_dataset("nifti-folder", tmp_path, image_size=16)
    counts = [_labelled_slices(_synthetic_case(i)[1]) for i in range(3)]
    assert (len(data.train), len(data.test)) == (counts[0] + counts[1], counts[2])
    assert data.info.class_names == ("background", "class-1")


def test_without_test_cases_test_fraction_holds_out_cases_spread_over_their_sorted_names(
    tmp_path, caplog
) -> None:
    root = _msd(tmp_path / "d", cases=5)
    counts = [_labelled_slices(_synthetic_case(i)[1]) for i in range(5)]
    with caplog.at_level(logging.INFO):
        data = load_dataset("nifti-folder", root, image_size=16)  # 0.2 of 5: one, the middle
    assert "1 of the 5 cases held out for testing (test_fraction 0.2): case_002" in caplog.text
    assert len(data.test) == counts[2] and "case_002" not in data.group_names
    data = load_dataset("nifti-folder", root, image_size=16, test_fraction=0.4)
    assert len(data.test) == counts[1] + counts[3]
    assert sorted(data.group_names) == ["case_000", "case_002", "case_004"]


def test_a_copy_stored_lps_gives_the_same_slices_as_its_ras_original(tmp_path) -> None:
    ras, lps = _msd(tmp_path / "ras", cases=2), tmp_path / "lps"
    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    for path in sorted(ras.rglob("*.nii.gz")):  # the same voxels, stored right-to-left, anterior-to-back
        image = nib.load(str(path))
        shift = np.eye(4)
        shift[:2, 3] = [-(n - 1) for n in image.shape[:2]]
        affine = image.affine @ flip @ shift  # voxel (i, j) of the copy is (X-1-i, Y-1-j) of the original
        data = np.asarray(image.dataobj)[::-1, ::-1]
        _save(lps / path.relative_to(ras), np.ascontiguousarray(data), affine)
        assert nib.aff2axcodes(affine) == ("L", "P", "S")
    a, b = (load_dataset("nifti-folder", r, image_size=16) for r in (ras, lps))
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert torch.equal(a.test.x, b.test.x) and torch.equal(a.test.y, b.test.y)


def test_anisotropic_pixels_are_padded_to_the_larger_physical_side(tmp_path) -> None:
    """X: 24 voxels of 1 mm (24 mm), Y: 20 of 2 mm (40 mm): the field of view is 40 mm, so the 24 columns
    are padded to 40 of 1 mm and the 20 rows stay; resized to 40 the label covering the whole slice spans
    all rows and the middle 24 columns."""
    volume = np.full((24, 20, 3), 50.0, np.float32)
    volume[0, 0, 0] = 0.0
    scaled, spacing, field = scaled_slices(volume, (1.0, 2.0, 4.0), None, "test")
    assert spacing == (2.0, 1.0) and field == 40.0 and scaled.shape == (3, 20, 24)
    assert model_slices(scaled, spacing, field, 40).shape == (3, 40, 40)
    root = tmp_path / "d"
    for i in range(2):
        _save(root / "imagesTr" / f"c{i}.nii.gz", volume, np.diag([1.0, 2.0, 4.0, 1.0]))
        _save(
            root / "labelsTr" / f"c{i}.nii.gz", np.ones((24, 20, 3), np.uint8), np.diag([1.0, 2.0, 4.0, 1.0])
        )
    mask = load_dataset("nifti-folder", root, image_size=40).train.y[0].numpy()
    expected = np.zeros((40, 40), np.int64)
    expected[:, 8:32] = 1
    np.testing.assert_array_equal(mask, expected)


def test_a_window_fixes_the_intensity_range(tmp_path) -> None:
    """CT in Hounsfield units: air -1000, tissue 40 and a 340 blob, window [-160, 240]: air 0, tissue at
    the middle of the range (127.5, rounded to 128), the blob clipped at 255; resized nowhere (20 x 20 at
    1 mm, image_size 20), so the values are exact."""
    root = tmp_path / "ct"
    for i in range(2):
        _, blob = _synthetic_case(i, (20, 20, 6))
        image = np.where(blob > 0, 340.0, 40.0).astype(np.float32)
        image[:3] = -1000.0
        _save(root / "imagesTr" / f"c{i}.nii.gz", image, np.eye(4))
        _save(root / "labelsTr" / f"c{i}.nii.gz", blob, np.eye(4))
    data = load_dataset("nifti-folder", root, image_size=20, window=[-160, 240])
    assert set(torch.unique(data.train.x).tolist()) == {0, 128, 255}
    assert torch.equal(data.train.x[:, 0] == 255, data.train.y.bool())


def _refusal(tmp_path: Path, spoil: str) -> Path:
    root = _msd(tmp_path / spoil, cases=3)
    if spoil == "missing label":
        (root / "labelsTr" / "case_001.nii.gz").unlink()
    elif spoil == "shape":
        _save(root / "labelsTr" / "case_001.nii.gz", np.zeros((24, 20, 11), np.uint8))
    elif spoil == "4-D":  # one case's channels in one file, the others' a volume each
        _save(root / "imagesTr" / "case_001.nii.gz", np.zeros((*SHAPE, 4), np.float32))
    elif spoil == "2-D":  # one slice saved alone: no channels to pick
        _save(root / "imagesTr" / "case_001.nii.gz", np.zeros(SHAPE[:2], np.float32))
    elif spoil == "no cases":
        for path in (root / "imagesTr").iterdir():
            path.unlink()
    elif spoil == "fractional label":
        _save(root / "labelsTr" / "case_001.nii.gz", np.full(SHAPE, 0.5, np.float32))
    elif spoil == "region labels":
        (root / "dataset.json").write_text(json.dumps({"labels": {"background": 0, "whole": [1, 2]}}))
    return root


@pytest.mark.parametrize(
    ("spoil", "words"),
    [
        ("missing label", r"image .*case_001.nii.gz has no label volume .*labelsTr/case_001.nii.gz"),
        ("shape", r"labelsTr/case_001.nii.gz is \(24, 20, 11\) voxels .* but its image .* is \(24, 20, 12\)"),
        ("4-D", r"imagesTr hold different numbers of volumes \(case_000.nii.gz 1, case_001.nii.gz 4\); give"),
        ("2-D", r"2-D image of shape \(24, 20\); expected one 3-D volume; 2D images with masks are read by"),
        ("no cases", r"imagesTr holds no NIfTI volumes"),
        ("fractional label", r"case_001.nii.gz holds values other than whole numbers >= 0"),
        ("region labels", r"labels 'whole': \[1, 2\], neither the Decathlon's"),
    ],
)
def test_a_folder_it_cannot_read_is_one_line_naming_the_files(tmp_path, spoil, words) -> None:
    with pytest.raises(DataError, match=words) as caught:
        load_dataset("nifti-folder", _refusal(tmp_path, spoil), image_size=16)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"bogus": 1}, ConfigError, "bogus"),
        ({"window": [240, -160]}, ConfigError, "window must be two numbers"),
        ({"slices": "tumour"}, ConfigError, "slices must be one of labelled, all"),
        ({"test_fraction": 1.5}, ConfigError, "test_fraction must be at most 0.9"),
        ({"classes": ["background"]}, ConfigError, "classes must list two or more"),
    ],
)
def test_wrong_options_are_named(tmp_path, options, error, words) -> None:
    with pytest.raises(error, match=words):
        load_dataset("nifti-folder", _msd(tmp_path / "d", cases=3), image_size=16, **options)


def test_test_fraction_with_a_test_folder_and_a_value_without_a_class_are_refused(tmp_path) -> None:
    root = _msd(tmp_path / "d", cases=2, test=1)
    with pytest.raises(ConfigError, match=r"test_fraction does not apply: .*labelsTs holds the test cases"):
        load_dataset("nifti-folder", root, image_size=16, test_fraction=0.3)
    _save(root / "labelsTs" / "case_002.nii.gz", 2 * _synthetic_case(2)[1])
    with pytest.raises(DataError, match="holds the value 2, but there are 2 classes"):
        load_dataset("nifti-folder", root, image_size=16, classes=["background", "blob"])
    assert load_dataset("nifti-folder", root, image_size=16, foreground=True).info.num_classes == 2
    with pytest.raises(DataError, match="holds the value 2, but there are 2 classes"):  # train's largest: 1
        load_dataset("nifti-folder", root, image_size=16)
    three = load_dataset("nifti-folder", root, image_size=16, classes=["background", "blob", "core"])
    assert three.info.num_classes == 3 and int(three.test.y.max()) == 2


def test_unlabelled_test_cases_a_misplaced_label_and_an_empty_test_set(tmp_path, caplog) -> None:
    """The Decathlon's imagesTs/ without labelsTs/ is left out (logged) and cases are held out instead; a
    label volume whose affine places its voxels elsewhere than its image's is read, with a warning; test
    cases that label nothing are refused, as there is nothing to score."""
    root = _msd(tmp_path / "d", cases=3)
    _save(root / "imagesTs" / "case_009.nii.gz", _synthetic_case(9)[0])
    _save(root / "labelsTr" / "case_001.nii.gz", _synthetic_case(1)[1], np.diag([1.0, 1.5, 3.0, 1.0]) * 1.01)
    with caplog.at_level(logging.INFO):
        data = load_dataset("nifti-folder", root, image_size=16)
    assert "imagesTs has no labelsTs/ beside it: its cases are not used" in caplog.text
    assert (
        "labelsTr/case_001.nii.gz and its image" in caplog.text
        and "place their voxels differently" in caplog.text
    )
    assert "case_009" not in data.group_names and len(data.test) > 0
    _save(root / "labelsTr" / "case_001.nii.gz", np.zeros(SHAPE, np.uint8))  # the held-out case: nothing
    with pytest.raises(
        DataError, match=r"no test case \(case_001\) labels a voxel above 0; nothing to score"
    ):
        load_dataset("nifti-folder", root, image_size=16)


class Threshold(nn.Module):
    """Class 1 where the normalised input exceeds 0.5: its answer can be computed by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros_like(x), x - 0.5], 1)


@dataclasses.dataclass
class Standin:
    """What `load_model` hands back, built here from a module."""

    module: nn.Module
    info: DatasetInfo
    config: RunConfig
    task: object = None
    algorithm: str = "fedavg"

    def __post_init__(self) -> None:
        self.module.eval()
        self.task = make_task(self.info, {})

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        return to_float(images if images.dim() == 4 else images[:, None], self.info)


# stored axes -> superior (3 mm), left (10 mm), posterior (10 mm): far from RAS
OBLIQUE = np.array([[0.0, -10.0, 0.0, 5.0], [0.0, 0.0, -10.0, -3.0], [3.0, 0.0, 0.0, 7.0], [0, 0, 0, 1.0]])


@pytest.mark.parametrize("window", [None, [0, 400]])
def test_predict_scales_a_volume_as_the_loader_did_and_answers_on_its_grid(tmp_path, window) -> None:
    """Stored (Z, X, Y) = (6, 20, 24) at 3 x 10 x 10 mm: axial slices of 24 rows x 20 columns of 10 mm, on
    a 240 mm field of view of 24 pixels, the model's size, so every voxel's answer is exact: the blob."""
    from fedistill.inference.predict import predict_path

    rng = np.random.default_rng(0)
    data = (100.0 + 10.0 * rng.normal(size=(6, 20, 24))).astype(np.float32)
    truth = np.zeros(data.shape, bool)
    truth[1:5, 4:12, 10:20] = True
    data[truth] += 200.0
    data[:, :2] = 0.0
    source = _save(tmp_path / "in" / "scan.nii.gz", data, OBLIQUE)
    info = DatasetInfo("nifti-folder", 1, 24, 2, (0.0,), (1.0,), task="semantic-segmentation")
    options = {} if window is None else {"nifti-folder": {"window": window}}
    model = Standin(Threshold(), info, RunConfig(dataset="nifti-folder", options=options))
    predict_path(model, source, tmp_path / "out")
    answer = nib.load(str(tmp_path / "out" / "scan.nii.gz"))
    labels = np.asarray(answer.dataobj)
    assert labels.shape == data.shape and labels.dtype == np.uint8
    np.testing.assert_array_equal(answer.affine, nib.load(str(source)).affine)
    np.testing.assert_array_equal(labels, truth.astype(np.uint8))
    with pytest.raises(ConfigError, match="--skull-strip applies to models trained on brain sets"):
        predict_path(model, source, tmp_path / "again", skull_strip=True)
    # refused before any answer is written, also for a folder whose images come first
    Image.fromarray(np.zeros((24, 20), np.uint8)).save(tmp_path / "in" / "a-slice.png")
    with pytest.raises(ConfigError, match="--skull-strip applies to models trained on brain sets"):
        predict_path(model, tmp_path / "in", tmp_path / "mixed", skull_strip=True)
    assert not (tmp_path / "mixed").exists() or not any((tmp_path / "mixed").rglob("*.png"))


def test_predict_reads_the_runs_channel_of_a_4d_file_and_answers_a_3d_label_volume_on_its_grid(tmp_path):
    """The blob shows in channel 1 of a 4-D scan (6, 20, 24, 4) stored oblique; a model trained on channel 1
    finds it there and answers one 3-D label volume with the scan's affine; its channel 1 given alone as a
    3-D file gets the same answer; a model of channel 4 is refused, naming the file and its count."""
    from fedistill.inference.predict import predict_path

    rng = np.random.default_rng(0)
    tissue = (100.0 + 10.0 * rng.normal(size=(6, 20, 24))).astype(np.float32)
    truth = np.zeros(tissue.shape, bool)
    truth[1:5, 4:12, 10:20] = True
    stack = np.stack([tissue * (1 + c) for c in range(4)], axis=-1)
    stack[..., 1][truth] += 200.0
    stack[:, :2] = 0.0
    source = _save(tmp_path / "in" / "BRATS_001.nii.gz", stack, OBLIQUE)
    _save(tmp_path / "alone" / "t1w.nii.gz", np.ascontiguousarray(stack[..., 1]), OBLIQUE)
    info = DatasetInfo("nifti-folder", 1, 24, 2, (0.0,), (1.0,), task="semantic-segmentation")
    options = {"nifti-folder": {"channel": 1}}
    model = Standin(Threshold(), info, RunConfig(dataset="nifti-folder", options=options))
    predict_path(model, source, tmp_path / "out")
    predict_path(model, tmp_path / "alone", tmp_path / "out")
    answer = nib.load(str(tmp_path / "out" / "BRATS_001.nii.gz"))
    labels = np.asarray(answer.dataobj)
    assert labels.shape == truth.shape and answer.header["dim"][0] == 3 and labels.dtype == np.uint8
    np.testing.assert_array_equal(answer.affine, OBLIQUE)
    assert answer.header.get_zooms() == (3.0, 10.0, 10.0)
    np.testing.assert_array_equal(labels, truth.astype(np.uint8))
    alone = np.asarray(nib.load(str(tmp_path / "out" / "t1w.nii.gz")).dataobj)
    np.testing.assert_array_equal(alone, labels)
    model.config = RunConfig(dataset="nifti-folder", options={"nifti-folder": {"channel": 4}})
    with pytest.raises(DataError) as caught:
        predict_path(model, source, tmp_path / "none")
    assert str(caught.value) == (
        f"{source} holds 4 volumes, none of them the model's channel 4 (its run's nifti-folder.channel); "
        "give it a scan of that channel"
    )


def _sites(root: Path) -> None:
    """A server folder and two sites', each a Decathlon folder of synthetic cases."""
    seeds = {"server": range(0, 4), "site-0": range(4, 10), "site-1": range(10, 16)}
    for folder, cases in seeds.items():
        for i in cases:
            image, label = _synthetic_case(i)
            _save(root / folder / "imagesTr" / f"case_{i:03d}.nii.gz", image)
            _save(root / folder / "labelsTr" / f"case_{i:03d}.nii.gz", label)


def test_sites_with_their_own_volumes_load_them_with_the_servers_classes(tmp_path) -> None:
    from fedistill.engine.site_data import load_site

    _sites(tmp_path)
    server = load_dataset("nifti-folder", tmp_path / "server", image_size=16)
    keys = {"dataset": "nifti-folder", "data_dir": str(tmp_path / "server"), "clients": 2}
    keys["nifti-folder"] = {"image_size": 16}
    config = build_config(RunConfig(), {**keys, "site_data_dir": str(tmp_path / "site-{site}")})
    site = load_site(config, 1, server.info)
    assert site.dataset.info == server.info and len(site.dataset.group_names) == 5
    assert site.split.val_mode == "subjects"  # whole cases held out
    _save(tmp_path / "site-0" / "labelsTr" / "case_004.nii.gz", 2 * _synthetic_case(4)[1])
    with pytest.raises(
        DataError, match=r"holds the value 2, but the server has 2 classes .* dataset.json or"
    ):
        load_site(config, 0, server.info)


def test_site_folders_writes_a_nifti_folder_runs_slices_as_mask_folders(tmp_path) -> None:
    from fedistill.engine.site_folders import write_site_folders

    _sites(tmp_path)
    keys = {"dataset": "nifti-folder", "data_dir": str(tmp_path / "server"), "clients": 2}
    config = build_config(RunConfig(), {**keys, "partition": "natural", "nifti-folder": {"image_size": 16}})
    text = write_site_folders(config, tmp_path / "out", progress=False)
    assert "--dataset mask-folder" in text
    written = load_dataset("mask-folder", tmp_path / "out" / "site-0", image_size=16)
    assert written.info.num_classes == 2 and len(written.train) > 0


def test_fedavg_on_synthetic_volumes_beats_marking_everything_and_predict_finds_the_blob(tmp_path) -> None:
    """Synthetic volumes (a bright blob labelled 1): FedAvg of a small U-Net over two sites of whole cases
    scores a test Dice above marking every pixel foreground; `fedistill predict` on a new synthetic case
    stored LPS answers on its grid, its blob found."""
    from fedistill.engine.launch import run_suite
    from fedistill.inference.loading import load_model
    from fedistill.inference.predict import predict_path

    root = _msd(tmp_path / "data", cases=8, test=2)
    keys = {
        "algorithm": "fedavg",
        "dataset": "nifti-folder",
        "data_dir": str(root),
        "partition": "natural",
        "clients": 2,
        "rounds": 4,
        "local_epochs": 3,
        "batch_size": 8,
        "optimizer": "adam",
        "lr": 5e-3,
        "model": "unet",
        "threads": 1,
        "nifti-folder": {"image_size": 24},
        "model_options": {"width": 8, "depth": 2},
    }
    summary = run_suite(build_config(RunConfig(), keys), tmp_path / "run", progress=False)[0]
    test = load_dataset("nifti-folder", root, image_size=24).test
    shares = (test.y > 0).double().mean(dim=(1, 2))
    everything = float((2 * shares / (1 + shares)).mean())  # Dice of marking every pixel, per slice
    assert summary["final"]["test_dice"] > everything + 0.3, (summary["final"]["test_dice"], everything)
    image, label = _synthetic_case(99)
    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    affine = RAS @ flip
    affine[:2, 3] = [(SHAPE[0] - 1) * 1.0, (SHAPE[1] - 1) * 1.5]
    source = _save(tmp_path / "new" / "case.nii.gz", np.ascontiguousarray(image[::-1, ::-1]), affine)
    model = load_model(tmp_path / "run", "fedavg")
    predict_path(model, source, tmp_path / "answer")
    answer = nib.load(str(tmp_path / "answer" / "case.nii.gz"))
    np.testing.assert_array_equal(answer.affine, affine)
    found, truth = np.asarray(answer.dataobj) > 0, label[::-1, ::-1] > 0
    dice = 2 * (found & truth).sum() / (found.sum() + truth.sum())
    assert dice > 0.6, dice


PATIENTS = SHARED_DATA / "brain-mri"


@pytest.mark.skipif(
    not (PATIENTS / "lesion_brain1_image.nii.gz").is_file()
    or not (PATIENTS / "lesion_brain2_label.nii.gz").is_file(),
    reason="the two real lesion patients are not in the shared data folder",
)
def test_two_real_patients_as_a_decathlon_folder(tmp_path) -> None:
    """The data README's lesion masks: 7 slices of patient 1, 3 of patient 2; with two cases and no test
    folder, the second by name is the test case."""
    for patient in ("lesion_brain1", "lesion_brain2"):
        (tmp_path / "imagesTr").mkdir(exist_ok=True)
        (tmp_path / "labelsTr").mkdir(exist_ok=True)
        (tmp_path / "imagesTr" / f"{patient}.nii.gz").symlink_to(PATIENTS / f"{patient}_image.nii.gz")
        (tmp_path / "labelsTr" / f"{patient}.nii.gz").symlink_to(PATIENTS / f"{patient}_label.nii.gz")
    data = load_dataset("nifti-folder", tmp_path, image_size=64)
    assert (len(data.train), len(data.test)) == (7, 3)
    assert data.group_names == ("lesion_brain1",) and data.info.num_classes == 2


@pytest.mark.parametrize("layout", ["decathlon", "train-test"])
def test_a_server_folder_holding_test_cases_alone_serves_with_no_validation_split(tmp_path, layout) -> None:
    from fedistill.engine.setup import prepare_data

    _sites(tmp_path)
    server = tmp_path / "server"
    for i in range(2):  # the server's cases become its test set, with no training part
        image, label = _synthetic_case(i)
        images, labels = ("imagesTs", "labelsTs") if layout == "decathlon" else ("test/images", "test/masks")
        _save(server / "alone" / images / f"case_{i:03d}.nii.gz", image)
        _save(server / "alone" / labels / f"case_{i:03d}.nii.gz", label)
    keys = {"dataset": "nifti-folder", "data_dir": str(server / "alone"), "clients": 2, "val_fraction": 0.0}
    keys["nifti-folder"] = {"image_size": 16}
    config = build_config(RunConfig(), {**keys, "site_data_dir": str(tmp_path / "site-{site}")})
    prepared = prepare_data(config)
    counts = [_labelled_slices(_synthetic_case(i)[1]) for i in range(2)]
    assert len(prepared.dataset.train) == 0 and len(prepared.dataset.test) == sum(counts)
    assert prepared.dataset.info.class_names == ("background", "class-1")
    with pytest.raises(DataError, match="holds neither imagesTr/ nor train/"):  # not as a run's only data
        load_dataset("nifti-folder", server / "alone", image_size=16)


def test_the_default_partition_names_natural_where_it_fails_and_warns_where_it_spreads_cases(
    tmp_path, caplog
) -> None:
    """The run's default partition (dirichlet) cuts slices, not cases: with few cases it cannot give each
    site a validation shard, and the error names `--partition natural`; where it runs, one warning says the
    slices of a case are spread over sites; `natural` gives whole cases, without that warning."""
    from fedistill.engine.setup import prepare_data

    keys = {"dataset": "nifti-folder", "clients": 2, "nifti-folder": {"image_size": 16}}
    few = build_config(RunConfig(), {**keys, "data_dir": str(_msd(tmp_path / "few", cases=4, test=1))})
    assert few.partition == "dirichlet"
    with pytest.raises(PartitionError, match=r"validation shard.*--partition natural"):
        prepare_data(few)
    more = build_config(RunConfig(), {**keys, "data_dir": str(_msd(tmp_path / "more", cases=8, test=1))})
    with caplog.at_level(logging.WARNING, logger="fedistill"):
        prepare_data(more)
    spread = [r.getMessage() for r in caplog.records if "spread" in r.getMessage()]
    assert len(spread) == 1 and 'partition = "natural"' in spread[0], spread
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedistill"):
        prepare_data(more.replace(partition="natural"))
        prepare_data(few.replace(partition="natural"))
    assert not [r for r in caplog.records if "spread" in r.getMessage()]


@pytest.mark.parametrize(("layout", "folder"), [("decathlon", "imagesTr/"), ("train-test", "train/")])
def test_a_server_of_test_cases_alone_with_a_validation_split_names_its_own_layouts_folder(
    tmp_path, layout, folder
) -> None:
    from fedistill.engine.setup import prepare_data

    images, labels = ("imagesTs", "labelsTs") if layout == "decathlon" else ("test/images", "test/masks")
    for i in range(2):
        image, label = _synthetic_case(i)
        _save(tmp_path / "server" / images / f"case_{i:03d}.nii.gz", image)
        _save(tmp_path / "server" / labels / f"case_{i:03d}.nii.gz", label)
    keys = {
        "dataset": "nifti-folder",
        "data_dir": str(tmp_path / "server"),
        "clients": 2,
        "val_fraction": 0.1,
    }
    keys["nifti-folder"] = {"image_size": 16}
    config = build_config(RunConfig(), {**keys, "site_data_dir": str(tmp_path / "site-{site}")})
    with pytest.raises(DataError, match=r"val_fraction = 0\.1") as error:
        prepare_data(config)
    assert f"cut from its {folder}" in str(error.value)
    assert (" train/" in str(error.value)) == (folder == "train/"), str(error.value)


@pytest.mark.parametrize(
    ("labels", "named"),
    [
        ({"0": "background", "1": "spleen"}, "spleen"),  # the Decathlon's form
        ({"background": 0, "tumour": 2}, "tumour"),  # nnU-Net v2's, one value above 0 named
        ({"0": "background", "1": "edema", "2": "tumour"}, "class-1"),  # two classes: no one name
        ({"background": 0, "whole tumour": [1, 2]}, "class-1"),  # nnU-Net's regions: not read
        (None, "class-1"),  # no dataset.json
    ],
)
def test_foreground_takes_the_name_of_dataset_jsons_one_foreground_class(tmp_path, labels, named) -> None:
    root = _msd(tmp_path / "data", cases=3, test=1, labels=labels)
    data = load_dataset("nifti-folder", root, image_size=16, foreground=True)
    assert data.info.class_names == ("background", named)
