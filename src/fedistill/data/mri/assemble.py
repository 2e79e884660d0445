"""Volumes of prepared slices -> one reconstruction `LoadedDataset`.

x is the fully sampled magnitude slice (float32 in [0, 1], per-volume maximum 1), y its foreground
mask (int64, 1 = foreground); the undersampled input is made on the fly from x by the task layer.
Every test slice carries `test_meta["subject"]` (an int, unique per test volume across all sources)
and `test_meta["slice"]` (its index in the volume as read), so metrics can be taken per volume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.data.mri.foreground import foreground_masks
from fedistill.data.mri.slices import brain_slices, prepare, scale_to_unit
from fedistill.errors import DataError

CLASS_NAMES = ("background", "foreground")
BRAIN_SHARE = 1 / 3  # "brain" slices: foreground area >= this share of the volume's largest


@dataclass
class Volume:
    """The kept slices of one volume, ready for the dataset."""

    name: str  # subject or file, for messages
    images: np.ndarray  # (S, H, W) float32 in [0, 1]
    slice_index: np.ndarray  # (S,) int: each slice's index in the volume as read
    group: int = 0  # site / source
    masks: np.ndarray | None = None  # (S, H, W) bool; computed from the images when None

    def __post_init__(self) -> None:
        if self.masks is None:
            self.masks = foreground_masks(self.images)
        self.slice_index = np.asarray(self.slice_index, dtype=np.int64)

    def subset(self, index: np.ndarray) -> Volume:
        """The same volume with only slices `index` (positions in this volume's kept slices)."""
        return Volume(self.name, self.images[index], self.slice_index[index], self.group, self.masks[index])


def _stack(volumes: Sequence[Volume], what: str, name: str) -> ImageSet:
    if not volumes or not sum(len(v.images) for v in volumes):
        raise DataError(f"{name}: no {what} slices were found; see the dataset's file layout")
    sizes = {v.images.shape[1:] for v in volumes}
    if len(sizes) != 1:
        raise DataError(f"{name}: {what} slices differ in size {sorted(sizes)}; set image_size")
    x = torch.from_numpy(np.concatenate([v.images for v in volumes]).astype(np.float32))[:, None]
    y = torch.from_numpy(np.concatenate([v.masks for v in volumes]).astype(np.int64))
    return ImageSet(x.contiguous(), y)


def _groups(volumes: Sequence[Volume]) -> np.ndarray:
    return np.concatenate([np.full(len(v.images), v.group, dtype=np.int64) for v in volumes])


def build_dataset(
    name: str,
    train: Sequence[Volume],
    test: Sequence[Volume],
    group_names: tuple[str, ...] = (),
) -> LoadedDataset:
    """The dataset; with `group_names` each slice's group (a volume's `group`) becomes its natural site."""
    train_set, test_set = _stack(train, "training", name), _stack(test, "test", name)
    if train_set.x.shape[2:] != test_set.x.shape[2:]:
        raise DataError(f"{name}: training and test slices differ in size; set image_size")
    size = int(train_set.x.shape[-1])
    info = DatasetInfo(
        name=name,
        channels=1,
        image_size=size,
        num_classes=len(CLASS_NAMES),
        mean=(0.0,),  # images stay in [0, 1]: a reconstruction is scored on the target's own scale
        std=(1.0,),
        class_names=CLASS_NAMES,
        task="reconstruction",
    )
    meta = {
        "subject": np.concatenate([np.full(len(v.images), i, dtype=np.int64) for i, v in enumerate(test)]),
        "slice": np.concatenate([v.slice_index for v in test]),
    }
    return LoadedDataset(
        info,
        train_set,
        test_set,
        train_groups=_groups(train) if group_names else None,
        test_groups=_groups(test) if group_names else None,
        group_names=tuple(group_names),
        test_meta=meta,
        train_subject_ids=np.concatenate(
            [np.full(len(v.images), i, dtype=np.int64) for i, v in enumerate(train)]
        ),
    )


def volume_from_slices(
    name: str,
    raw: np.ndarray,
    image_size: int | None,
    keep: str | range,
    group: int = 0,
) -> Volume:
    """A `Volume` from raw (S, H, W) slices: squared, resized, scaled, masked, then the kept slices.

    keep: "all"; "brain" (slices whose foreground area is at least `BRAIN_SHARE` of the volume's
    largest, i.e. the middle slices through the brain rather than the neck or the vertex); or a range of
    slice indices (clipped to the volume). The kept slices are scaled again so their maximum is 1.
    """
    images = prepare(raw, image_size, name)
    masks = foreground_masks(images)
    if keep == "all":
        index = np.arange(len(images))
    elif keep == "brain":
        index = brain_slices(masks, BRAIN_SHARE)
    else:
        index = np.asarray([i for i in keep if 0 <= i < len(images)], dtype=np.int64)
    if not len(index):
        raise DataError(f"{name}: no slice of the volume was kept (slices={keep!r}); is it empty?")
    return Volume(name, scale_to_unit(images[index], name), index, group, masks[index])
