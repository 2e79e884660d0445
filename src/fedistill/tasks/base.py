"""What a task is: the one object data, models, algorithms and reports ask instead of assuming labels.

A task says what a target is (a class index, a mask, an instance map, an image), what the partitioner
splits by, how a batch becomes a model's inputs and targets, the local training loss, the metrics and the
headline of a summary, what FedIOD's output distillation compares (rows of per-image logits, per-pixel
logits or output pixels) and what its generator is conditioned on. Classification, semantic and
instance segmentation, reconstruction and text classification are tasks; a method written once runs on
each task it makes sense for, and asks the task wherever tasks differ.

Tasks are frozen dataclasses whose fields are the task's options (the `[task]` config table), so a task
is a value: two runs with equal tasks train and score alike, and a stage-1 cache key can name it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.tasks.conditions import Condition

#: A batch as the task hands it to a model: a tensor, or a tuple when the task needs more than the input
#: (reconstruction with data consistency also carries the measured k-space and the sampling mask).
Inputs = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Task(ABC):
    """What a federation learns: its batches, loss, predictions and metrics, so algorithms and models stay
    task-agnostic."""

    name: ClassVar[str]
    target: ClassVar[str]  # what one target is: "class index", "mask", "instance map", "image"
    headline: ClassVar[str]  # the metric a summary leads with (reported as test_<headline>)
    #: the metrics of this task's results table, in order, with their column titles and formats
    columns: ClassVar[tuple[tuple[str, str, str], ...]]
    #: whether targets and outputs are per pixel (a mask, an instance map, an image), not one per sample
    per_pixel: ClassVar[bool] = False
    #: what FedIOD's generator is conditioned on; None: it draws from noise alone
    condition: ClassVar[Condition | None] = None
    #: whether a run reports the evaluation-only oracle of the algorithms that declare one (the "global
    #: accuracy" column of FedMD-CG's image-classification tables)
    reports_global_accuracy: ClassVar[bool] = False
    #: whether a model's outputs are images (reconstruction) rather than class scores
    outputs_images: ClassVar[bool] = False
    #: whether a whole image is predicted patch by patch and stitched back (nuclei slides)
    patchwise: ClassVar[bool] = False
    #: whether the targets are class indices 0..num_classes - 1 (`check` holds them to it)
    targets_are_classes: ClassVar[bool] = False

    # --- data ----------------------------------------------------------------------------------
    def check(self, info: DatasetInfo, data: ImageSet, what: str) -> None:
        """Raise ValueError when `data`'s targets are not this task's (shape; class indices in range)."""
        if data.per_pixel != self.per_pixel:
            shape = "(N, H, W)" if self.per_pixel else "(N,)"
            raise ValueError(f"{what}: task {self.name!r} needs targets {shape}, got {tuple(data.y.shape)}")
        if self.per_pixel:
            # per-pixel batches turn images by right angles and nets halve them: a wrong size fails late
            declared = (info.channels, info.image_size, info.image_size)
            if tuple(data.x.shape[1:]) != declared:
                got, want = ("x".join(map(str, s)) for s in (data.x.shape[1:], declared))
                raise ValueError(
                    f"{what}: images are {got}, but dataset {info.name!r} declares square images of "
                    f"{want} (channels x height x width); crop, pad or convert them to that shape"
                )
        if self.targets_are_classes and data.y.numel():
            low, high = int(data.y.min()), int(data.y.max())
            if low < 0 or high >= info.num_classes:
                raise ValueError(
                    f"{what}: targets run from {low} to {high}, but {info.num_classes} classes take the "
                    f"indices 0..{info.num_classes - 1}"
                )

    @classmethod
    def partition_labels(cls, dataset: LoadedDataset) -> tuple[np.ndarray, np.ndarray, int]:
        """What the partitioner splits by, for the training and the test set, and how many values they
        take: the class of each sample, or, for per-pixel targets, the dataset's natural groups (one
        group when it names none). It depends on the kind of task only, not on its options."""
        if not cls.per_pixel:
            return dataset.train.y.numpy(), dataset.test.y.numpy(), dataset.info.num_classes
        train = dataset.train_groups if dataset.train_groups is not None else np.zeros(len(dataset.train))
        test = dataset.test_groups if dataset.test_groups is not None else np.zeros(len(dataset.test))
        train, test = np.asarray(train, dtype=np.int64), np.asarray(test, dtype=np.int64)
        return train, test, int(max(train.max(initial=0), test.max(initial=0))) + 1

    @classmethod
    def partition_names(cls, dataset: LoadedDataset) -> tuple[str, ...]:
        """The names of the values `partition_labels` takes (empty when the dataset names none)."""
        return tuple(dataset.group_names if cls.per_pixel else dataset.info.class_names)

    def usual_augment(self, info: DatasetInfo) -> bool:
        """Whether `augment = "auto"` augments this dataset's training batches."""
        return info.crop_padding > 0 or info.horizontal_flip

    @abstractmethod
    def batches(
        self,
        data: ImageSet,
        info: DatasetInfo,
        batch_size: int,
        *,
        shuffle: bool,
        generator: torch.Generator | None,
        augment: bool,
        drop_last: bool = False,
    ) -> Iterator[tuple[Inputs, torch.Tensor]]:
        """One epoch of (model inputs, targets)."""

    # --- models --------------------------------------------------------------------------------
    def output_channels(self, info: DatasetInfo) -> int:
        """Channels (or classes) a model's output has for this task."""
        return info.num_classes

    def predict(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        """The model's output for a batch from `batches`."""
        assert isinstance(inputs, torch.Tensor)
        return model(inputs)

    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        """A prediction from a batch of outputs, shaped like a target: the class per sample or per pixel
        (the highest score); tasks whose targets are not classes override it."""
        return outputs.argmax(1)

    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The local training loss (a scalar, mean over the batch)."""

    def inputs_of(self, images: torch.Tensor, indices: torch.Tensor, seed: int) -> torch.Tensor:
        """What a model sees of clean images (B, C, H, W) that no dataset holds (a generator's): the
        images themselves; a task that measures its inputs (reconstruction) measures them here, sample i
        as item `indices[i]` of a stream seeded by `seed`."""
        return images

    def trivial_baseline(self) -> tuple[str, nn.Module, Task] | None:
        """A predictor every trained model must beat, as (label, model, the task that scores it); None when
        the task names none. Runs report its test metrics beside their own (summary "floor")."""
        return None

    # --- output distillation (FedIOD compares outputs row by row: a row per sample or per pixel) -----
    def distilled_columns(self, info: DatasetInfo) -> int:
        """Columns of one row of the outputs: the classes (per sample or per pixel)."""
        return self.output_channels(info)

    def column_counts(self, data: ImageSet, info: DatasetInfo) -> torch.Tensor:
        """How much of each column `data` holds (int64, `distilled_columns` long): the share of a site
        in what the federation knows of a column is its count over everyone's (FedIOD's Eq. 8)."""
        raise NotImplementedError(f"task {self.name!r} does not count its targets per column")

    # --- scores --------------------------------------------------------------------------------
    def evaluate(
        self,
        model: nn.Module,
        data: ImageSet,
        info: DatasetInfo,
        *,
        batch_size: int = 64,
        meta: Mapping[str, np.ndarray] | None = None,
        groups: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """Metrics of `model` on `data` in eval mode, with `self.headline`, "loss" and "count" among them:
        the `score` of its `outputs`. `meta` are the set's per-sample facts (`LoadedDataset.test_meta`),
        `groups` each sample's source name, for per-source metrics."""
        if len(data) == 0:
            return self.empty_metrics()
        return self.score(self.outputs(model, data, info, batch_size), data, info, meta=meta, groups=groups)

    def empty_metrics(self) -> dict[str, float]:
        """The metrics of an empty set: the headline and the loss undefined, nothing counted."""
        return {self.headline: float("nan"), "loss": float("nan"), "count": 0}

    @torch.no_grad()
    def outputs(
        self, model: nn.Module, data: ImageSet, info: DatasetInfo, batch_size: int = 64
    ) -> torch.Tensor:
        """`model`'s outputs on every sample of `data`, in order, in eval mode (logits or images)."""
        was_training = model.training
        model.eval()
        chunks = [
            self.predict(model, inputs)
            for inputs, _ in self.batches(
                data, info, batch_size, shuffle=False, generator=None, augment=False
            )
        ]
        model.train(was_training)
        return torch.cat(chunks) if chunks else torch.zeros(0)

    @abstractmethod
    def score(
        self,
        outputs: torch.Tensor,
        data: ImageSet,
        info: DatasetInfo,
        *,
        meta: Mapping[str, np.ndarray] | None = None,
        groups: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """The task's metrics of given outputs on `data` (an ensemble's, say), without a model."""

    def options(self) -> dict[str, Any]:
        """The task's own options (its dataclass fields) by name, as a run's config records them."""
        return asdict(self)
