"""The in-memory dataset types every loader returns and every algorithm consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class DatasetInfo:
    """What models and transforms need to know about a dataset."""

    name: str
    channels: int
    image_size: int  # square images: height == width
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_padding: int = 0  # random-crop padding used by the training augmentation (0 = no crop)
    horizontal_flip: bool = False  # flip is wrong for digits and letters, right for natural images
    class_names: tuple[str, ...] = field(default=())


@dataclass
class ImageSet:
    """Images as uint8 (N, C, H, W) and labels as int64 (N,); normalisation happens per batch."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.dtype != torch.uint8 or self.x.dim() != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {self.x.dtype} {tuple(self.x.shape)}")
        if self.y.dtype != torch.int64 or self.y.shape != (self.x.shape[0],):
            raise ValueError(f"labels must be int64 (N,), got {self.y.dtype} {tuple(self.y.shape)}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices) -> ImageSet:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return ImageSet(self.x[idx], self.y[idx])


@dataclass
class LoadedDataset:
    info: DatasetInfo
    train: ImageSet
    test: ImageSet
