"""FL-MRCM's cross-site modelling at a source site: latent vectors, the domain discriminator, its two
losses and one local step, in the order of the released code's ``LocalUpdate_ad_da``.

A latent vector is the U-Net's bottleneck average-pooled to 2×2 and flattened: 4 · chans · 2^pools
numbers (2048 for the reference net, chans 32 and 4 poolings). The discriminator maps it to two logits
scored against a one-hot domain code, source (1, 0) and target (0, 1), by binary cross-entropy averaged
over the batch and both logits. As in the code, the discriminator learns the codes swapped and the
reconstruction net learns them straight:

  L_D   = ½ [BCE(D(z_s), (0, 1)) + BCE(D(z_t), (1, 0))]   (D's step, on detached features)
  L_adv = ½ [BCE(D(z_s), (1, 0)) + BCE(D(z_t), (0, 1))]   (the net's step, after D's, D held fixed)

so the net is pushed to give its source features the score D has learnt for target features. At a
source site z_t are the target's received vectors, constants: the second term of L_adv counts in the
value but adds no gradient (in the code, where every site's data sat on one machine, it also moved the
net through the target's inputs, which in a federation never reach a source).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedistill.algorithms.shared.training import LocalTraining, check_finite, local_batches
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.tasks import Inputs, Task

#: The side of the pooled bottleneck grid (the code's ``adaptive_avg_pool2d(output, 2)``).
POOLED = 2
SOURCE, TARGET = (1.0, 0.0), (0.0, 1.0)  # the code's domain codes


class FeatureDiscriminator(nn.Module):
    """The code's ``Feature_discriminator``: Linear(dim, width) → LeakyReLU(0.2) → Linear(width, 2) →
    LeakyReLU(0.2), two domain logits (the final LeakyReLU on the logits is the code's)."""

    def __init__(self, dim: int, width: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, width)
        self.fc2 = nn.Linear(width, 2)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.fc2(F.leaky_relu(self.fc1(z), 0.2)), 0.2)


def latent_vectors(bottleneck: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) bottleneck features → (B, 4·C) latent vectors."""
    return F.adaptive_avg_pool2d(bottleneck, POOLED).flatten(1)


def predict_with_latent(model: nn.Module, task: Task, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's prediction and the latent vectors of the same pass (one forward, graph kept)."""
    with model.bottleneck_features() as captured:  # type: ignore[operator]
        outputs = task.predict(model, inputs)
    return outputs, latent_vectors(captured[-1])


def latent_size(model: nn.Module, info: DatasetInfo) -> int:
    """The length of `model`'s latent vectors on `info`'s images (one pass on a blank image)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device  # the blank image goes where the model is
    with torch.no_grad(), model.bottleneck_features() as captured:  # type: ignore[operator]
        model(torch.zeros(1, info.channels, info.image_size, info.image_size, device=device))
    model.train(was_training)
    return int(latent_vectors(captured[-1]).shape[1])


def _domain_loss(logits: torch.Tensor, code: tuple[float, float]) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, logits.new_tensor(code).expand_as(logits))


def discriminator_loss(
    discriminator: nn.Module, z_source: torch.Tensor, z_target: torch.Tensor
) -> torch.Tensor:
    """L_D: the discriminator's loss, with the codes swapped as in the code."""
    return 0.5 * (
        _domain_loss(discriminator(z_source), TARGET) + _domain_loss(discriminator(z_target), SOURCE)
    )


def alignment_loss(discriminator: nn.Module, z_source: torch.Tensor, z_target: torch.Tensor) -> torch.Tensor:
    """L_adv: the reconstruction net's adversarial loss (the codes straight)."""
    return 0.5 * (
        _domain_loss(discriminator(z_source), SOURCE) + _domain_loss(discriminator(z_target), TARGET)
    )


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """`module`'s parameters take no gradient inside the block (the code's ``set_requires_grad(False)``)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


@dataclass(frozen=True)
class StepLosses:
    """The losses of one source step: reconstruction, adversarial alignment and discriminator."""

    reconstruction: float
    alignment: float
    discriminator: float


def source_step(
    model: nn.Module,
    discriminator: nn.Module,
    optimizer: torch.optim.Optimizer,
    d_optimizer: torch.optim.Optimizer,
    task: Task,
    inputs: Inputs,
    targets: torch.Tensor,
    z_target: torch.Tensor,
    weight: float,
    step: int = 0,
) -> StepLosses:
    """One source mini-batch: D's step on L_D, then the net's on L_rec + weight · L_adv with the updated D."""
    outputs, z_source = predict_with_latent(model, task, inputs)
    d_loss = discriminator_loss(discriminator, z_source.detach(), z_target)
    check_finite(d_loss, "FL-MRCM's discriminator", step)
    d_optimizer.zero_grad(set_to_none=True)
    d_loss.backward()
    d_optimizer.step()
    with frozen(discriminator):
        adv = alignment_loss(discriminator, z_source, z_target)
        reconstruction = task.loss(outputs, targets)
        loss = reconstruction + weight * adv
        check_finite(loss, "FL-MRCM local training", step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    optimizer.step()
    return StepLosses(reconstruction.item(), adv.item(), d_loss.item())


class RowStream:
    """The received target vectors in seeded random order, pass after pass: each source step takes as
    many as its batch holds (at most all of them), as the code's shuffled target loader does."""

    def __init__(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        self.rows, self.generator = rows, generator
        self.order = torch.empty(0, dtype=torch.int64)

    def take(self, count: int) -> torch.Tensor:
        """The next `count` target vectors (at most all of them), a new seeded order started when one runs
        out."""
        count = min(count, len(self.rows))
        while len(self.order) < count:
            self.order = torch.cat([self.order, torch.randperm(len(self.rows), generator=self.generator)])
        picked, self.order = self.order[:count], self.order[count:]
        return self.rows[picked]


def train_aligned(
    model: nn.Module,
    discriminator: nn.Module,
    d_optimizer: torch.optim.Optimizer,
    data: ImageSet,
    info: DatasetInfo,
    spec: LocalTraining,
    generator: torch.Generator,
    target_rows: RowStream,
    weight: float,
) -> dict[str, float]:
    """A source site's round: `spec`'s epochs or steps of `source_step`; the reported train_loss is
    the reconstruction loss alone (comparable with FedAvg's)."""
    optimizer = spec.make_optimizer(model.parameters())
    model.train()
    discriminator.train()
    total, count, adv, d_total, steps = 0.0, 0, 0.0, 0.0, 0
    for x, y in local_batches(data, info, spec, generator):
        z_target = target_rows.take(y.shape[0])
        losses = source_step(
            model, discriminator, optimizer, d_optimizer, spec.task, x, y, z_target, weight, steps
        )
        total += losses.reconstruction * y.shape[0]
        count += y.shape[0]
        adv += losses.alignment
        d_total += losses.discriminator
        steps += 1
    return {
        "train_loss": total / count,
        "alignment_loss": adv / steps,
        "discriminator_loss": d_total / steps,
        "steps": steps,
    }


@torch.no_grad()
def target_vectors(
    model: nn.Module, task: Task, batches: Iterable[tuple[Inputs, torch.Tensor]]
) -> torch.Tensor:
    """The target site's latent vectors of its (undersampled) inputs, in eval mode."""
    model.eval()
    rows = [predict_with_latent(model, task, x)[1] for x, _ in batches]
    return torch.cat(rows).float().contiguous()
