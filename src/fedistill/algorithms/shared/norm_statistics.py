"""`recalibrate_norm = true`: the sites' side, and the server's request.

FedAvg averages the sites' BatchNorm running statistics with the weights; each site's statistics describe
its own data under its own weights, and on non-IID sites their average matches neither the pooled data nor the
final weights (Li et al. 2016, AdaBN; Zhong et al. 2023, FixBN). So, after the last round, the server sends
the model it exports to every site (`evaluate.norm_statistics`: the model's parameters and its
architecture's name). Each site runs it over its training split in batches of the run's size, in order,
without augmentation or gradients, its BatchNorm layers in training mode (each batch normalised by its own
statistics, as in training) and every other layer in evaluation mode, and answers, for every BatchNorm
layer that keeps running statistics, the per-channel mean and mean of squares of the layer's input over
every sample and position of the split (kind `activation-statistics`, float64, no image), with the
split's size. The server pools them weighted by size (every sample of a dataset gives a layer as many
positions): mean = sum n_k m_k / N, variance = sum n_k q_k / N - mean^2, the biased variance of the pooled
inputs; it writes them into the layers' `running_mean` and `running_var` (`num_batches_tracked`
unchanged). A client logic takes part by inheriting `NormStatistics`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from fedistill.algorithms.shared.training import new_model, task_of
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import FederationError
from fedistill.federation.client import handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import NUM_SAMPLES, ReplySpec
from fedistill.models.norm import norm_layers
from fedistill.tasks import Task

NORM_QUERY = "evaluate.norm_statistics"
KIND = "activation-statistics"
PARTS = ("mean", "square")  # what a site sends of each layer's input, per channel: E[x] and E[x^2]


@torch.no_grad()
def site_moments(
    model: nn.Module, task: Task, data: ImageSet, info: DatasetInfo, batch_size: int
) -> dict[str, np.ndarray]:
    """`<layer>.mean` and `<layer>.square`: each BatchNorm layer's per-channel mean and mean of squares of
    its input over `data` (module docstring); zeros for an empty set. `model` is left as it was, but for the
    running statistics its passes update."""
    layers = norm_layers(model)
    sums: dict[str, list[Any]] = {name: [0.0, 0.0, 0] for name in layers}

    def recorder(name: str) -> Any:
        def record(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach()  # (N, C, ...): channels second
            x = x.to(torch.float32 if x.device.type == "mps" else torch.float64).transpose(0, 1).flatten(1)
            total = sums[name]
            total[0] += x.sum(1).cpu().double()
            total[1] += (x * x).sum(1).cpu().double()
            total[2] += x.shape[1]

        return record

    hooks = [layer.register_forward_pre_hook(recorder(name)) for name, layer in layers.items()]
    was_training = model.training
    model.eval()
    for layer in layers.values():
        layer.train()
    # a last batch of one sample would leave a BatchNorm over (N, C) no batch statistics: one more per batch
    size = batch_size + 1 if len(data) % batch_size == 1 and len(data) > 1 else batch_size
    try:
        for inputs, _ in task.batches(data, info, size, shuffle=False, generator=None, augment=False):
            task.predict(model, inputs)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    moments = {}
    for name, layer in layers.items():
        first, second, count = sums[name]
        zeros = torch.zeros(layer.num_features, dtype=torch.float64)
        moments[f"{name}.mean"] = (first / count if count else zeros).numpy()
        moments[f"{name}.square"] = (second / count if count else zeros).numpy()
    return moments


def pooled(
    answers: Iterable[tuple[Mapping[str, np.ndarray], float]], layers: Iterable[str]
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], float]:
    """Each layer's (mean, variance) of the sites' `(moments, size)` answers pooled, and the size of all."""
    answers = list(answers)
    total = float(sum(n for _, n in answers))
    if total <= 0:
        raise FederationError(f"{NORM_QUERY}: no site holds a training sample to recompute the statistics on")
    statistics = {}
    for name in layers:
        mean = sum(n * np.asarray(m[f"{name}.mean"], np.float64) for m, n in answers) / total
        square = sum(n * np.asarray(m[f"{name}.square"], np.float64) for m, n in answers) / total
        statistics[name] = (mean, np.maximum(square - mean**2, 0.0))  # rounding may go below 0
    return statistics, total


def write_statistics(model: nn.Module, statistics: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Each named BatchNorm layer's running mean and variance set to `statistics`' (mean, variance)."""
    layers = norm_layers(model)
    for name, (mean, variance) in statistics.items():
        layer = layers[name]
        layer.running_mean.copy_(torch.as_tensor(mean, dtype=layer.running_mean.dtype))  # type: ignore[union-attr]
        layer.running_var.copy_(torch.as_tensor(variance, dtype=layer.running_var.dtype))  # type: ignore[union-attr]


class NormStatistics:
    """A site's answer to `evaluate.norm_statistics`: the BatchNorm input moments of its training split."""

    ctx: Any  # the site's ClientContext

    @handles(NORM_QUERY, read_only=True)
    def norm_statistics(self, message: Message) -> Message:
        """The received model's per-channel BatchNorm input moments on this site's training split; the model
        is dropped after it. Refused under differential privacy, which does not account for them."""
        if getattr(self, "budget", None) is not None:
            raise FederationError(
                f"client {self.ctx.client_id} runs with differential privacy, which does not account for "
                f"the statistics {NORM_QUERY} asks of its data"
            )
        ctx = self.ctx
        model = new_model(ctx.config, ctx.info, str(message.scalar("config", "model")))
        model.load_state_dict(message.tensors("parameters"))
        task = task_of(ctx.config, ctx.info)
        moments = site_moments(model, task, ctx.train, ctx.info, ctx.config.batch_size)
        return Message.build(
            NORM_QUERY, arrays={KIND: moments}, scalars={"metrics": {NUM_SAMPLES: len(ctx.train)}}
        )


def recalibrate(fleet: Fleet, model: nn.Module, architecture: str, timeout: float | None = None) -> int:
    """Write into `model`'s BatchNorm layers the statistics every site's answer pools to; the number of
    training samples they cover."""
    request = Message.build(
        NORM_QUERY, arrays={"parameters": model.state_dict()}, scalars={"config": {"model": architecture}}
    )
    layers = {name: layer.num_features for name, layer in norm_layers(model).items()}
    spec = {f"{name}.{part}": ArraySpec("float64", (c,)) for name, c in layers.items() for part in PARTS}
    expect = ReplySpec({KIND: spec}, (NUM_SAMPLES,))
    replies = successful(
        fleet.broadcast(request, timeout=timeout, expect=expect), what="BatchNorm statistics"
    )
    answers = [
        ({name: r.array(KIND, name) for name in spec}, float(r.scalar("metrics", NUM_SAMPLES)))
        for r in replies.values()
    ]
    statistics, total = pooled(answers, layers)
    write_statistics(model, statistics)
    return int(total)
