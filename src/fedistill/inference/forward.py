"""A trained model's outputs on a stack of images, batch by batch, as its task's evaluation computes them.

Predict asks a trained model (what `fedistill.inference.loading.load_model` returns) only for its module,
task, dataset facts, run config and `preprocess` (the normalisation its training batches had), and
computes the outputs through `task.predict`, the call evaluation makes, so a prediction is exactly what
the run's test metrics scored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo
from fedistill.errors import ConfigError
from fedistill.tasks import Task


class Trained(Protocol):
    """What predict needs of a loaded model."""

    module: nn.Module
    task: Task
    info: DatasetInfo
    config: RunConfig
    algorithm: str

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """Images as the model takes them: normalised float32 (N, C, H, W) on its device."""
        ...


def dataset_options(model: Trained) -> dict:
    """The options the run gave its dataset (its `[<dataset>]` table), which say how its data were made."""
    return dict(model.config.options.get(model.config.dataset, {}))


def device_of(module: nn.Module) -> torch.device:
    """The device of the module's parameters; the CPU for a module without any."""
    parameter = next(module.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def check_batch_size(batch_size: object) -> int:
    """`--batch-size` as a positive integer, else a ConfigError."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive integer, got {batch_size!r}")
    return batch_size


def chunks(count: int, batch_size: int) -> Iterator[slice]:
    """Consecutive slices of at most `batch_size` items covering `count` items."""
    check_batch_size(batch_size)
    for start in range(0, count, batch_size):
        yield slice(start, min(start + batch_size, count))


@torch.no_grad()
def outputs(model: Trained, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The model's outputs (logits, or images for reconstruction) on uint8 or [0, 1] images (N, C, H, W),
    on the CPU, in order."""
    model.module.eval()
    device = device_of(model.module)
    parts = [
        model.task.predict(model.module, model.preprocess(images[part]).to(device)).float().cpu()
        for part in chunks(len(images), batch_size)
    ]
    return torch.cat(parts) if parts else torch.zeros(0)
