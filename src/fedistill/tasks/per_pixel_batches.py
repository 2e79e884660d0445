"""Mini-batches of images with per-pixel targets, augmented together: a flip or a rotation of an image
must move its mask with it, which the classification batches (images only) cannot do."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from fedistill import devices
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import to_float
from fedistill.errors import ConfigError


def joint_flip_rotate(
    x: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: a horizontal flip, a vertical flip (each with p = 0.5) and a rotation by a multiple of
    90 degrees, the same for the image (B, C, H, W) and its targets (B, H, W). The paper's segmentation
    nets train with random rotations and flips; right angles keep every pixel on the grid."""
    b = x.shape[0]
    draws = torch.rand(b, 2, generator=generator)
    turns = torch.randint(0, 4, (b,), generator=generator)
    xs, ys = [], []
    for i in range(b):
        xi, yi = x[i], y[i]
        if draws[i, 0] < 0.5:
            xi, yi = xi.flip(-1), yi.flip(-1)
        if draws[i, 1] < 0.5:
            xi, yi = xi.flip(-2), yi.flip(-2)
        k = int(turns[i])
        if k:
            xi, yi = torch.rot90(xi, k, (-2, -1)), torch.rot90(yi, k, (-2, -1))
        xs.append(xi)
        ys.append(yi)
    return torch.stack(xs), torch.stack(ys)


def per_pixel_batches(
    images: ImageSet,
    info: DatasetInfo,
    batch_size: int,
    *,
    shuffle: bool,
    generator: torch.Generator | None,
    augment: bool,
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One epoch of (normalised float32 images, per-pixel targets, the samples' indices in `images`).
    The order and the augmentation come from `generator`, as in `fedistill.data.transforms.batches`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    n = len(images)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        idx = order[start : start + batch_size]
        x, y = images.x[idx], images.y[idx]
        if augment:
            x, y = joint_flip_rotate(x, y, generator)
        yield devices.on_device(to_float(x, info)), devices.on_device(y), idx
