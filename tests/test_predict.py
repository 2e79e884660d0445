"""`fedistill predict`: a trained model's answers on files, by task, and one clear line for bad inputs.

Most tests use a stand-in for a loaded model (a module from the registry or a tiny hand-made one, with
the task, dataset facts and normalisation a run would give it), so the geometry and scaling of every
path can be checked exactly; one test predicts with a real one-round run through the command."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from torch import nn

from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.digits import load_digits_dataset
from fedistill.data.medical.volumes import scale_to_uint8
from fedistill.data.mri.kspace import fft2c
from fedistill.data.transforms import to_float
from fedistill.errors import ConfigError, DataError, UserError
from fedistill.inference.predict import add_arguments, predict_path, run_command
from fedistill.models import build_model
from fedistill.tasks import make_task

SEMANTIC = DatasetInfo("brats", 1, 24, 2, (0.2,), (0.3,), task="semantic-segmentation")
NUCLEI = DatasetInfo("monuseg", 3, 16, 2, (0.5,) * 3, (0.25,) * 3, task="instance-segmentation")
MRI = DatasetInfo("ixi", 1, 16, 2, (0.0,), (1.0,), task="reconstruction")


@dataclasses.dataclass
class Standin:
    """What `load_model` hands back, built here from a module: task, facts, config, normalisation."""

    module: nn.Module
    info: DatasetInfo
    config: RunConfig = dataclasses.field(default_factory=RunConfig)
    task: object = None
    algorithm: str = "fedavg"

    def __post_init__(self) -> None:
        self.module.eval()
        if self.task is None:
            self.task = make_task(self.info, self.config.options.get("task", {}))

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        return to_float(images if images.dim() == 4 else images[:, None], self.info)


class Threshold(nn.Module):
    """Class 1 where the normalised input exceeds `level`: its answer can be computed by hand."""

    def __init__(self, level: float = 0.5) -> None:
        super().__init__()
        self.level = level

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros_like(x), x - self.level], 1)


class NoCorrection(nn.Module):
    """A reconstruction net that learnt no correction: the task's residual returns the zero-filled input."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x) * self.scale


def _tiny(name: str, info: DatasetInfo, **options: object) -> nn.Module:
    torch.manual_seed(0)
    return build_model(name, info, options=options or None)


def _write_png(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _digits_model() -> tuple[Standin, object]:
    data = load_digits_dataset()
    return Standin(_tiny("mlp", data.info), data.info), data


def test_classification_csv_matches_the_evaluation_path(tmp_path):
    model, data = _digits_model()
    n = 40
    x, y = data.test.x[:n], data.test.y[:n]
    for i in range(n):
        _write_png(tmp_path / "in" / str(int(y[i])) / f"{i:03d}.png", x[i, 0].numpy())
    result = predict_path(model, tmp_path / "in", tmp_path / "out.csv")
    assert (result.count, result.resized) == (n, 0)
    rows = {row["path"]: row for row in _rows(tmp_path / "out.csv")}
    logits = model.task.outputs(model.module, ImageSet(x, y), data.info)
    probabilities = logits.softmax(1)
    for i in range(n):
        row = rows[f"{int(y[i])}/{i:03d}.png"]
        assert int(row["label"]) == int(logits[i].argmax())
        assert row["class_name"] == data.info.class_names[int(row["label"])]
        assert float(row["confidence"]) == pytest.approx(float(probabilities[i].max()), abs=1e-6)
        assert row["resized_from"] == ""
    accuracy = np.mean([int(r["label"]) == int(r["path"].split("/")[0]) for r in rows.values()])
    evaluated = model.task.evaluate(model.module, ImageSet(x, y), data.info)["accuracy"]
    assert accuracy == pytest.approx(evaluated)


def test_classification_converts_channels_and_says_what_it_resized(tmp_path):
    model, data = _digits_model()
    rgb = np.repeat(np.kron(data.test.x[0, 0].numpy(), np.ones((2, 2), np.uint8))[:, :, None], 3, axis=2)
    _write_png(tmp_path / "in" / "rgb16.png", rgb)
    tifffile.imwrite(tmp_path / "in" / "grey16bit.tif", data.test.x[1, 0].numpy().astype(np.uint16) * 257)
    _write_png(tmp_path / "in" / "native.png", data.test.x[2, 0].numpy())
    result = predict_path(model, tmp_path / "in", tmp_path / "out")  # a folder gets predictions.csv
    assert result.output == tmp_path / "out" / "predictions.csv" and result.resized == 1
    rows = {row["path"]: row for row in _rows(result.output)}
    assert rows["rgb16.png"]["resized_from"] == "16x16"
    assert rows["grey16bit.tif"]["resized_from"] == rows["native.png"]["resized_from"] == ""
    expected = model.task.outputs(model.module, ImageSet(data.test.x[1:3], data.test.y[1:3]), data.info)
    assert int(rows["grey16bit.tif"]["label"]) == int(expected[0].argmax())
    assert int(rows["native.png"]["label"]) == int(expected[1].argmax())


@pytest.mark.parametrize("suffix", [".ppm", ".pgm", ".gif", ".webp"])
def test_classification_reads_every_format_image_folder_trains_on(tmp_path, suffix):
    """`image-folder` trains on PPM, PGM, GIF and WebP files; predict refused them (a single file) or
    left them out of the CSV without a word (in a folder beside PNGs)."""
    model, data = _digits_model()
    image = data.test.x[0, 0].numpy()
    _write_png(tmp_path / "in" / "a.png", image)
    Image.fromarray(image).save(
        tmp_path / "in" / f"b{suffix}", **({"lossless": True} if suffix == ".webp" else {})
    )
    result = predict_path(model, tmp_path / "in", tmp_path / "out.csv")
    rows = {row["path"]: row for row in _rows(result.output)}
    assert result.count == 2 and set(rows) == {"a.png", f"b{suffix}"}
    assert rows[f"b{suffix}"]["label"] == rows["a.png"]["label"]
    assert rows[f"b{suffix}"]["confidence"] == rows["a.png"]["confidence"]
    alone = predict_path(model, tmp_path / "in" / f"b{suffix}", tmp_path / "alone.csv")
    assert alone.count == 1


def test_semantic_segmentation_writes_masks_on_each_image_grid(tmp_path):
    model = Standin(_tiny("unet", SEMANTIC, width=4, depth=2), SEMANTIC)
    rng = np.random.default_rng(0)
    odd = _write_png(tmp_path / "in" / "odd.png", rng.integers(0, 256, (40, 52), dtype=np.uint8))
    native = rng.integers(0, 256, (24, 24), dtype=np.uint8)
    _write_png(tmp_path / "in" / "sub" / "native.png", native)
    tifffile.imwrite(tmp_path / "in" / "slice.tif", rng.integers(0, 256, (30, 20), dtype=np.uint8))
    predict_path(model, tmp_path / "in", tmp_path / "out")
    masks = {
        p: np.asarray(Image.open(tmp_path / "out" / p)) for p in ("odd.png", "sub/native.png", "slice.png")
    }
    assert masks["odd.png"].shape == np.asarray(Image.open(odd)).shape
    assert masks["slice.png"].shape == (30, 20)
    for mask in masks.values():
        assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
    with torch.no_grad():
        direct = model.module(model.preprocess(torch.from_numpy(native)[None])).argmax(1)[0].numpy()
    np.testing.assert_array_equal(masks["sub/native.png"], direct)


def test_instance_segmentation_stitches_patches_into_one_instance_map(tmp_path):
    model = Standin(_tiny("unet", dataclasses.replace(NUCLEI, num_classes=3), width=4, depth=2), NUCLEI)
    model.config = RunConfig(dataset="monuseg", options={"monuseg": {"stride": 8}})
    rng = np.random.default_rng(1)
    _write_png(tmp_path / "in" / "tile.png", rng.integers(0, 256, (40, 23, 3), dtype=np.uint8))
    predict_path(model, tmp_path / "in", tmp_path / "out")
    instances = np.asarray(Image.open(tmp_path / "out" / "tile.png"))
    assert instances.shape == (40, 23) and instances.dtype == np.uint16


def _nifti(path: Path, data: np.ndarray, affine: np.ndarray) -> Path:
    image = nib.Nifti1Image(data.astype(np.float32), affine)
    image.header.set_xyzt_units("mm")
    nib.save(image, str(path))
    return path


def _blobs(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A smooth positive volume, different along every axis and in every direction."""
    grids = np.meshgrid(*(np.linspace(-1, 1, n) for n in shape), indexing="ij")
    centre = np.exp(-sum((g - c) ** 2 for g, c in zip(grids, (0.5, -0.5, 0.4), strict=True)) * 3)
    ramp = 0.6 * (grids[0] + 1) + 0.5 * (1 - grids[1]) ** 2 + 0.4 * (grids[2] + 1)
    noise = np.random.default_rng(seed).random(shape) * 0.05
    return (centre + ramp + noise).astype(np.float32)


# stored axes -> superior (3 mm), left (10 mm), posterior (10 mm): far from RAS, so the geometry is tested
OBLIQUE = np.array([[0.0, -10.0, 0.0, 5.0], [0.0, 0.0, -10.0, -3.0], [3.0, 0.0, 0.0, 7.0], [0, 0, 0, 1.0]])


def test_segmentation_of_a_nifti_volume_keeps_its_grid_affine_and_header(tmp_path):
    model = Standin(Threshold(), dataclasses.replace(SEMANTIC, mean=(0.0,), std=(1.0,)))
    data = _blobs((6, 20, 24), seed=0)
    data[:, :2] = 0.0  # background the percentile scale leaves out
    (tmp_path / "in").mkdir()
    source = _nifti(tmp_path / "in" / "head.nii.gz", data, OBLIQUE)
    _nifti(tmp_path / "in" / "other.nii", _blobs((30, 28, 5), seed=1), np.diag([1.0, 1.0, 2.0, 1.0]))
    predict_path(model, tmp_path / "in", tmp_path / "out")
    answer = nib.load(str(tmp_path / "out" / "head.nii.gz"))
    labels = np.asarray(answer.dataobj)
    stored = nib.load(str(source))
    assert labels.shape == data.shape and labels.dtype == np.uint8
    np.testing.assert_array_equal(answer.affine, stored.affine)
    assert answer.header.get_zooms() == stored.header.get_zooms()
    assert answer.header["sform_code"] == stored.header["sform_code"]
    assert answer.header["qform_code"] == stored.header["qform_code"]
    # 10 mm voxels: the 240 mm field of view is 24 pixels, the model's size, so every voxel is exact
    expected = scale_to_uint8(data, data > 0, "volume-percentile", "test") >= 128
    np.testing.assert_array_equal(labels, expected.astype(np.uint8))
    other = np.asarray(nib.load(str(tmp_path / "out" / "other.nii")).dataobj)
    assert other.shape == (30, 28, 5) and set(np.unique(other)) <= {0, 1}


def _head_scan(size: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """A head at 4 mm voxels (X, Y, Z): a grey brain (radius 48 mm) with a bright lesion, dark CSF and
    skull (8 mm), a scalp as bright as fat (8 mm); and the lesion mask."""
    yy, xx = np.mgrid[:size, :size] - (size - 1) / 2
    r = np.hypot(yy, xx)
    image = np.where(r <= 12, 0.4, 0.0) + np.where((r > 14) & (r <= 16), 1.0, 0.0)
    lesion = np.hypot(yy - 3, xx + 2) <= 3
    image = np.where(lesion, 0.9, image) + 0.01
    image[r > 16] = 0.0
    return np.repeat(image[:, :, None], 3, axis=2), np.repeat(lesion[:, :, None], 3, axis=2)


@pytest.mark.parametrize(("dataset", "level"), [("brats", 0.5), ("brats-synthetic-lesions", 0.8)])
def test_skull_strip_segments_the_brain_of_a_head_scan_and_not_its_scalp(tmp_path, dataset, level):
    """Without brain extraction the bright scalp is called lesion; with it only the lesion is, on the
    run's own scale (the semi-synthetic hosts': the brain's median at HOST_MEDIAN, 0.51, the lesion, over
    twice as bright, clipped at 1, so a threshold of 0.8 between sees it)."""
    info = dataclasses.replace(SEMANTIC, image_size=60, mean=(0.0,), std=(1.0,))
    model = Standin(Threshold(level), info, RunConfig(dataset=dataset))
    data, lesion = _head_scan()
    scalp = data > 0.95
    (tmp_path / "in").mkdir()
    _nifti(tmp_path / "in" / "head.nii.gz", data, np.diag([4.0, 4.0, 4.0, 1.0]))
    predict_path(model, tmp_path / "in", tmp_path / "whole")
    whole = np.asarray(nib.load(str(tmp_path / "whole" / "head.nii.gz")).dataobj) == 1
    assert whole[scalp].all()
    for rule in (True, "outline", "tissue"):  # True: the outline rule, `--skull-strip` without a rule
        predict_path(model, tmp_path / "in", tmp_path / f"brain-{rule}", skull_strip=rule)
        brain = np.asarray(nib.load(str(tmp_path / f"brain-{rule}" / "head.nii.gz")).dataobj) == 1
        assert not brain[scalp].any() and brain[lesion].all() and not brain[~lesion].any()
    with pytest.raises(ConfigError, match="unknown brain extraction rule 'bet'"):
        predict_path(model, tmp_path / "in", tmp_path / "bet", skull_strip="bet")
    with pytest.raises(ConfigError, match="--skull-strip applies to NIfTI volumes"):
        _write_png(tmp_path / "png" / "slice.png", np.zeros((8, 8), dtype=np.uint8))
        predict_path(model, tmp_path / "png", tmp_path / "out", skull_strip=True)


def _reconstruction(config: RunConfig | None = None, module: nn.Module | None = None) -> Standin:
    config = config or RunConfig(
        dataset="ixi", options={"task": {"acceleration": 2.0, "center_fraction": 0.2}}
    )
    return Standin(module or NoCorrection(), MRI, config)


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def _assert_aligned(answer: np.ndarray, truth: np.ndarray) -> None:
    """`answer` resembles `truth` closely, and more than it resembles any flip of it along an axis."""
    matched = _correlation(answer, truth)
    assert matched > 0.9
    for axis in range(truth.ndim):
        assert matched > _correlation(answer, np.flip(truth, axis)) + 0.05, axis


@pytest.mark.parametrize("axis", ["axial", "stored"])
def test_reconstruction_of_a_nifti_volume_lies_on_its_grid(tmp_path, axis):
    options = {"task": {"acceleration": 2.0, "center_fraction": 0.2}, "ixi": {"slice_axis": axis}}
    model = _reconstruction(RunConfig(dataset="ixi", options=options))
    data = _blobs((14, 18, 5), seed=2) * 300.0
    affine = np.array([[0, 0, 2.0, 0], [-1.2, 0, 0, 0], [0, 1.2, 0, 0], [0, 0, 0, 1.0]])
    source = _nifti(tmp_path / "t1.nii.gz", data, affine)
    predict_path(model, source, tmp_path / "out")
    answer = nib.load(str(tmp_path / "out" / "t1.nii.gz"))
    recon = np.asarray(answer.dataobj)
    assert recon.shape == data.shape and recon.dtype == np.float32
    np.testing.assert_array_equal(answer.affine, nib.load(str(source)).affine)
    assert recon.min() >= 0 and 0.5 * data.max() < recon.max() < 1.5 * data.max()  # the input's units
    _assert_aligned(recon, data)


def test_reconstruction_with_a_trained_net_and_data_consistency(tmp_path):
    task = {"acceleration": 4.0, "center_fraction": 0.08, "data_consistency": True}
    net = _tiny("unet-fastmri", MRI, chans=4, num_pool_layers=2)
    model = _reconstruction(RunConfig(dataset="ixi", options={"task": task}), net)
    _nifti(tmp_path / "t2.nii", _blobs((16, 16, 3), seed=3), np.eye(4))
    predict_path(model, tmp_path / "t2.nii", tmp_path / "out")
    recon = np.asarray(nib.load(str(tmp_path / "out" / "t2.nii")).dataobj)
    assert recon.shape == (16, 16, 3) and np.isfinite(recon).all()


def _fastmri_file(path: Path, images: np.ndarray, mask: np.ndarray | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    kspace = fft2c(torch.from_numpy(images)).numpy().astype(np.complex64)
    with h5py.File(path, "w") as f:
        f.create_dataset("kspace", data=kspace if mask is None else kspace * mask)
        if mask is not None:
            f.create_dataset("mask", data=mask)
        f.attrs["acquisition"] = "AXT1"
    return path


def test_reconstruction_of_fastmri_kspace(tmp_path, caplog):
    images = _blobs((3, 20, 20), seed=4)
    mask = np.zeros(20, np.float32)
    mask[::2] = 1.0
    mask[8:12] = 1.0
    _fastmri_file(tmp_path / "in" / "full.h5", images)
    _fastmri_file(tmp_path / "in" / "measured.h5", images, mask)
    coils = np.stack([images * 0.8, images * 0.6], axis=1)
    with h5py.File(tmp_path / "in" / "coils.h5", "w") as f:
        f.create_dataset("kspace", data=fft2c(torch.from_numpy(coils)).numpy().astype(np.complex64))
    # a file measured on its own mask cannot take data consistency on the run's grid: it is skipped, said once
    task = {"acceleration": 2.0, "center_fraction": 0.2, "data_consistency": True}
    with_dc = RunConfig(dataset="ixi", options={"task": task})
    with caplog.at_level("WARNING", logger="fedistill.inference.reconstruct"):
        predict_path(_reconstruction(with_dc), tmp_path / "in", tmp_path / "out")
    skipped = [r.getMessage() for r in caplog.records if "without data consistency" in r.getMessage()]
    assert len(skipped) == 1 and "measured.h5" in skipped[0]
    for name in ("full.h5", "measured.h5", "coils.h5"):
        with h5py.File(tmp_path / "out" / name, "r") as f:
            recon = np.asarray(f["reconstruction"])
            assert recon.shape == (3, 20, 20) and recon.dtype == np.float32
            _assert_aligned(recon, images)
    with h5py.File(tmp_path / "out" / "full.h5", "r") as f:
        assert f.attrs["acquisition"] == "AXT1" and f.attrs["undersampled_by"] == "run task mask"


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "empty").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("x")
    _nifti(tmp_path / "volume.nii.gz", _blobs((8, 8, 3), seed=0), np.eye(4))
    _nifti(tmp_path / "zeros.nii.gz", np.zeros((8, 8, 3)), np.eye(4))
    _write_png(tmp_path / "image.png", np.zeros((8, 8), np.uint8))
    (tmp_path / "broken.png").write_bytes(b"not a png at all")
    (tmp_path / "broken.nii.gz").write_bytes(gzip.compress(b"not a nifti header"))
    tifffile.imwrite(tmp_path / "five.tif", np.zeros((8, 8, 5), np.uint8), planarconfig="contig")
    with h5py.File(tmp_path / "nokspace.h5", "w") as f:
        f.create_dataset("image", data=np.zeros((2, 8, 8)))
    _fastmri_file(tmp_path / "measured.h5", np.ones((2, 16, 16), np.float32), np.ones(16, np.float32))
    return {p.name: p for p in tmp_path.iterdir()}


@pytest.mark.parametrize(
    ("task", "name", "error", "words"),
    [
        ("classification", "missing.png", DataError, "does not exist"),
        ("classification", "empty", DataError, "holds no file predict reads"),
        ("classification", "notes.txt", DataError, "is not a file predict reads"),
        ("classification", "volume.nii.gz", DataError, "is a NIfTI volume, but the classification model"),
        ("reconstruction", "image.png", DataError, "k-space in fastMRI's layout"),
        ("instance-segmentation", "volume.nii.gz", DataError, "takes an image"),
        ("classification", "broken.png", DataError, "cannot read image"),
        ("classification", "five.tif", DataError, "has 5 channels; the model takes greyscale images"),
        ("semantic-segmentation", "broken.nii.gz", DataError, "cannot read NIfTI volume"),
        ("semantic-segmentation", "zeros.nii.gz", DataError, "no brain voxels"),
        ("reconstruction", "nokspace.h5", DataError, "has no `kspace` dataset"),
    ],
)
def test_bad_inputs_end_in_one_line_that_names_the_file(tmp_path, task, name, error, words):
    files = _bad_inputs(tmp_path / "files")
    path = files.get(name, tmp_path / "files" / name)
    models = {
        "classification": lambda: _digits_model()[0],
        "semantic-segmentation": lambda: Standin(Threshold(), SEMANTIC),
        "instance-segmentation": lambda: Standin(Threshold(), NUCLEI),
        "reconstruction": _reconstruction,
    }
    with pytest.raises(error) as caught:
        predict_path(models[task](), path, tmp_path / "out")
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert name in message


def test_refusals_before_any_work(tmp_path):
    model, data = _digits_model()
    image = _write_png(tmp_path / "a.png", data.test.x[0, 0].numpy())
    (tmp_path / "out.csv").write_text("old")
    with pytest.raises(ConfigError, match="already exists; pass --overwrite"):
        predict_path(model, image, tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_text() == "old"
    predict_path(model, image, tmp_path / "out.csv", overwrite=True)
    assert len(_rows(tmp_path / "out.csv")) == 1
    with pytest.raises(ConfigError, match="--batch-size"):
        predict_path(model, image, tmp_path / "x.csv", batch_size=0)
    segmenter = Standin(Threshold(), SEMANTIC)
    with pytest.raises(ConfigError, match="would replace that input"):
        predict_path(segmenter, image, tmp_path, overwrite=True)
    with pytest.raises(ConfigError, match="is a file; the answers go to a folder"):
        predict_path(segmenter, image, tmp_path / "out.csv")
    text = dataclasses.replace(data.info, task="text-classification")
    with pytest.raises(ConfigError, match="does not handle 'text-classification'"):
        predict_path(Standin(model.module, text), image, tmp_path / "t.csv")


def test_predict_command_on_a_real_run(tmp_path, capsys):
    from fedistill.cli import main
    from fedistill.inference.loading import load_model

    run = ["run", "--algorithm", "fedavg", "--clients", "2", "--rounds", "1", "--model", "mlp", "--quiet"]
    assert main([*run, "--out", str(tmp_path / "runs"), "--name", "digits"]) == 0
    data = load_digits_dataset()
    for i in range(12):
        _write_png(tmp_path / "images" / str(int(data.test.y[i])) / f"{i}.png", data.test.x[i, 0].numpy())
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = [str(tmp_path / "runs" / "digits"), "--algorithm", "fedavg", "--input", str(tmp_path / "images")]
    args = parser.parse_args([*argv, "--output", str(tmp_path / "labels.csv")])
    capsys.readouterr()
    assert run_command(args) == 0
    out = capsys.readouterr().out
    assert "fedavg (classification): 12 input(s)" in out
    assert "fedavg's global model: the last round's model (round 1 of 1; no selection" in out  # which one
    rows = {row["path"]: int(row["label"]) for row in _rows(tmp_path / "labels.csv")}
    expected = load_model(tmp_path / "runs" / "digits", "fedavg").predict(data.test.x[:12])
    assert [rows[f"{int(data.test.y[i])}/{i}.png"] for i in range(12)] == expected.tolist()
    with pytest.raises(UserError, match="already exists"):
        run_command(args)


def test_skull_strip_takes_an_optional_rule_on_the_command_line():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = ["RUN", "--input", "in", "--output", "out"]
    assert parser.parse_args(base).skull_strip == ""  # no extraction
    assert parser.parse_args([*base, "--skull-strip"]).skull_strip == "outline"
    assert parser.parse_args([*base, "--skull-strip", "tissue"]).skull_strip == "tissue"
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--skull-strip", "bet"])


def test_a_tiff_stack_is_refused_and_a_planar_rgb_tiff_read_as_rgb(tmp_path):
    """A stack of three greyscale pages was read as one RGB image (and of two, as grey with alpha)."""
    from fedistill.errors import DataError
    from fedistill.inference.images import read_image

    image = np.arange(3 * 16 * 16, dtype=np.uint16).reshape(3, 16, 16).astype(np.uint8)
    tifffile.imwrite(tmp_path / "stack.tif", image, photometric="minisblack")
    with pytest.raises(DataError, match=r"stack\.tif holds 3 images \(a TIFF stack\), not one 2D image"):
        read_image(tmp_path / "stack.tif")
    tifffile.imwrite(tmp_path / "planar.tif", image, photometric="rgb", planarconfig="separate")
    assert np.array_equal(read_image(tmp_path / "planar.tif"), image.transpose(1, 2, 0))


def test_a_compressed_tiff_is_read_as_training_reads_it_and_a_cut_one_is_one_line(tmp_path):
    """tifffile needs the optional imagecodecs package for LZW and JPEG compression, which image-folder
    (through Pillow) trains on: predict refused such files; a TIFF cut short in its header ended in a
    struct.error traceback, and one cut after it was called an array of shape (0,)."""
    from fedistill.inference.images import read_image

    grey = (np.arange(24 * 20).reshape(24, 20) % 251).astype(np.uint8)
    rgb = np.stack([grey, grey[::-1], 255 - grey], axis=2)
    Image.fromarray(grey).save(tmp_path / "grey.tif", compression="tiff_lzw")
    Image.fromarray(rgb).save(tmp_path / "rgb.tif", compression="tiff_lzw")
    assert np.array_equal(read_image(tmp_path / "grey.tif"), grey[:, :, None])
    assert np.array_equal(read_image(tmp_path / "rgb.tif"), rgb)
    whole = (tmp_path / "rgb.tif").read_bytes()
    for length in (6, 200):
        (tmp_path / "cut.tif").write_bytes(whole[:length])
        with pytest.raises(DataError, match=r"cannot read image .*cut\.tif"):
            read_image(tmp_path / "cut.tif")


def test_a_deflate_tiff_cut_short_in_its_pixels_is_one_line(tmp_path):
    """Deflate is tifffile's own codec: a file cut short inside its compressed pixels raised zlib.error, a
    traceback from predict and from image-folder alike."""
    from fedistill.inference.images import read_image

    rgb = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    tifffile.imwrite(tmp_path / "cut.tif", rgb, compression="zlib")
    assert np.array_equal(read_image(tmp_path / "cut.tif"), rgb)
    (tmp_path / "cut.tif").write_bytes((tmp_path / "cut.tif").read_bytes()[: 64 * 64 * 2])
    with pytest.raises(DataError, match=r"cannot read image .*cut\.tif"):
        read_image(tmp_path / "cut.tif")


def test_a_classifier_s_output_that_is_a_file_but_no_csv_is_refused_before_any_work(tmp_path):
    """`--output notes.txt` (an existing file) was taken for a folder to put predictions.csv in: every
    image was classified, then the command stopped with `run stopped: cannot write notes.txt: File
    exists`."""
    model, data = _digits_model()
    image = _write_png(tmp_path / "a.png", data.test.x[0, 0].numpy())
    (tmp_path / "notes.txt").write_text("old")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match=r"notes\.txt is a file, not a \.csv file"):
            predict_path(model, image, tmp_path / "notes.txt", overwrite=overwrite)
    assert (tmp_path / "notes.txt").read_text() == "old"


def test_skull_strip_scales_each_slice_by_its_brain_s_maximum_under_slice_max(tmp_path):
    """With `intensity = "slice-max"` a BraTS model learnt slices divided by their (skull-stripped)
    brain's maximum; brain extraction took each slice's maximum over the whole head, so the bright scalp
    set the scale and the lesion came out darker than any the model saw."""
    info = dataclasses.replace(SEMANTIC, image_size=60, mean=(0.0,), std=(1.0,))
    config = RunConfig(dataset="brats", options={"brats": {"intensity": "slice-max"}})
    model = Standin(Threshold(0.95), info, config)  # only the brightest voxels of the brain: the lesion
    data, lesion = _head_scan()
    (tmp_path / "in").mkdir()
    _nifti(tmp_path / "in" / "head.nii.gz", data, np.diag([4.0, 4.0, 4.0, 1.0]))
    predict_path(model, tmp_path / "in", tmp_path / "out", skull_strip="outline")
    found = np.asarray(nib.load(str(tmp_path / "out" / "head.nii.gz")).dataobj) == 1
    assert found[lesion].all() and not found[~lesion].any()


def test_a_wide_image_s_alpha_does_not_set_its_colours_scale(tmp_path):
    """A 16-bit RGBA TIFF was scaled by the maximum over its colours and its alpha together: an opaque
    alpha of 65535 over 12-bit colours left them 16 times darker than the nuclei loaders read them
    (alpha dropped first, then the colours scaled by their own maximum)."""
    from fedistill.data.eight_bit import to_uint8
    from fedistill.data.medical.nuclei_sets import read_rgb
    from fedistill.inference.images import read_image, to_channels

    colours = (np.arange(12 * 10 * 3).reshape(12, 10, 3) * 11 % 4096).astype(np.uint16)
    rgba = np.concatenate([colours, np.full((12, 10, 1), 65535, np.uint16)], axis=2)
    tifffile.imwrite(tmp_path / "rgba.tif", rgba, photometric="rgb", extrasamples=["unassalpha"])
    read = read_image(tmp_path / "rgba.tif")
    assert np.array_equal(read[:, :, :3], to_uint8(colours)) and (read[:, :, 3] == 255).all()
    rgb = to_channels(read, 3, tmp_path / "rgba.tif")
    assert np.array_equal(rgb.transpose(2, 0, 1), read_rgb(tmp_path / "rgba.tif"))


def test_answers_in_a_folder_inside_the_input_folder_are_not_read_as_inputs(tmp_path):
    """`--input scans --output scans/masks` run twice: the second run took the first run's masks for
    images and segmented them too (into scans/masks/masks/)."""
    model = Standin(Threshold(), SEMANTIC)
    for name in ("a", "b"):
        _write_png(tmp_path / "scans" / f"{name}.png", np.full((24, 24), 200, np.uint8))
    first = predict_path(model, tmp_path / "scans", tmp_path / "scans" / "masks")
    again = predict_path(model, tmp_path / "scans", tmp_path / "scans" / "masks", overwrite=True)
    assert first.count == again.count == 2
    assert sorted(p.name for p in (tmp_path / "scans" / "masks").iterdir()) == ["a.png", "b.png"]
    # answers beside their inputs (TIFF in, PNG out) still read every input
    (tmp_path / "tiffs").mkdir()
    for name in ("c", "d"):
        tifffile.imwrite(tmp_path / "tiffs" / f"{name}.tif", np.full((24, 24), 200, np.uint8))
    beside = predict_path(model, tmp_path / "tiffs", tmp_path / "tiffs")
    assert beside.count == 2 and (tmp_path / "tiffs" / "c.png").is_file()


def test_a_label_volume_drops_its_input_s_display_range(tmp_path):
    """The label volume kept the scan's display range (cal_min/cal_max, e.g. 0..3000), so a viewer that
    honours it showed labels 0 and 1 as black."""
    model = Standin(Threshold(), dataclasses.replace(SEMANTIC, mean=(0.0,), std=(1.0,)))
    image = nib.Nifti1Image(_blobs((6, 20, 24), seed=0) * 1000, OBLIQUE)
    image.header["cal_min"], image.header["cal_max"] = 0.0, 3000.0
    (tmp_path / "in").mkdir()
    nib.save(image, str(tmp_path / "in" / "scan.nii.gz"))
    predict_path(model, tmp_path / "in", tmp_path / "out")
    header = nib.load(str(tmp_path / "out" / "scan.nii.gz")).header
    assert (float(header["cal_min"]), float(header["cal_max"])) == (0.0, 0.0)  # 0, 0: no display range
