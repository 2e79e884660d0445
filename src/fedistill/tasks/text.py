"""Text classification: one class per text, given as token ids (N, L); cross-entropy; accuracy.

A batch is cut to its longest text (trailing padding columns dropped), which is most of a batch's length
for short texts and changes no prediction: the model masks padding out. Training batches carry a
seed for the model's dropout, drawn from the batch generator, so local training follows the run seed
alone and a resumed run is exact. There is no augmentation of token ids, and FedIOD's generator has
nothing to condition on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from fedistill import devices
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError
from fedistill.seeding import global_rng
from fedistill.tasks.base import Inputs
from fedistill.tasks.classification import Classification


def trim_padding(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Token ids (B, L) without the trailing columns that are padding in every row (at least one left)."""
    used = (ids != pad_id).any(0).nonzero()
    length = int(used.max()) + 1 if len(used) else 1
    return ids[:, :length]


@dataclass(frozen=True)
class TextClassification(Classification):
    """One class per text of token ids: cross-entropy loss, accuracy; batches cut to their longest text."""

    name = "text-classification"
    target = "class index"
    headline = "accuracy"
    columns = (("accuracy", "test %", "percent"),)
    reports_global_accuracy = False  # the oracle's column is one of image-classification tables

    def check(self, info: DatasetInfo, data: ImageSet, what: str) -> None:
        super().check(info, data, what)
        if not data.tokens or info.text is None:
            raise ValueError(f"{what}: task {self.name!r} needs token ids (N, L), got {tuple(data.x.shape)}")

    def usual_augment(self, info: DatasetInfo) -> bool:
        return False

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
        """(token ids, targets); with a `generator`, the inputs are (token ids, dropout seed)."""
        if augment:
            raise ConfigError("text has no augmentation: set augment = 'auto' or 'off'")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not data.tokens or info.text is None:
            raise ValueError(f"task {self.name!r} needs token ids (N, L), got {tuple(data.x.shape)}")
        n = len(data)
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        stop = n - n % batch_size if drop_last else n
        return self._batches(data, info.text.pad_id, order, batch_size, stop, generator)

    @staticmethod
    def _batches(
        data: ImageSet,
        pad_id: int,
        order: torch.Tensor,
        batch_size: int,
        stop: int,
        generator: torch.Generator | None,
    ) -> Iterator[tuple[Inputs, torch.Tensor]]:
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            ids = trim_padding(data.x[idx], pad_id)
            ids, labels = devices.on_device(ids), devices.on_device(data.y[idx])
            if generator is None:
                yield ids, labels
            else:
                seed = torch.randint(0, 2**62, (1,), generator=generator)
                yield (ids, seed), labels

    def predict(self, model: nn.Module, inputs: Inputs) -> torch.Tensor:
        if isinstance(inputs, torch.Tensor):
            return model(inputs)
        ids, seed = inputs
        with global_rng(int(seed)):
            return model(ids)
