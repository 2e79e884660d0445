"""Local training and evaluation shared by the classic algorithms, and parameter averaging."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import batches
from fedistill.errors import FederationError
from fedistill.experiment.config import RunConfig
from fedistill.models import build_model
from fedistill.seeding import seeded


@dataclass(frozen=True)
class LocalTraining:
    """How a client trains in one round: epochs, or a fixed number of mini-batch steps."""

    epochs: int
    steps: int
    batch_size: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    augment: bool

    @staticmethod
    def from_config(config: RunConfig, info: DatasetInfo) -> LocalTraining:
        usual = info.crop_padding > 0 or info.horizontal_flip
        augment = {"auto": usual, "on": True, "off": False}[config.augment]
        return LocalTraining(
            epochs=config.local_epochs,
            steps=config.local_steps,
            batch_size=config.batch_size,
            optimizer=config.optimizer,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            augment=augment,
        )

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


def new_model(config: RunConfig, info: DatasetInfo, name: str | None = None) -> nn.Module:
    """The run's model, initialised from the run seed: every site and the server start identical."""
    return seeded(
        config.seed,
        lambda: build_model(
            name or config.model, info, norm=config.norm, group_norm_groups=config.group_norm_groups
        ),
        "model-init",
        name or config.model,
    )


def _prox_term(model: nn.Module, anchor: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())  # type: ignore[return-value]


def local_batches(
    data: ImageSet, info: DatasetInfo, spec: LocalTraining, generator: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One round's mini-batches: `spec.steps` of them if > 0, else `spec.epochs` epochs."""
    if len(data) < 2:
        raise FederationError(f"a client needs at least 2 training samples, this one has {len(data)}")
    drop_last = len(data) > spec.batch_size  # never a final batch of 1 under BatchNorm
    steps, epoch = 0, 0
    while True:
        for x, y in batches(
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
    for x, y in local_batches(data, info, spec, generator):
        loss = F.cross_entropy(model(x), y)
        objective = loss if anchor is None else loss + 0.5 * prox_mu * _prox_term(model, anchor)
        check_finite(loss, "local training", steps)
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        optimizer.step()
        total += loss.item() * len(y)
        count += len(y)
        steps += 1
    return {"train_loss": total / count, "steps": steps}


@torch.no_grad()
def evaluate_model(
    model: nn.Module, data: ImageSet, info: DatasetInfo, batch_size: int = 512
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of `model` on `data`, in eval mode."""
    was_training = model.training
    model.eval()
    correct, loss, count = 0, 0.0, 0
    for x, y in batches(data, info, batch_size, shuffle=False, generator=None, augment=False):
        logits = model(x)
        loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(1) == y).sum())
        count += len(y)
    model.train(was_training)
    if count == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "count": 0}
    return {"accuracy": correct / count, "loss": loss / count, "count": count}


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
