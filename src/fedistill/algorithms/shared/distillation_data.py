"""Unlabeled inputs for FedDF's server-side distillation: where the fusion data comes from.

FedDF never needs labels on the server: the ensemble of client models labels whatever it is shown.
Four sources, picked by `feddf.source`:

- `noise`: Gaussian images min-max scaled to [0, 1], as the released code's `random_data` (the
  paper's worst case; needs no files, so it is the default).
- `dataset:<name>`: a random subset of another dataset's training images (the paper: CIFAR-100 to
  fuse CIFAR-10 models), resized and re-channelled to the federation's image shape. Only the images
  are kept; the labels are dropped as soon as the dataset is loaded.
- `generator:<path>`: samples of a frozen, pre-trained generator saved as safetensors (for example
  FedIOD's `models/generator.safetensors`). Its architecture is read from the weights themselves.
- `holdout`: the inputs of the server's held-out split (`val_fraction` of the training set, drawn
  before the partition, so no client trains on it), without their labels; the server keeps a share of
  it labelled for validation (`split_holdout`). The paper's text experiments: half of AG News' or
  SST-2's training set fine-tunes the clients, the other half is the unlabelled distillation text.

Every image source returns normalised float32 batches (B, C, H, W) with the federation's mean and std,
so they go straight into the clients' models. Two departures from the released code, which loads
another dataset with that dataset's own normalisation and its training transforms: the federation's
constants are used, and no image is augmented (no random crop or flip; a pool's images come as stored).
A text federation (token ids) distils on texts only: `holdout`, or `dataset:<another text dataset>`
tokenised by the federation's own tokenizer; noise and generators make images, and are refused.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from pathlib import Path

import torch

from fedistill import devices
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.registry import dataset_options, load_dataset, same_images
from fedistill.data.transforms import fit_images, normalize, to_float
from fedistill.errors import ConfigError, UserError
from fedistill.models.generator import HEAD_FACTORS, Generator, build_generator
from fedistill.seeding import torch_generator
from fedistill.tasks.text import trim_padding

SOURCE_KINDS = ("noise", "dataset", "generator", "holdout")


#: The option errors name by default; the one-shot baseline passes its own table's (`feddf-oneshot.source`).
KEY = "feddf.source"


def parse_source(spec: str, key: str = KEY) -> tuple[str, str]:
    """`noise`, `holdout`, `dataset:<name>` or `generator:<path>` -> (kind, argument); errors name `key`."""
    kind, _, argument = spec.strip().partition(":")
    kind = kind.strip().lower()
    argument = argument.strip()
    if kind in ("noise", "holdout") and not argument:
        return kind, ""
    if kind in ("dataset", "generator") and argument:
        return kind, argument
    raise ConfigError(
        f"{key} must be 'noise', 'holdout' (the held-out split's inputs), 'dataset:<name>' (e.g. "
        f"dataset:fashion-mnist) or 'generator:<path to a .safetensors file>'; got {spec!r}"
    )


def check_source(spec: str, key: str = KEY) -> None:
    """The options-time check of a source: its form (`parse_source`) and, for `dataset:<name>`, a known
    dataset, refused with the options before the run writes anything rather than when the server loads it."""
    kind, argument = parse_source(spec, key)
    if kind == "dataset":
        try:
            dataset_options(argument)
        except UserError as exc:
            raise ConfigError(f"{key} = {spec!r}: {exc}") from None


def check_source_run(
    spec: str, key: str, dataset: str, *, instead: str = "use another dataset, a generator or noise"
) -> None:
    """The run-time check of a source: not the federation's own `dataset` (by registered name: an alias
    or another split of one release holds the same images), whose training images are the clients'.
    `instead` names the sources the caller takes in its place (FedMD's public data: `holdout` too)."""
    kind, argument = parse_source(spec, key)
    if kind == "dataset" and same_images(argument, dataset):
        raise ConfigError(
            f"{key} = {spec!r} is (or shares images with) the federation's own dataset, whose training "
            f"images are the clients' private data: {instead}"
        )


def split_holdout(
    held: ImageSet | None, share: float, seed: int, *, key: str = KEY
) -> tuple[ImageSet, ImageSet]:
    """The server's held-out split cut at random (from the run seed) into (validation, distillation
    inputs): `share` of it, at least one sample, keeps its labels for model selection; the rest is
    distilled on, its labels never read."""
    n = 0 if held is None else len(held)
    keep = max(1, round(share * n))
    if held is None or keep >= n:
        raise ConfigError(
            f"{key} = 'holdout' distils on the held-out split, which has {n} samples: too few to "
            f"keep {keep} for validation and distil on the rest; raise val_fraction (the paper: 0.5)"
        )
    order = torch.randperm(n, generator=torch_generator(seed, "feddf-holdout"))
    return held.subset(order[:keep].sort().values), held.subset(order[keep:].sort().values)


class DistillationSource(ABC):
    """Draws batches of unlabeled, normalised inputs for the federation `info`."""

    def __init__(self, info: DatasetInfo) -> None:
        self.info = info

    @property
    @abstractmethod
    def description(self) -> str:
        """One line for the log and the summary."""

    @abstractmethod
    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """(size, C, H, W) float32, normalised with the federation's mean and std."""


class NoiseSource(DistillationSource):
    """N(0, 1) images, min-max scaled to [0, 1] over the whole batch (the released code's scaling)."""

    @property
    def description(self) -> str:
        """What the source is, for the summary."""
        return "Gaussian noise images"

    def unit_batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """`size` noise images in [0, 1], on the CPU."""
        shape = (size, self.info.channels, self.info.image_size, self.info.image_size)
        noise = torch.randn(shape, generator=generator)
        return (noise - noise.min()) / (noise.max() - noise.min()).clamp_min(1e-12)

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """`size` noise images, normalised as the federation's data."""
        return devices.on_device(normalize(self.unit_batch(size, generator), self.info))


class ImagePool(DistillationSource):
    """A fixed pool of unlabeled uint8 images already in the federation's shape; batches are drawn
    uniformly without replacement inside a batch."""

    def __init__(self, images: torch.Tensor, info: DatasetInfo, name: str) -> None:
        super().__init__(info)
        if images.dtype != torch.uint8 or images.dim() != 4 or len(images) == 0:
            raise ConfigError(f"{name}: expected a non-empty uint8 image tensor, got {images.dtype}")
        fitted = fit_images(images.float() / 255.0, info.channels, info.image_size)
        self.images = (fitted * 255.0).round().to(torch.uint8)
        self.name = name

    @property
    def description(self) -> str:
        """What the source is, for the summary."""
        return f"{len(self.images)} unlabeled images of {self.name}"

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """`size` images of the pool, drawn without replacement, normalised."""
        index = torch.randperm(len(self.images), generator=generator)[: min(size, len(self.images))]
        return devices.on_device(to_float(self.images[index], self.info))


class TokenPool(DistillationSource):
    """A fixed pool of unlabeled texts as token ids (N, L) of the federation's tokenizer; batches are drawn
    uniformly without replacement inside a batch and cut to their longest text."""

    def __init__(self, ids: torch.Tensor, info: DatasetInfo, name: str) -> None:
        super().__init__(info)
        if ids.dtype != torch.int64 or ids.dim() != 2 or len(ids) == 0 or info.text is None:
            raise ConfigError(
                f"{name}: expected non-empty token ids (N, L), got {ids.dtype} {tuple(ids.shape)}"
            )
        self.ids = ids
        self.name = name

    @property
    def description(self) -> str:
        """What the source is, for the summary."""
        return f"{len(self.ids)} unlabeled texts of {self.name}"

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """(size, L') int64 token ids, L' the batch's longest text."""
        assert self.info.text is not None
        index = torch.randperm(len(self.ids), generator=generator)[: min(size, len(self.ids))]
        return devices.on_device(trim_padding(self.ids[index], self.info.text.pad_id))


def _subset(samples: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """`size` random rows of `samples` (all of them if size <= 0), in their order."""
    if 0 < size < len(samples):
        keep = torch.randperm(len(samples), generator=torch_generator(seed, "feddf-source-subset"))[:size]
        samples = samples[keep.sort().values]
    return samples


def dataset_source(
    name: str,
    info: DatasetInfo,
    data_dir: str | Path,
    *,
    size: int,
    seed: int,
    download: bool = False,
    key: str = KEY,
) -> ImagePool:
    """`size` random training images of dataset `name` (all of them if size <= 0), labels dropped; fetched
    first with `download` (the run's `download` key), as the run's own dataset is."""
    if "model_dir" in dataset_options(name):
        raise ConfigError(f"{key} = 'dataset:{name}' is a text dataset; {info.name} distils on images")
    images = load_dataset(name, data_dir, download=download).train.x  # only the images leave this line
    return ImagePool(_subset(images, size, seed), info, name)


def text_source(
    kind: str,
    argument: str,
    info: DatasetInfo,
    *,
    data_dir: str | Path,
    size: int,
    seed: int,
    held_out: ImageSet | None,
    download: bool = False,
    key: str = KEY,
) -> TokenPool:
    """A text federation's source: the held-out texts, or another text dataset's training texts read by
    the federation's tokenizer (a fixed random subset of `size`, all if size <= 0), labels dropped."""
    assert info.text is not None
    if kind in ("noise", "generator"):
        raise ConfigError(
            f"{key} = {kind!r} makes images, which mean nothing to a text model ({info.name}): use "
            "'holdout' (texts held out of the training set, the paper's choice; e.g. val_fraction = 0.5) or "
            "'dataset:<another text dataset>' (e.g. dataset:sst2)"
        )
    if kind == "holdout":
        if held_out is None or len(held_out) == 0:
            raise ConfigError(f"{key} = 'holdout' needs the held-out split: set val_fraction > 0")
        return TokenPool(held_out.x, info, f"the held-out split of {info.name}")
    if "model_dir" not in dataset_options(argument):
        raise ConfigError(
            f"{key} = 'dataset:{argument}' is an image dataset; {info.name} distils on texts "
            "(dataset:ag-news, dataset:sst2 or holdout)"
        )
    options = {"model_dir": info.text.tokenizer, "max_length": info.text.max_length}
    loaded = load_dataset(  # tokenise no more than `size`
        argument, data_dir, download=download, **options, max_train_samples=max(size, 0)
    )
    return TokenPool(loaded.train.x, info, argument)  # only the texts leave this function


def infer_generator_shape(state: dict[str, torch.Tensor], upsamples: int = 2) -> dict[str, int | str]:
    """latent_dim, width, channels, image_size and layout of a `models.generator.Generator` from its
    weights and its number of upsamplings (2: the paper's; a file fedistill saved records its own). The
    layout is read from the first convolution's input: 4 * width channels FedIOD's, 2 * width DENSE's."""
    try:
        linear = state["l1.0.weight"]  # (head * s * s, latent_dim)
        first = state["conv_blocks.2.weight"]  # (2 * width, head, 3, 3)
        last = state["conv_blocks.9.weight"]  # (channels, width, 3, 3)
    except KeyError as missing:
        raise ConfigError(
            f"the generator file lacks {missing}: it is not a fedistill/FedIOD generator "
            f"(expected keys l1.0.weight and conv_blocks.*)"
        ) from None
    shapes = {
        "l1.0.weight": (linear, 2),
        "conv_blocks.2.weight": (first, 4),
        "conv_blocks.9.weight": (last, 4),
    }
    for key, (weight, ndim) in shapes.items():
        if weight.ndim != ndim or 0 in weight.shape:
            raise ConfigError(
                f"the generator file's {key} has shape {tuple(weight.shape)}, not {ndim} non-empty axes: it "
                "is not a fedistill/FedIOD generator"
            )
    channels, width, head = int(last.shape[0]), int(last.shape[1]), int(first.shape[1])
    layouts = {factor * width: name for name, factor in HEAD_FACTORS.items()}
    if head not in layouts:
        accepted = " or ".join(f"{size} ({name})" for size, name in layouts.items())
        raise ConfigError(
            f"the generator's first convolution takes {head} channels; a generator of width {width} "
            f"has {accepted}"
        )
    init_size = math.isqrt(int(linear.shape[0]) // head)
    if head * init_size**2 != linear.shape[0]:
        raise ConfigError(f"the generator's first layer {tuple(linear.shape)} does not fit width {width}")
    return {
        "latent_dim": int(linear.shape[1]),
        "width": width,
        "channels": channels,
        "image_size": 2**upsamples * init_size,
        "layout": layouts[head],
    }


def load_generator(path: str | Path, *, upsample: str = "bilinear", key: str = KEY) -> Generator:
    """A frozen generator rebuilt from a safetensors file alone, in eval mode.

    The shapes and layout come from the weights (see `infer_generator_shape`) and the number of
    upsamplings from the file's metadata (2, the paper's, when it records none, as in released weights);
    the one choice neither records is the second upsampling layer: FedIOD's `bilinear` (the default) or
    MosaicKD's `nearest`.
    """
    from safetensors import safe_open

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"{key}: generator file {path} does not exist "
            "(a FedIOD run saves one as <run>/models/generator.safetensors)"
        )
    try:  # one read for the weights and the metadata
        with safe_open(str(path), framework="pt") as opened:
            metadata = opened.metadata() or {}
            recorded = metadata.get("upsamples", "2")
            state = {key: opened.get_tensor(key) for key in opened.keys()}  # noqa: SIM118 (not a dict)
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise ConfigError(f"{key}: {path} is not a readable safetensors file ({exc})") from None
    if recorded not in ("0", "1", "2"):
        raise ConfigError(f"{key}: {path} records {recorded!r} upsamplings; a generator has 0, 1 or 2")
    if metadata.get("condition_dim", "0") != "0":
        raise ConfigError(
            f"{key}: {path} is a conditional generator (a condition of {metadata['condition_dim']} values "
            "beside its noise, e.g. FedIOD's generator_mixture = 'per-client'); a source draws from an "
            "unconditional one only, which would feed noise where the condition goes"
        )
    upsamples = int(recorded)
    shape = infer_generator_shape(state, upsamples)
    channels = int(shape["channels"])
    info = DatasetInfo(
        name="generator",
        channels=channels,
        image_size=int(shape["image_size"]),
        num_classes=1,
        mean=(0.0,) * channels,
        std=(1.0,) * channels,
    )
    generator = build_generator(
        info,
        latent_dim=int(shape["latent_dim"]),
        width=int(shape["width"]),
        upsample=upsample,
        upsamples=upsamples,
        layout=str(shape["layout"]),
    )
    generator.load_state_dict(state)
    generator.eval()
    generator.requires_grad_(False)
    return generator


class GeneratorSource(DistillationSource):
    """Samples of a frozen generator (eval mode: BatchNorm uses its running statistics), taken in [0, 1]
    and then fitted and normalised for the federation, so a generator trained on another image shape
    or normalisation still works."""

    def __init__(self, generator: Generator, info: DatasetInfo, name: str) -> None:
        super().__init__(info)
        self.generator = generator
        self.name = name

    @property
    def description(self) -> str:
        """What the source is, for the summary."""
        return f"samples of the frozen generator {self.name}"

    @torch.no_grad()
    def unit_batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """`size` samples of the frozen generator in [0, 1], fitted to the federation's shape, on the CPU
        (where the generator stays, so its latents come from the CPU seed and any device draws the same)."""
        x01 = self.generator.forward_unit(self.generator.sample_latent(size, generator))
        return fit_images(x01, self.info.channels, self.info.image_size)

    def batch(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """`size` samples of the frozen generator, fitted and normalised, on the run's device."""
        return devices.on_device(normalize(self.unit_batch(size, generator), self.info))


def build_source(
    spec: str,
    info: DatasetInfo,
    *,
    data_dir: str | Path,
    size: int,
    seed: int,
    upsample: str = "bilinear",
    held_out: ImageSet | None = None,
    download: bool = False,
    key: str = KEY,
) -> DistillationSource:
    """The distillation source named by `spec` (see `parse_source`) for the federation `info`;
    `held_out` are the inputs a `holdout` source draws from; errors name the option `key`."""
    kind, argument = parse_source(spec, key)
    if info.text is not None:
        return text_source(
            kind,
            argument,
            info,
            data_dir=data_dir,
            size=size,
            seed=seed,
            held_out=held_out,
            download=download,
            key=key,
        )
    if kind == "noise":
        return NoiseSource(info)
    if kind == "holdout":
        if held_out is None or len(held_out) == 0:
            raise ConfigError(f"{key} = 'holdout' needs the held-out split: set val_fraction > 0")
        return ImagePool(held_out.x, info, f"the held-out split of {info.name}")
    if kind == "dataset":
        return dataset_source(argument, info, data_dir, size=size, seed=seed, download=download, key=key)
    return GeneratorSource(load_generator(argument, upsample=upsample, key=key), info, argument)
