"""Classification: one class per image; cross-entropy; accuracy. FedIOD compares per-image logits and
its generator draws from noise alone. Every number the project measured before tasks existed is this
task's, computed by exactly the same operations."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import batches
from fedistill.tasks.base import Inputs, Task


@dataclass(frozen=True)
class Classification(Task):
    """One class per image: cross-entropy loss, accuracy."""

    targets_are_classes = True

    name = "classification"
    target = "class index"
    headline = "accuracy"
    columns = (("accuracy", "test %", "percent"),)
    reports_global_accuracy = True

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
        return batches(
            data, info, batch_size, shuffle=shuffle, generator=generator, augment=augment, drop_last=drop_last
        )

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def column_counts(self, data: ImageSet, info: DatasetInfo) -> torch.Tensor:
        """Samples per class."""
        return torch.bincount(data.y, minlength=info.num_classes).to(torch.int64)

    @torch.no_grad()
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
        """Accuracy and mean cross-entropy, summed batch by batch (no set's logits are held at once)."""
        was_training = model.training
        model.eval()
        correct, loss, count = 0, 0.0, 0
        for x, y in self.batches(data, info, batch_size, shuffle=False, generator=None, augment=False):
            logits = self.predict(model, x)
            loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum())
            count += len(y)
        model.train(was_training)
        if count == 0:
            return self.empty_metrics()
        return {"accuracy": correct / count, "loss": loss / count, "count": count}

    def score(
        self,
        outputs: torch.Tensor,
        data: ImageSet,
        info: DatasetInfo,
        *,
        meta: Mapping[str, np.ndarray] | None = None,
        groups: Sequence[str] | None = None,
    ) -> dict[str, float]:
        """Accuracy and mean cross-entropy of given logits (N, C)."""
        outputs = outputs.detach().cpu()
        if len(data) == 0:
            return self.empty_metrics()
        loss = F.cross_entropy(outputs, data.y).item()
        return {
            "accuracy": float((outputs.argmax(1) == data.y).float().mean()),
            "loss": loss,
            "count": len(data),
        }
