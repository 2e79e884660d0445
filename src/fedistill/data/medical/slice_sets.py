"""Brain volumes with a tumour mask to a 2D slice dataset with Chang et al.'s size-sorted sites.

Shared by the BraTS loader and the semi-synthetic brains: each subject gives the axial slices the slice
rule keeps, on the 240 mm field of view, resized to `image_size`; training subjects are ranked by tumour
volume (smallest first) and that rank is every one of their slices' natural group, so the `natural`
partitioner cuts the ranked subjects into K sites of similar tumour size, as Chang et al. did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.data.medical.volumes import (
    resize_images,
    resize_masks,
    select_slices,
    size_ranks,
    to_field_of_view,
)

log = logging.getLogger(__name__)

TUMOUR_CLASSES = ("background", "tumour")


@dataclass
class SubjectSlices:
    """The slices kept from one subject's volume, with their tumour masks and axial indices."""

    name: str
    images: np.ndarray  # (n, S, S) uint8
    masks: np.ndarray  # (n, S, S) bool, whole tumour (or int64 classes, for several)
    slices: np.ndarray  # (n,) the axial index of each slice in its volume
    tumour_voxels: int  # the whole volume's tumour (foreground) size, which ranks the training subjects


def subject_slices(
    name: str,
    images: np.ndarray,
    tumour: np.ndarray,
    brain: np.ndarray,
    spacing_mm: tuple[float, float, float],
    rule: str,
    image_size: int,
) -> SubjectSlices:
    """The kept slices of one subject; `images`, `tumour`, `brain` are (Z, H, W) axial stacks and
    `spacing_mm` is (row, column, slice) spacing."""
    row_mm, col_mm, slice_mm = spacing_mm
    keep = select_slices(tumour, brain, rule, row_mm * col_mm, slice_mm)
    picked = to_field_of_view(images[keep], (row_mm, col_mm))
    masks = to_field_of_view(tumour[keep], (row_mm, col_mm))
    return SubjectSlices(
        name,
        resize_images(picked, image_size),
        resize_masks(masks, image_size),
        keep.astype(np.int64),
        int(tumour.sum()),
    )


def _stack(subjects: list[SubjectSlices], image_size: int) -> ImageSet:
    if not any(len(s.images) for s in subjects):
        empty = torch.zeros((0, 1, image_size, image_size), dtype=torch.uint8)
        return ImageSet(empty, torch.zeros((0, image_size, image_size), dtype=torch.int64))
    x = np.concatenate([s.images for s in subjects])[:, None]
    y = np.concatenate([s.masks for s in subjects]).astype(np.int64)
    return ImageSet(torch.from_numpy(x), torch.from_numpy(y))


def _per_slice(subjects: list[SubjectSlices], values: list[int] | np.ndarray) -> np.ndarray:
    return np.concatenate(
        [np.full(len(s.images), v, np.int64) for s, v in zip(subjects, values, strict=True)]
        or [np.zeros(0, np.int64)]
    )


def slice_dataset(
    name: str,
    train: list[SubjectSlices],
    test: list[SubjectSlices],
    image_size: int,
    extra_test_meta: dict[str, np.ndarray] | None = None,
    class_names: tuple[str, ...] = TUMOUR_CLASSES,
    unit: str = "subject",
) -> LoadedDataset:
    """The LoadedDataset: groups = training subjects' size ranks, test_meta subject (index into the test
    subjects, in order) and slice (axial index in that subject's volume); `class_names` by mask value;
    `unit` what a subject is called (nnU-Net's folders: "case")."""
    for subject in (*train, *test):
        if len(subject.images) == 0:
            log.info(
                "%s: subject %s has no slice the slice rule keeps; it adds no sample", name, subject.name
            )
    train_set, test_set = _stack(train, image_size), _stack(test, image_size)
    ranks = size_ranks([s.tumour_voxels for s in train], [s.name for s in train])
    by_rank = [train[i].name for i in np.argsort(ranks)]
    source = train_set if len(train_set) else test_set
    pixels = source.x.double().div(255.0)
    mean = float(pixels.mean()) if len(source) else 0.0
    std = max(float(pixels.std()), 1e-3) if len(source) > 0 else 1.0
    info = DatasetInfo(
        name=name,
        channels=1,
        image_size=image_size,
        num_classes=len(class_names),
        mean=(mean,),
        std=(std,),
        horizontal_flip=False,  # the batch augmentation flips images only, never their per-pixel targets
        class_names=tuple(class_names),
        task="semantic-segmentation",
    )
    test_meta = {
        "subject": _per_slice(test, np.arange(len(test))),
        "slice": np.concatenate([s.slices for s in test] or [np.zeros(0, np.int64)]),
        **(extra_test_meta or {}),
    }
    return LoadedDataset(
        info=info,
        train=train_set,
        test=test_set,
        train_groups=_per_slice(train, ranks),
        test_groups=None,
        group_names=tuple(by_rank),
        test_meta=test_meta,
        whole_groups=unit,
    )
