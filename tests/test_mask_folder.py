"""`mask-folder`: a user's own 2D images with label masks, for semantic segmentation; with sites holding
their own folders, a real fluorescence image's nuclei are learnt well beyond the trivial answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from fedistill.config import RunConfig, build_config
from fedistill.data.registry import load_dataset
from fedistill.engine.launch import run_suite
from fedistill.errors import ConfigError, DataError

NUCLEI = Path(__file__).resolve().parents[2] / "shared" / "data" / "nuclei"


def _pair(
    root: Path, part: str, name: str, image: np.ndarray, mask: np.ndarray, mask_ext: str = "png"
) -> None:
    (root / part / "images").mkdir(parents=True, exist_ok=True)
    (root / part / "masks").mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(root / part / "images" / f"{name}.png")
    if mask_ext == "tif":
        tifffile.imwrite(root / part / "masks" / f"{name}.tif", mask)
    else:
        Image.fromarray(mask).save(root / part / "masks" / f"{name}.{mask_ext}")


def _squares(root: Path, values: tuple[int, ...] = (1, 2), n: int = 3) -> Path:
    """Synthetic 16 x 16 images, a bright square per class value in the mask."""
    rng = np.random.default_rng(0)
    for part in ("train", "test"):
        for i in range(n):
            image = rng.integers(0, 60, (16, 16), dtype=np.uint8)
            mask = np.zeros((16, 16), np.uint8)
            for j, value in enumerate(values):
                mask[2 + 6 * j : 6 + 6 * j, 3:9] = value
            image[mask > 0] = 200
            _pair(root, part, f"case{i}", image, mask)
    return root


def test_masks_keep_their_values_and_images_are_read_as_predict_reads_them(tmp_path) -> None:
    data = load_dataset("mask-folder", _squares(tmp_path / "d"), image_size=8)
    assert data.info.task == "semantic-segmentation" and data.info.num_classes == 3
    assert data.info.class_names == ("background", "class-1", "class-2")
    assert data.train.x.shape == (3, 1, 8, 8) and data.train.y.shape == (3, 8, 8)
    assert sorted(np.unique(data.train.y.numpy()).tolist()) == [0, 1, 2]  # nearest: no value in between
    named = load_dataset("mask-folder", tmp_path / "d", image_size=16, classes=["bg", "cyst", "wall", "x"])
    assert named.info.num_classes == 4 and named.train.y.max() == 2


def test_a_binary_mask_saved_as_0_and_255_is_background_and_class_1(tmp_path) -> None:
    data = load_dataset("mask-folder", _squares(tmp_path / "d", values=(255,)), image_size=16)
    assert data.info.num_classes == 2 and sorted(np.unique(data.train.y.numpy()).tolist()) == [0, 1]


def test_a_sixteen_bit_mask_keeps_its_values(tmp_path) -> None:
    root = tmp_path / "d"
    for part in ("train", "test"):
        mask = np.zeros((16, 16), np.uint16)
        mask[4:8, 4:8] = 3
        _pair(root, part, "a", np.full((16, 16), 90, np.uint8), mask, mask_ext="tif")
    assert load_dataset("mask-folder", root, image_size=16).train.y.max() == 3


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        ("missing", r"1 image\(s\) under .*train/images have no mask of the same name .*\(case1\)"),
        ("colour", "is a colour mask; save each pixel's class as one value"),
        ("size", "is 8 x 8 pixels, its image .* 16 x 16; a mask must match its image"),
        ("beyond", "holds the value 2, but there are 2 classes"),
        ("layout", r"train/images is not a folder; expected the layout"),
    ],
)
def test_a_folder_a_model_cannot_learn_from_is_one_line_naming_the_file(tmp_path, spoil, named) -> None:
    root = _squares(tmp_path / "d")
    masks = root / "train" / "masks"
    options = {"image_size": 16}
    if spoil == "missing":
        (masks / "case1.png").unlink()
    elif spoil == "colour":
        Image.fromarray(
            np.dstack(
                [np.zeros((16, 16), np.uint8), np.ones((16, 16), np.uint8), np.zeros((16, 16), np.uint8)]
            )
        ).save(masks / "case1.png")
    elif spoil == "size":
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(masks / "case1.png")
    elif spoil == "beyond":
        options["classes"] = ["background", "cell"]
    else:
        (root / "train" / "images").rename(root / "train" / "pictures")
    with pytest.raises(DataError, match=named):
        load_dataset("mask-folder", root, **options)


def test_a_wrong_option_is_named(tmp_path) -> None:
    with pytest.raises(ConfigError, match="mask-folder option channels must be 1 or 3"):
        load_dataset("mask-folder", _squares(tmp_path / "d"), channels=2)


def _nuclei_sites(root: Path) -> Path:
    """The real fluorescence image's 125 nuclei as 64 x 64 tiles: the bottom quarter the server's test set
    (and a validation row), the rest split between two sites by image half."""
    image = tifffile.imread(NUCLEI / "fluorescence_image.tif").astype(np.float64)
    image = np.round(255 * (image - image.min()) / (image.max() - image.min())).astype(np.uint8)
    mask = np.where(tifffile.imread(NUCLEI / "fluorescence_instances.tif") > 0, 255, 0).astype(np.uint8)
    for row in range(8):
        for col in range(8):
            tile = np.s_[row * 64 : row * 64 + 64, col * 64 : col * 64 + 64]
            name = f"r{row}c{col}"
            if row >= 6:  # the server's test tiles
                _pair(root / "server", "test", name, image[tile], mask[tile])
            elif row == 5:  # the server's own labelled tiles (its validation split)
                _pair(root / "server", "train", name, image[tile], mask[tile])
            else:
                site = root / f"site-{col // 4}"
                _pair(site, "train" if row < 4 else "test", name, image[tile], mask[tile])
    return root


@pytest.mark.skipif(not NUCLEI.is_dir(), reason="the shared real nuclei image is not here")
def test_sites_with_their_own_tiles_learn_real_nuclei_beyond_the_trivial_answers(tmp_path) -> None:
    """Two sites, each holding its own half of a real fluorescence image's tiles (mask-folder), train FedAvg
    to a foreground Dice far above marking every pixel a nucleus (the best trivial answer; none marks 0)."""
    root = _nuclei_sites(tmp_path / "nuclei")
    keys = {
        "algorithm": "fedavg",
        "dataset": "mask-folder",
        "data_dir": str(root / "server"),
        "site_data_dir": str(root / "site-{site}"),
        "clients": 2,
        "rounds": 6,
        "local_epochs": 5,
        "batch_size": 8,
        "optimizer": "adam",
        "lr": 5e-3,
        "model": "unet",
        "threads": 1,
        "mask-folder": {"image_size": 32},
        "model_options": {"width": 8, "depth": 2},
    }
    summary = run_suite(build_config(RunConfig(), keys), tmp_path / "run", progress=False)[0]
    test = load_dataset("mask-folder", root / "server", image_size=32).test
    share = float((test.y > 0).double().mean())  # the test tiles' nucleus share
    everything = 2 * share / (1 + share)  # Dice of marking every pixel a nucleus (pooled; per tile lower)
    assert summary["partition"]["method"] == "own-data" and summary["clients"] == 2
    assert summary["final"]["test_dice"] > everything + 0.3, (summary["final"]["test_dice"], everything)


def test_a_jpeg_mask_is_refused_rather_than_read_as_hundreds_of_classes(tmp_path) -> None:
    """JPEG compression moves pixel values near an edge: a 0/255 mask saved as JPEG holds 1, 2, 254, ...,
    each of which would be read as a class of its own."""
    root = tmp_path / "d"
    for part in ("train", "test"):
        mask = np.zeros((32, 32), np.uint8)
        mask[5:20, 7:25] = 255
        _pair(root, part, "a", np.full((32, 32), 90, np.uint8), mask, mask_ext="jpg")
    with pytest.raises(DataError, match=r"a\.jpg is a JPEG.*save masks as PNG or TIFF"):
        load_dataset("mask-folder", root, image_size=16)


def test_an_lzw_compressed_tiff_mask_is_read_as_an_lzw_tiff_image_is(tmp_path) -> None:
    """LZW, the usual compression of TIFF masks, needs the optional imagecodecs package in tifffile; the
    images fall back to Pillow there, and so do the masks."""
    root = tmp_path / "d"
    for part in ("train", "test"):
        mask = np.zeros((16, 16), np.uint8)
        mask[4:8, 4:8] = 2
        _pair(root, part, "a", np.full((16, 16), 90, np.uint8), mask)
        Image.fromarray(mask).save(root / part / "masks" / "a.tif", compression="tiff_lzw")
        (root / part / "masks" / "a.png").unlink()
    data = load_dataset("mask-folder", root, image_size=16)
    assert data.train.y.max() == 2 and int((data.train.y == 2).sum()) == 16


def test_a_grey_mask_with_an_alpha_channel_keeps_its_grey_values(tmp_path) -> None:
    root = tmp_path / "d"
    for part in ("train", "test"):
        mask = np.zeros((16, 16), np.uint8)
        mask[4:8, 4:8] = 1
        _pair(root, part, "a", np.full((16, 16), 90, np.uint8), mask)
        alpha = np.full((16, 16), 255, np.uint8)
        Image.fromarray(np.dstack([mask, alpha]), "LA").save(root / part / "masks" / "a.png")
    data = load_dataset("mask-folder", root, image_size=16)
    assert data.info.num_classes == 2 and int(data.train.y.sum()) == 16


def test_a_sites_mask_beyond_the_servers_classes_says_where_the_servers_classes_come_from(tmp_path) -> None:
    """A site's mask may hold a value the server's masks lack; the server's classes, which the site takes,
    come from its training masks' largest value (not from folders, nor from an option the user set)."""
    from fedistill.engine.site_data import load_site

    server = load_dataset("mask-folder", _squares(tmp_path / "server", values=(1,)), image_size=16)
    _squares(tmp_path / "site-0", values=(1, 2))
    keys = {"dataset": "mask-folder", "data_dir": str(tmp_path / "server"), "clients": 1}
    config = build_config(RunConfig(), {**keys, "site_data_dir": str(tmp_path / "site-{site}")})
    with pytest.raises(DataError) as caught:
        load_site(config, 0, server.info)
    assert str(caught.value) == (
        f"site 0's folder {tmp_path / 'site-0'}: mask-folder: a mask under {tmp_path / 'site-0'} holds the "
        "value 2, but the server has 2 classes (background, class-1); the server's come from the largest "
        "value in its data_dir's training masks (its test masks where it has no train/): where they lack a "
        "class, set mask-folder.classes to every class name, by value"
    )


def test_an_instance_map_is_refused_naming_foreground_which_reads_its_objects(tmp_path) -> None:
    """A nuclei set's masks hold one id per object (hundreds of values): read value by value they were
    hundreds of classes without a word; now the line names `foreground`, which reads every object as one
    class against the background."""
    root = tmp_path / "d"
    for part in ("train", "test"):
        ids = np.zeros((48, 48), np.uint16)
        for k in range(40):  # 40 objects, ids 1..40, each a 2 x 2 square
            row, col = divmod(k, 8)
            ids[row * 6 + 1 : row * 6 + 3, col * 6 + 1 : col * 6 + 3] = k + 1
        _pair(root, part, "a", np.where(ids > 0, 220, 30).astype(np.uint8), ids, mask_ext="tif")
    with pytest.raises(
        DataError, match=r"read as 41 classes: an instance map .* mask-folder.foreground = true"
    ):
        load_dataset("mask-folder", root, image_size=48)
    objects = load_dataset("mask-folder", root, image_size=48, foreground=True)
    assert objects.info.num_classes == 2 and int(objects.train.y.sum()) == 40 * 4
    with pytest.raises(ConfigError, match="mask-folder option foreground must be true or false"):
        load_dataset("mask-folder", root, image_size=48, foreground="false")


def test_image_folder_pointed_at_a_mask_folder_names_mask_folder(tmp_path) -> None:
    """images/ and masks/ read as two classes would train a classifier of scans against their masks."""
    with pytest.raises(DataError, match="holds images/ and masks/, the layout of mask-folder"):
        load_dataset("image-folder", _squares(tmp_path / "d"), channels=1, image_size=16)


def test_a_server_of_test_masks_alone_serves_sites_that_hold_out_no_validation_split(tmp_path) -> None:
    """With val_fraction = 0 a mask-folder server holding test/ alone serves: its classes come from its test
    masks, its normalisation from its test images; before, its missing train/ stopped the run."""
    import shutil

    _squares(tmp_path / "full", values=(1, 2))
    shutil.copytree(tmp_path / "full" / "test", tmp_path / "server" / "test")
    _squares(tmp_path / "site-0", values=(1, 2), n=3)
    _squares(tmp_path / "site-1", values=(1, 2), n=4)
    keys = {
        "algorithm": "fedavg",
        "dataset": "mask-folder",
        "data_dir": str(tmp_path / "server"),
        "site_data_dir": str(tmp_path / "site-{site}"),
        "clients": 2,
        "rounds": 1,
        "val_fraction": 0.0,
        "model": "unet",
        "threads": 1,
        "mask-folder": {"image_size": 16},
        "model_options": {"width": 4, "depth": 2},
    }
    (summary,) = run_suite(build_config(RunConfig(), keys), tmp_path / "run", progress=False)
    assert summary["partition"]["sizes"] == [3, 4] and summary["rounds_done"] == 1
    server = load_dataset("mask-folder", tmp_path / "server", image_size=16, test_alone=True)
    assert len(server.train) == 0 and server.train.y.shape[1:] == (16, 16)
    assert server.info.class_names == ("background", "class-1", "class-2")


def test_a_mask_folder_model_given_a_nifti_volume_is_told_it_learned_images(tmp_path) -> None:
    """A model of 2D images knows nothing of how a volume would become its slices (orientation, intensity
    window, field of view): it went through the brain sets' steps and answered without a word."""
    import nibabel as nib

    from fedistill.inference.loading import load_model
    from fedistill.inference.predict import predict_path

    _squares(tmp_path / "data")
    keys = {
        "algorithm": "fedavg",
        "dataset": "mask-folder",
        "data_dir": str(tmp_path / "data"),
        "clients": 1,
        "rounds": 1,
        "model": "unet",
        "threads": 1,
        "mask-folder": {"image_size": 16},
        "model_options": {"width": 4, "depth": 2},
    }
    run_suite(build_config(RunConfig(), keys), tmp_path / "run", progress=False)
    volume = np.zeros((16, 16, 3), np.float32)
    volume[4:10, 4:10] = 100.0
    nib.save(nib.Nifti1Image(volume, np.eye(4)), str(tmp_path / "scan.nii.gz"))
    model = load_model(tmp_path / "run", "fedavg")
    with pytest.raises(ConfigError, match=r"learned 2D images of mask-folder, not volumes.*nifti-folder"):
        predict_path(model, tmp_path / "scan.nii.gz", tmp_path / "out")
    assert not (tmp_path / "out").exists()
