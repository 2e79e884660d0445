"""`fedistill deploy site-folders`: a dataset's simulated partition written as the folders a consortium
would hold, to rehearse a deployment whose sites hold only their own records (site_data.py).

    fedistill deploy site-folders --out DIR [--dataset mnist --data-dir data --clients 10 --alpha 0.5 ...]

The run's partition (the same keys and seed as `fedistill run`) is cut as a run cuts it, then written, pixels
exactly as loaded, as image folders (`train/<class>/*.png`, `test/<class>/*.png`) or, for a semantic
segmentation set, as mask folders (`train/images/*.png` with `train/masks/*.png`, a class per pixel):

    DIR/server/train   the validation holdout (the server's labelled data; a run holds out val_fraction of it;
                       none with val_fraction = 0, and the printed command then says val_fraction = 0)
    DIR/server/test    the whole test set, which scores every model
    DIR/site-K/train   site K's training records (a run holds out val_fraction of them)
    DIR/site-K/test    site K's shard of the test set (its local test set)

It prints the `fedistill run` command that trains on them. Sets of 8-bit images only; the folders are a copy
of the dataset, so its licence applies to them.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from fedistill.config import RunConfig, build_config, load_toml, parse_assignment, toml_literal
from fedistill.data.base import ImageSet
from fedistill.engine.key_homes import key_homes
from fedistill.engine.setup import Prepared, check_sections, prepare_data
from fedistill.engine.summary import partition_text
from fedistill.errors import ConfigError, DataError

#: The dataset each task's folders are read back as.
FORMATS = {"classification": "image-folder", "semantic-segmentation": "mask-folder"}
#: The flags that choose the data and its partition, each a config key of `fedistill run`.
KEYS = {"dataset": str, "data_dir": str, "clients": int, "partition": str, "alpha": float, "seed": int}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder to write (new, or empty)")
    parser.add_argument("--config", help="a run's config file: its dataset and partition keys are used")
    for key, kind in KEYS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind, help=f"the run's {key}")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any other config key (repeatable)"
    )


def run_command(args: argparse.Namespace) -> int:
    layers = [load_toml(args.config)] if args.config else []
    layers.append({key: getattr(args, key) for key in KEYS if getattr(args, key) is not None})
    layers.append(dict(parse_assignment(item) for item in args.set))
    config = build_config(RunConfig(), *layers, homes=key_homes)
    print(write_site_folders(config, Path(args.out)))
    return 0


def write_site_folders(config: RunConfig, out: Path, *, progress: bool = True) -> str:
    """Write the partition `config` makes as a server folder and one folder per site; the command that
    trains on them."""
    check_sections(config)  # a table of another dataset, a misspelt one: named, as a run names them
    if config.site_data_dir:
        raise ConfigError("site_data_dir is set: those data are per site already; leave it out")
    data = prepare_data(config)
    info = data.dataset.info
    written = info.task in FORMATS and info.text is None and data.dataset.train.x.dtype == torch.uint8
    if not written:
        what = "text" if info.text is not None else info.task
        if info.task in FORMATS and info.text is None:
            what = f"held as {data.dataset.train.x.dtype}, not 8-bit images"
        raise DataError(
            f"site-folders writes 8-bit image classification and semantic segmentation sets; "
            f"{config.dataset} is {what}"
        )
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: site-folders writes into a new or empty folder")
    names = _class_folders(info.class_names or tuple(str(c) for c in range(info.num_classes)))
    parts = _parts(data, out)
    total = sum(len(indices) for _, _, indices in parts)
    masks = info.task == "semantic-segmentation"
    with tqdm(total=total, unit="image", desc="site folders", disable=not progress) as bar:
        for folder, images, indices in parts:
            if len(indices):  # an empty part is no folder (a mask folder's would be refused as empty)
                (_write_masks if masks else _write)(folder, images, indices, names, bar)
    if masks:  # the server's masks may lack a class: name them all, by value
        return _summary(config, out, data, names)
    # image-folder reads the server's train/ folders, sorted, as the classes: where they lack one or sort
    # otherwise than the labels, the command names them all, in label order
    server_names = sorted({names[int(c)] for c in data.dataset.train.y[data.split.server_val].tolist()})
    return _summary(config, out, data, names if server_names != names else None)


def _class_folders(class_names: tuple[str, ...]) -> list[str]:
    """Folder names for the classes (a '/' would make a subfolder), refused if two would coincide."""
    names = [name.replace("/", "_").strip() or f"class-{i}" for i, name in enumerate(class_names)]
    if len(set(names)) != len(names):
        raise DataError(f"the class names {class_names} do not make distinct folder names")
    return names


def _parts(data: Prepared, out: Path) -> list[tuple[Path, ImageSet, np.ndarray]]:
    """Each folder to write, the set its images come from, and which of them."""
    train, test, split = data.dataset.train, data.dataset.test, data.split
    parts = [
        (out / "server" / "train", train, np.asarray(split.server_val)),
        (out / "server" / "test", test, np.arange(len(test))),
    ]
    for k in range(split.num_clients):  # not its share of the holdout: an IID draw of every class
        parts.append((out / f"site-{k}" / "train", train, np.asarray(split.client_train[k])))
        parts.append((out / f"site-{k}" / "test", test, np.asarray(split.client_test[k])))
    return parts


def _write(folder: Path, images: ImageSet, indices: np.ndarray, names: list[str], bar: tqdm) -> None:
    """The images `indices` of `images` as PNG files under `folder/<class>/`, named by their index."""
    for i in indices.tolist():
        label = names[int(images.y[i])]
        (folder / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(_picture(images.x[i].numpy())).save(folder / label / f"{i:06d}.png")
        bar.update()


def _write_masks(folder: Path, images: ImageSet, indices: np.ndarray, names: list[str], bar: tqdm) -> None:
    """The images `indices` of `images` under `folder/images/` and their masks (a class per pixel, 8-bit)
    under `folder/masks/`, both named by the index (mask-folder's layout)."""
    if len(names) > 256:
        raise DataError(f"{len(names)} classes do not fit an 8-bit mask")
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    for i in indices.tolist():
        Image.fromarray(_picture(images.x[i].numpy())).save(folder / "images" / f"{i:06d}.png")
        Image.fromarray(images.y[i].numpy().astype(np.uint8)).save(folder / "masks" / f"{i:06d}.png")
        bar.update()


def _picture(pixels: np.ndarray) -> np.ndarray:
    """uint8 (C, H, W) as Pillow takes it: (H, W) grey or (H, W, 3) colour."""
    return np.ascontiguousarray(pixels[0] if pixels.shape[0] == 1 else np.moveaxis(pixels, 0, -1))


def _summary(config: RunConfig, out: Path, data: Prepared, classes: list[str] | None) -> str:
    """What was written and the command that trains on it."""
    info, split = data.dataset.info, data.split
    how = {"method": config.partition, "alpha": config.alpha}
    sizes = " ".join(str(len(indices)) for indices in split.client_train)
    name = FORMATS[info.task]
    command = [
        "fedistill", "run", "--dataset", name, "--clients", str(split.num_clients),
        "--data-dir", str(out / "server"), "--site-data-dir", str(out / "site-{site}"),
        "--set", f"{name}.channels={info.channels}", "--set", f"{name}.image_size={info.image_size}",
    ]  # fmt: skip
    if info.crop_padding and name == "image-folder":  # the augmentation its runs train with (CIFAR's)
        command += ["--set", f"{name}.crop_padding={info.crop_padding}"]
    if info.horizontal_flip and name == "image-folder":
        command += ["--set", f"{name}.horizontal_flip=true"]
    if classes is not None:  # the server's holdout may lack a class, or sort otherwise: all, in label order
        listed = ",".join(toml_literal(c) for c in classes)  # TOML strings: quotes, backslashes escaped
        command += ["--set", f"{name}.classes=[{listed}]"]
    if not len(split.server_val):  # the server's folder holds a test set alone, which needs no holdout
        command += ["--set", "val_fraction=0"]
    return (
        f"{config.dataset}, {partition_text(how, brackets=True)}, seed {config.seed}, written to {out}:\n"
        f"  server: {len(split.server_val)} validation and {len(data.dataset.test)} test images\n"
        f"  sites: site-0 .. site-{split.num_clients - 1}, training images per site: {sizes}\n"
        f"train on them (add --algorithm and --model as for any run):\n  {shlex.join(command)}"
    )
