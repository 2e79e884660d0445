"""Local training and evaluation shared by the classic algorithms, and parameter averaging."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedistill import devices
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import FederationError
from fedistill.models import build_model
from fedistill.seeding import derive_seed, global_rng, seeded
from fedistill.tasks import Classification, Inputs, Task, make_task


@dataclass(frozen=True)
class LocalTraining:
    """How a client trains in one round: epochs, or a fixed number of mini-batch steps, on its task."""

    epochs: int
    steps: int
    batch_size: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    augment: bool
    task: Task = field(default_factory=Classification)

    @staticmethod
    def from_config(config: RunConfig, info: DatasetInfo) -> LocalTraining:
        """The local training a run's common keys describe, on the dataset's task."""
        task = task_of(config, info)
        augment = {"auto": task.usual_augment(info), "on": True, "off": False}[config.augment]
        return LocalTraining(
            epochs=config.local_epochs,
            steps=config.local_steps,
            batch_size=config.batch_size,
            optimizer=config.optimizer,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            augment=augment,
            task=task,
        )

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """A fresh SGD or Adam optimiser over `params` with the run's settings."""
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


def task_of(config: RunConfig, info: DatasetInfo) -> Task:
    """The run's task: the one the dataset declares, with the `[task]` table's options."""
    return make_task(info, config.options.get("task", {}))


def new_model(config: RunConfig, info: DatasetInfo, name: str | None = None) -> nn.Module:
    """The run's model, initialised from the run seed: every site and the server start identical.
    Its output is sized for the task (e.g. three classes per pixel for instance segmentation), and
    the `[model_options]` table reaches every model that takes its keys."""
    task = task_of(config, info)
    channels = task.output_channels(info)
    sized = info if channels == info.num_classes else dataclasses.replace(info, num_classes=channels)
    model = seeded(
        config.seed,
        lambda: build_model(
            name or config.model,
            sized,
            norm=None if config.norm == "auto" else config.norm,
            group_norm_groups=config.group_norm_groups,
            options=config.options.get("model_options") or None,
        ),
        "model-init",
        name or config.model,
    )  # initialised on the CPU (the same weights everywhere), then moved
    return model.to(devices.current())


def _prox_term(model: nn.Module, anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())  # type: ignore[return-value]


def local_batches(
    data: ImageSet, info: DatasetInfo, spec: LocalTraining, generator: torch.Generator
) -> Iterator[tuple[Inputs, torch.Tensor]]:
    """One round's mini-batches: `spec.steps` of them if > 0, else `spec.epochs` epochs."""
    if len(data) < 2:
        raise FederationError(f"a client needs at least 2 training samples, this one has {len(data)}")
    # every batch full when the data fills one (so never a final batch of 1 under BatchNorm); the partial
    # remainder is left out of that epoch only, as the order is reshuffled every epoch
    drop_last = len(data) > spec.batch_size
    steps, epoch = 0, 0
    while True:
        for x, y in spec.task.batches(
            data,
            info,
            spec.batch_size,
            shuffle=True,
            generator=generator,
            augment=spec.augment,
            drop_last=drop_last,
        ):
            yield x, y
            steps += 1
            if 0 < spec.steps <= steps:
                return
        epoch += 1
        if spec.steps <= 0 and epoch >= spec.epochs:
            return


def check_finite(loss: torch.Tensor, what: str, step: int) -> None:
    """A clear error when a training loss is NaN or infinite."""
    if not math.isfinite(loss.item()):
        raise FederationError(
            f"{what} diverged: loss is {loss.item()} at step {step} (lower the learning rate)"
        )


def train_local(
    model: nn.Module,
    data: ImageSet,
    info: DatasetInfo,
    spec: LocalTraining,
    generator: torch.Generator,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    prox_mu: float = 0.0,
) -> dict[str, float]:
    """Train `model` in place on `data`; FedProx's proximal term when `prox_mu` > 0."""
    optimizer = optimizer or spec.make_optimizer(model.parameters())
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()} if prox_mu > 0 else None
    model.train()
    total, count, steps = 0.0, 0, 0
    # dropout draws from torch's global RNG: seeded per step from this training's own stream, so a run
    # (and a resumed one) draws the same masks whatever ran before in the process
    dropout_seed = generator.initial_seed() if has_dropout(model) else None
    for x, y in local_batches(data, info, spec, generator):
        dropout = (
            global_rng(derive_seed(dropout_seed, "dropout", steps))
            if dropout_seed is not None
            else nullcontext()
        )
        with dropout:
            loss = spec.task.loss(spec.task.predict(model, x), y)
        objective = loss if anchor is None else loss + 0.5 * prox_mu * _prox_term(model, anchor)
        check_finite(loss, "local training", steps)
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        optimizer.step()
        total += loss.item() * y.shape[0]
        count += y.shape[0]
        steps += 1
    return {"train_loss": total / count, "steps": steps}


def has_dropout(model: nn.Module) -> bool:
    """Whether `model` holds a dropout layer that drops (its masks come from torch's global RNG)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def evaluate_model(
    model: nn.Module,
    data: ImageSet,
    info: DatasetInfo,
    batch_size: int = 512,
    *,
    task: Task | None = None,
    meta: Mapping[str, np.ndarray] | None = None,
    groups: Sequence[str] | None = None,
) -> dict[str, float]:
    """The task's metrics of `model` on `data`, in eval mode (classification: accuracy and mean
    cross-entropy); `task` defaults to the dataset's with default options."""
    task = task or make_task(info)
    return task.evaluate(model, data, info, batch_size=batch_size, meta=meta, groups=groups)


def test_metrics(result: Mapping[str, float]) -> dict[str, float]:
    """`evaluate_model`'s result as a round's test metrics: test_accuracy, test_loss, test_dice, ..."""
    return {f"test_{key}": float(value) for key, value in result.items() if key != "count"}


def local_metric_names(task: Task) -> tuple[str, str]:
    """What a client reports of its model on its own share of the test set: the task's headline
    ("local accuracy" for classification, FedMD-CG's) and how many samples it scored."""
    return f"local_{task.headline}", "local_count"


def local_metrics(task: Task, result: Mapping[str, float]) -> dict[str, float]:
    """A client's local metrics from an evaluation: the task's headline and the sample count."""
    name, count = local_metric_names(task)
    return {name: float(result[task.headline]), count: float(result["count"])}


def average_states(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """Weighted average of state dicts. Integer buffers (BatchNorm's batch counter) take the first value."""
    total = float(sum(weights))
    if total <= 0:
        raise FederationError("cannot average: the weights of the received models sum to zero")
    out: dict[str, torch.Tensor] = {}
    for name, first in states[0].items():
        if first.is_floating_point():
            out[name] = sum(
                s[name].to(torch.float64) * (w / total) for s, w in zip(states, weights, strict=True)
            ).to(first.dtype)
        else:
            out[name] = first.clone()
    return out
