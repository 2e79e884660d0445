"""Public data for the methods that distil on it (FedMD, FedKD): which images, with which labels, and
how they cross the boundary.

`public` names the source, in `distillation_data.py`'s style:

- `holdout`: the federation's held-out split (`val_fraction` of the training set, drawn before the
  partition, so no client trains on it). The server holds it already; with this source it becomes the
  public set, and the method validates nothing on it. Needs `val_fraction > 0`. It is the default
  because it runs on any dataset without files; a real deployment names another dataset.
- `dataset:<name>`: the training images of another dataset (a random subset of `public_size`),
  resized and re-channelled to the federation's image shape, with that dataset's labels, which must
  be classes the federation's models have, by name at the same index (MNIST for a digits federation);
  FedMD refuses other labels, FedKD (which labels the images itself) drops them. The federation's own
  dataset is refused: its training images are the clients' private data.
- `noise`, `generator:<path>` (no labels, so FedKD only): `public_size` draws of
  `distillation_data.py`'s sources, fixed once from the run seed.

The server builds the set and sends what a method needs of it as `public-data` arrays: images (uint8,
or float32 in [0, 1], the federation's shape, not normalised) and, for FedMD's transfer learning,
labels. Clients read no public dataset from their own disk, so the ledger shows every public image a
client was shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedistill import devices
from fedistill.algorithms.base import ServerContext
from fedistill.algorithms.shared.distillation_data import (
    GeneratorSource,
    NoiseSource,
    check_source_run,
    load_generator,
    parse_source,
)
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.data.registry import dataset_options, load_dataset
from fedistill.data.transforms import fit_uint8, to_float
from fedistill.errors import ConfigError, FederationError, UserError
from fedistill.federation.messages import ArraySpec, Message, expect_arrays
from fedistill.seeding import torch_generator

#: The content kind of public inputs (and labels) in messages.
PUBLIC = "public-data"
#: Both methods train on the public set (FedMD's transfer learning, FedKD's student), which needs two
#: samples (BatchNorm); one image would stop the run only after every client had trained.
MIN_PUBLIC = 2
TOO_FEW = f"a public set needs at least {MIN_PUBLIC} images (FedMD and FedKD train on it)"


@dataclass(frozen=True)
class PublicData:
    """Public images (N, C, H, W), uint8 or float32 in [0, 1], and their labels when the source has any."""

    images: torch.Tensor
    labels: torch.Tensor | None
    description: str

    def __len__(self) -> int:
        return len(self.images)


def parse_public(spec: str, key: str) -> tuple[str, str]:
    """`holdout`, `dataset:<name>`, `noise` or `generator:<path>` -> (kind, argument)."""
    if spec.strip().lower() == "holdout":
        return "holdout", ""
    try:
        return parse_source(spec)
    except ConfigError:
        raise ConfigError(
            f"{key} must be 'holdout' (the federation's held-out split), 'dataset:<name>' (e.g. "
            f"dataset:mnist), 'noise' or 'generator:<path to a .safetensors file>'; got {spec!r}"
        ) from None


def check_public_run(spec: str, key: str, config: RunConfig) -> None:
    """The run-time check of `check_public`'s source: the held-out split exists only with val_fraction > 0,
    and another dataset must not be (nor share images with) the federation's own."""
    kind, _ = parse_public(spec, key)
    if kind == "holdout" and config.val_fraction == 0:
        raise ConfigError(f"{key} = 'holdout' is the federation's held-out split: set val_fraction > 0")
    if kind == "dataset":
        check_source_run(
            spec, key, config.dataset, instead="use 'holdout' (its held-out split) or another dataset"
        )


def check_public(spec: str, key: str, *, labelled: bool, size: int) -> None:
    """The options-time check: a known source of images, with labels when the method needs them, and a
    `size` (`public_size`) it can serve, so that a run is refused before its folder exists."""
    try:
        kind, argument = parse_public(spec, key)
    except ConfigError:
        if not labelled:
            raise
        raise ConfigError(  # the sources a labelled method takes, not the drawn ones it would refuse next
            f"{key} must be 'holdout' (the federation's held-out split) or 'dataset:<name>' (a labelled "
            f"dataset, e.g. dataset:mnist); got {spec!r}"
        ) from None
    if labelled and kind in ("noise", "generator"):
        raise ConfigError(
            f"{key} = {spec!r} has no labels, but this method first trains every client on the labelled "
            "public set (transfer learning): use 'holdout' or 'dataset:<name>' (a labelled dataset)"
        )
    if 0 < size < MIN_PUBLIC:
        raise ConfigError(f"{key}_size = {size}; {TOO_FEW}")
    if kind in ("noise", "generator") and size <= 0:
        raise ConfigError(f"{key} = {spec!r} draws its images: set public_size > 0 (e.g. 2000)")
    if kind != "dataset":
        return
    try:
        takes = dataset_options(argument)
    except UserError as exc:  # an unknown name: refused with the options, before the run writes anything
        raise ConfigError(f"{key} = {spec!r}: {exc}") from None
    if "model_dir" in takes:
        raise ConfigError(
            f"{key} = {spec!r} is a text dataset: its token ids are no images, and FedMD and FedKD run on "
            "image datasets; use 'holdout' or an image dataset (e.g. dataset:mnist)"
        )


def build_public(spec: str, ctx: ServerContext, *, size: int, key: str, labelled: bool) -> PublicData:
    """The public set named by `spec` for the federation of `ctx` (see the module docstring).

    `size` > 0 keeps a random subset of that many images (drawn from the run seed); <= 0 keeps all
    (`noise` and `generator:` need a size). `labelled` refuses sources without labels."""
    check_public(spec, key, labelled=labelled, size=size)
    config, info = ctx.config, ctx.info
    kind, argument = parse_public(spec, key)
    if kind in ("noise", "generator"):
        # drawn in [0, 1] on the CPU, where data sets stay, whatever the run's device
        source = (
            NoiseSource(info)
            if kind == "noise"
            else GeneratorSource(load_generator(argument, key=key), info, argument)
        )
        x01 = source.unit_batch(size, torch_generator(config.seed, "public-draws"))
        return PublicData(x01.clamp(0.0, 1.0).contiguous(), None, source.description)
    if kind == "holdout":
        held = ctx.validation
        if held is None or len(held) == 0:
            raise ConfigError(f"{key} = 'holdout' is the federation's held-out split: set val_fraction > 0")
        images, labels, names = held.x, held.y, info.class_names
        what = f"the held-out split of {config.dataset}"
    else:
        check_public_run(spec, key, config)
        loaded = load_dataset(argument, config.data_dir, download=config.download)
        images = fit_uint8(loaded.train.x, info.channels, info.image_size)
        labels, names = loaded.train.y, loaded.info.class_names
        what = f"{argument}'s training images"
    if labels.dim() != 1:
        raise ConfigError(f"{key} = {spec!r} has per-pixel targets; public data must be image-level classes")
    if labelled and len(labels) and int(labels.max()) >= info.num_classes:
        raise ConfigError(
            f"{key} = {spec!r} has labels up to {int(labels.max())}, but the federation's models have "
            f"{info.num_classes} classes: use a public dataset whose classes are among them"
        )
    foreign = not same_classes(names, info.class_names, labels)
    if foreign and labelled:
        raise ConfigError(
            f"{key} = {spec!r} labels its images with {argument}'s classes "
            f"({', '.join(names[:4])}, ...), not the federation's "
            f"({', '.join(info.class_names[:4])}, ...): a label would teach the wrong class; use "
            "'holdout' or a dataset of the federation's classes"
        )
    if 0 < size < len(images):
        keep = torch.randperm(len(images), generator=torch_generator(config.seed, "public-subset"))[:size]
        keep = keep.sort().values
        images, labels = images[keep], labels[keep]
    if len(images) < MIN_PUBLIC:
        raise ConfigError(f"{key} = {spec!r} holds {len(images)} image(s); {TOO_FEW}")
    # another label space (CIFAR-100 for CIFAR-10 models): its labels mean nothing to these models
    return PublicData(images, None if foreign else labels, f"{len(images)} images of {what}")


def same_classes(public: tuple[str, ...], federation: tuple[str, ...], labels: torch.Tensor) -> bool:
    """Whether each class the public labels use is the federation's class of the same index, by name
    (case aside); True when either dataset names no classes."""
    if not public or not federation:
        return True
    key = lambda names, c: names[c].strip().lower() if 0 <= c < len(names) else None  # noqa: E731
    used = labels.unique().tolist()
    return all(key(public, c) is not None and key(public, c) == key(federation, c) for c in used)


def public_arrays(images: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The `public-data` arrays of a request: the images, and the labels when a method sends them."""
    return {"x": images} | ({"y": labels} if labels is not None else {})


def read_public(message: Message, info: DatasetInfo, *, labelled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The public images (and labels, or an empty tensor) a request carries, checked for the
    federation's shape, dtype, range and classes."""
    got = message.arrays.get(PUBLIC, {})
    x = got.get("x")
    shape = (info.channels, info.image_size, info.image_size)
    if x is None or x.dtype.name not in ("uint8", "float32") or x.ndim != 4 or x.shape[1:] != shape:
        found = "nothing" if x is None else f"{x.dtype.name}{list(x.shape)}"
        raise FederationError(
            f"{message.type}: {PUBLIC}/x must be uint8 or float32 images (N, {', '.join(map(str, shape))}), "
            f"got {found}"
        )
    if len(x) == 0 or (x.dtype.name == "float32" and (x.min() < 0 or x.max() > 1)):
        raise FederationError(f"{message.type}: {PUBLIC}/x is empty or has float values outside [0, 1]")
    names = {"x": ArraySpec(x.dtype.name, tuple(x.shape))}
    if labelled:
        names["y"] = ArraySpec("int64", (len(x),))
    expect_arrays(message, PUBLIC, names)
    if not labelled:
        return message.tensor(PUBLIC, "x"), torch.empty(0, dtype=torch.int64)
    y = message.tensor(PUBLIC, "y")
    if int(y.min()) < 0 or int(y.max()) >= info.num_classes:
        raise FederationError(f"{message.type}: {PUBLIC}/y has labels outside 0..{info.num_classes - 1}")
    return message.tensor(PUBLIC, "x"), y


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, info: DatasetInfo, batch_size: int = 512) -> torch.Tensor:
    """The model's outputs (logits, float32) on public images, in eval mode and in batches."""
    was_training = model.training
    model.eval()
    out = [
        model(devices.on_device(to_float(images[i : i + batch_size], info)))
        for i in range(0, len(images), batch_size)
    ]
    model.train(was_training)
    return torch.cat(out).float()
