"""What a task is: the one object data, models, algorithms and reports ask instead of assuming labels.

A task says what a target is (a class index, a mask, an instance map, an image), how a batch becomes a
model's inputs and targets, the local training loss, the metrics and the headline of a summary, what
FedIOD's output distillation compares (per-image logits, per-pixel logits, output images) and what its
generator is conditioned on. Classification, semantic and instance segmentation, reconstruction and text
classification are tasks; a method written once runs on each task it makes sense for.

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

from fedistill.data.base import DatasetInfo, ImageSet

#: A batch as the task hands it to a model: a tensor, or a tuple when the task needs more than the input
#: (reconstruction with data consistency also carries the measured k-space and the sampling mask).
Inputs = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Task(ABC):
    name: ClassVar[str]
    target: ClassVar[str]  # what one target is: "class index", "mask", "instance map", "image"
    headline: ClassVar[str]  # the metric a summary leads with (reported as test_<headline>)
    distils: ClassVar[str]  # what FedIOD's output distillation compares
    condition: ClassVar[str]  # what FedIOD's generator is conditioned on
    #: the metrics of this task's results table, in order, with their column titles and formats
    columns: ClassVar[tuple[tuple[str, str, str], ...]]

    # --- data ----------------------------------------------------------------------------------
    def check(self, info: DatasetInfo, data: ImageSet, what: str) -> None:
        """Raise ValueError when `data`'s targets are not this task's (shape, range)."""
        if data.dense != (self.target != "class index"):
            shape = "(N, H, W)" if self.target != "class index" else "(N,)"
            raise ValueError(f"{what}: task {self.name!r} needs targets {shape}, got {tuple(data.y.shape)}")

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

    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The local training loss (a scalar, mean over the batch)."""

    # --- scores --------------------------------------------------------------------------------
    @abstractmethod
    def evaluate(
        self,
        model: nn.Module,
        data: ImageSet,
        info: DatasetInfo,
        *,
        batch_size: int = 512,
        meta: Mapping[str, np.ndarray] | None = None,
        groups: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """Metrics of `model` on `data` in eval mode, with `self.headline`, "loss" and "count" among them.
        `meta` are the set's per-sample facts (`LoadedDataset.test_meta`), `groups` each sample's
        source name, for per-source metrics."""

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
        raise NotImplementedError(f"task {self.name!r} cannot score outputs without a model")

    def options(self) -> dict[str, Any]:
        return asdict(self)
