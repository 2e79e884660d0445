"""Batch transforms in plain tensor ops: normalisation, random crop + flip, and the batch iterator.

Augmentation runs on the raw uint8 (or [0, 1]) images, before normalisation, so
the crop's padding is black (0) exactly as in the torchvision recipe
`RandomCrop(32, padding=4)` the papers use; normalising afterwards turns that
black into -mean/std, not into 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from fedistill import devices
from fedistill.data.base import DatasetInfo, ImageSet, is_plain_int
from fedistill.errors import ConfigError


def _stats(info: DatasetInfo, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 4 or x.shape[1] != info.channels:
        raise ValueError(f"expected images (B, {info.channels}, H, W) for {info.name}, got {tuple(x.shape)}")
    mean = torch.tensor(info.mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return mean, std


def normalize(x01: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """(x - mean) / std per channel, for float images in [0, 1]."""
    mean, std = _stats(info, x01)
    return (x01.float() - mean) / std


def to_float(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """uint8 images (B, C, H, W) -> normalised float32: (x / 255 - mean) / std; float32 images are
    taken to be in [0, 1] already."""
    return normalize(x.float() / 255.0 if x.dtype == torch.uint8 else x.float(), info)


def fit_images(x01: torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """Float images in [0, 1] (N, c, h, w) -> (N, channels, size, size), still in [0, 1].

    Channels: 1 -> C repeats the grey image, C -> 1 averages the channels. Size: bilinear resampling,
    with antialiasing when shrinking (28x28 MNIST to 8x8 digits would alias badly otherwise).
    """
    if x01.dim() != 4:
        raise ValueError(f"expected images (N, C, H, W), got shape {tuple(x01.shape)}")
    have = x01.shape[1]
    if have != channels:
        if have == 1:
            x01 = x01.expand(-1, channels, -1, -1)
        elif channels == 1:
            x01 = x01.mean(dim=1, keepdim=True)
        else:
            raise ConfigError(f"cannot turn {have}-channel images into {channels}-channel ones")
    if x01.shape[-2:] != (size, size):
        shrinking = x01.shape[-1] > size or x01.shape[-2] > size
        x01 = F.interpolate(
            x01.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=shrinking
        )
    return x01.clamp(0.0, 1.0).contiguous()


def fit_uint8(images: torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """`fit_images` for stored images: uint8 (or [0, 1] float) in, uint8 out, like every dataset's own."""
    x01 = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    return (fit_images(x01, channels, size) * 255.0).round().to(torch.uint8)


def _random_crop(
    x: torch.Tensor, padding: int, generator: torch.Generator | None, mode: str = "constant"
) -> torch.Tensor:
    """Pad by `padding` on every side (zeros, or with `mode = "replicate"` the edge pixels repeated), then
    cut an HxW window at a per-sample random offset."""
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding), mode=mode)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=gen_device).to(x.device)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=gen_device).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows, cols]  # output[i, k, r, s] = padded[i, k, dy[i] + r, dx[i] + s]


def _random_flip(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    gen_device = generator.device if generator is not None else torch.device("cpu")
    flip = torch.rand(x.shape[0], generator=generator, device=gen_device).to(x.device) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(3), x)


def _augment(x: torch.Tensor, info: DatasetInfo, generator: torch.Generator | None) -> torch.Tensor:
    if info.crop_padding > 0:
        x = _random_crop(x, info.crop_padding, generator)
    if info.horizontal_flip:
        x = _random_flip(x, generator)
    return x


def augment(x: torch.Tensor, info: DatasetInfo, generator: torch.Generator | None) -> torch.Tensor:
    """Training augmentation of a batch (B, C, H, W): random crop with `info.crop_padding` black padding,
    then a horizontal flip with p=0.5 if `info.horizontal_flip`; the input unchanged when neither applies.

    Give it uint8 or [0, 1] images (not normalised ones) so the padding is black. The crop
    offsets are drawn first, then the flips, all from `generator` (the global RNG if None).
    """
    return _augment(x, info, generator)


def random_shift(x: torch.Tensor, pixels: int, generator: torch.Generator | None) -> torch.Tensor:
    """Each image of a float batch (B, C, H, W) moved by its own random offset of up to `pixels` in each
    direction, the edge pixels repeated into the gap: for images already normalised, where zero padding
    would not be the background."""
    return _random_crop(x, pixels, generator, mode="replicate") if pixels > 0 else x


def batches(
    images: ImageSet,
    info: DatasetInfo,
    batch_size: int,
    *,
    shuffle: bool,
    generator: torch.Generator | None,
    augment: bool,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of (normalised float32 x, int64 y) batches; token ids (text) pass through as they are
    (neither normalised nor augmented), on the run's device as the images are.

    With `shuffle`, each sample appears exactly once per epoch in a random order; the
    order and the augmentation are drawn from `generator` (the global RNG if None), so
    the same generator state gives the same batches. Augmentation is applied to the
    uint8 images before normalisation.
    """
    if not is_plain_int(batch_size) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    n = len(images)
    if shuffle:  # drawn now, not at the first next(), so creating the iterator fixes the order
        gen_device = generator.device if generator is not None else torch.device("cpu")
        order = torch.randperm(n, generator=generator, device=gen_device).to(images.y.device)
    else:
        order = torch.arange(n, device=images.y.device)
    stop = n - n % batch_size if drop_last else n
    return _batches(images, info, order, batch_size, stop, generator, augment)


def _batches(
    images: ImageSet,
    info: DatasetInfo,
    order: torch.Tensor,
    batch_size: int,
    stop: int,
    generator: torch.Generator | None,
    augment: bool,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, stop, batch_size):
        idx = order[start : start + batch_size]
        x = images.x[idx]
        if images.tokens:  # on the run's device too: the ensemble's drop-worst scores text through here
            yield devices.on_device(x), devices.on_device(images.y[idx])
            continue
        if augment:
            x = _augment(x, info, generator)
        yield devices.on_device(to_float(x, info)), devices.on_device(images.y[idx])


def random_recolour(
    x: torch.Tensor, info: DatasetInfo, probability: float, generator: torch.Generator
) -> torch.Tensor:
    """Each image of a normalised float batch (B, C, H, W), with `probability`, in a random new look, drawn
    in pixel units u in [0, 1]: its channels shuffled, then u -> 1/2 + s g (u - 1/2) + o per channel, with a
    contrast g of 1/2 to 2 (log-uniform), an offset o of std 0.1 and, for half of the images, s = -1 (the
    image inverted: dark objects on a light ground become light on dark), clipped to [0, 1] and normalised
    again. For targets a colour does not decide, such as a segmentation mask: a student that sees its
    inputs in many stains learns the shapes, not one stain's look (SynthSeg's domain randomisation,
    applied to what the student trains on). The draws come from `generator` alone, on the CPU."""
    if probability <= 0:
        return x
    mean, std = _stats(info, x)
    b, c = x.shape[:2]
    chosen = torch.rand(b, generator=generator) < probability
    order = torch.argsort(torch.rand(b, c, generator=generator), dim=1)
    contrast = torch.exp((torch.rand(b, c, generator=generator) * 2 - 1) * math.log(2.0))
    sign = torch.where(torch.rand(b, 1, generator=generator) < 0.5, -1.0, 1.0)
    offset = 0.1 * torch.randn(b, c, generator=generator)
    order = torch.where(chosen[:, None], order, torch.arange(c).expand(b, c)).to(x.device)
    contrast, offset = (contrast * sign).to(x)[:, :, None, None], offset.to(x)[:, :, None, None]
    units = torch.gather(x * std.to(x) + mean.to(x), 1, order[:, :, None, None].expand_as(x))
    recoloured = ((units - 0.5) * contrast + 0.5 + offset).clamp(0.0, 1.0)
    return torch.where(chosen.to(x.device)[:, None, None, None], (recoloured - mean.to(x)) / std.to(x), x)
