"""A complete fedistill algorithm in one file: the coordinate-wise trimmed mean of the clients' models
(Yin et al. 2018), a FedAvg whose average shrugs off a few outlying clients.

Importing this module registers it as `trimmed-mean`; from then on a run names it like any other
(`algorithm = "trimmed-mean"`, options in a `[trimmed-mean]` table). The client owns one site's data and
model; the server sees client ids and replies, nothing else. They meet only through `Message`s, which
the fleet checks on receipt and records in the ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    register,
)
from fedistill.algorithms.shared.training import LocalTraining, new_model, test_metrics, train_local
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message, expect_arrays, state_specs
from fedistill.federation.reply_spec import TRAIN_METRICS, ReplySpec
from fedistill.seeding import torch_generator


@dataclass(frozen=True)
class TrimmedMeanOptions:
    """The `[trimmed-mean]` table: how the server combines the clients' models."""

    trim: float = 0.2
    """Share of the clients' values dropped at each end of every coordinate before the rest are averaged:
    0 is the plain mean, 0.5 the coordinate-wise median; default 0.2 (of 5 clients, 1 at each end)."""

    def validate(self) -> None:
        """Called when the run's config is read: a bad value stops the run before anything is written."""
        if not 0.0 <= self.trim <= 0.5:
            raise ConfigError(f"trimmed-mean.trim must be in [0, 0.5], got {self.trim}")


class TrimmedMeanClient(ClientLogic):
    """One site: trains the model it receives on its private data and sends the parameters back."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.model = new_model(ctx.config, ctx.info)
        self.specs = state_specs(self.model.state_dict())
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    @handles("train")
    def train(self, message: Message) -> Message:
        """`train`: load the global parameters, train locally, reply with the trained ones."""
        expect_arrays(message, "parameters", self.specs)  # a malformed request never reaches the model
        round = int(message.scalar("config", "round"))
        self.model.load_state_dict(message.tensors("parameters"))
        generator = torch_generator(self.ctx.config.seed, "local-training", self.ctx.client_id, round)
        metrics = train_local(self.model, self.ctx.train, self.ctx.info, self.training, generator)
        metrics["num_samples"] = len(self.ctx.train)
        return Message.build(
            "train", arrays={"parameters": self.model.state_dict()}, scalars={"metrics": metrics}
        )


def trimmed_mean(values: torch.Tensor, trim: float) -> torch.Tensor:
    """The mean over dimension 0 of `values` after dropping `trim` of them at each end, coordinate-wise;
    at least one value (two for an even count) is always kept, so trim = 0.5 gives the median."""
    count = values.shape[0]
    drop = min(math.floor(trim * count), (count - 1) // 2)
    ordered = values.sort(dim=0).values
    return ordered[drop : count - drop].mean(dim=0)


class TrimmedMeanServer(ServerLogic):
    """Holds the global model; each round, every client trains it and the trimmed mean replaces it."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options: TrimmedMeanOptions = ctx.options
        self.model = new_model(ctx.config, ctx.info)
        self.specs = state_specs(self.model.state_dict())

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        """One round: broadcast the model, gather the valid replies, combine them."""
        request = Message.build(
            "train", arrays={"parameters": self.model.state_dict()}, scalars={"config": {"round": round}}
        )
        expect = ReplySpec({"parameters": self.specs}, TRAIN_METRICS)  # anything else is dropped on receipt
        sent = fleet.broadcast(request, timeout=self.ctx.config.timeout or None, expect=expect)
        replies = successful(sent, minimum=self.ctx.config.min_clients, what="trained parameters")
        states = [reply.tensors("parameters") for reply in replies.values()]
        combined = {}
        for name, first in self.model.state_dict().items():
            if first.is_floating_point():
                stacked = torch.stack([state[name].to(torch.float64) for state in states])
                combined[name] = trimmed_mean(stacked, self.options.trim).to(first.dtype)
            else:  # integer buffers (BatchNorm's batch counter): any client's value will do
                combined[name] = states[0][name].clone()
        self.model.load_state_dict(combined)
        losses = [float(reply.scalar("metrics", "train_loss")) for reply in replies.values()]
        return {"train_loss": sum(losses) / len(losses), "clients": len(replies)}

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The global model on the test set (the evaluation harness, outside the protocol)."""
        return test_metrics(self.ctx.evaluate(self.model))

    def models(self) -> dict[str, torch.nn.Module]:
        """What the run saves under models/ at the end."""
        return {"global": self.model}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the server, so that `--resume` ends as an uninterrupted run."""
        return {"model": clone_state(self.model)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s output."""
        self.model.load_state_dict(state["model"])


ALGORITHM = register(
    Algorithm(
        "trimmed-mean",
        "Trimmed mean: FedAvg with a coordinate-wise trimmed mean of the models (the docs' example)",
        TrimmedMeanClient,
        TrimmedMeanServer,
        TrimmedMeanOptions,
        # the common keys it never reads, with what decides instead: `[trimmed-mean] fraction` is refused
        unused_keys={"fraction": "every client trains every round; none is sampled out"},
    )
)
