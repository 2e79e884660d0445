"""FedPer (Arivazhagan et al. 2019): share the base, keep the head private.

Every model splits into ``extractor.*`` (base) and ``classifier.*`` (head) parameters. Round: the
server sends the averaged base to a sample of clients; each puts it under its own private head,
trains the whole model locally and returns only the base; the server averages the bases (by sample
count or uniformly), as FedAvg does with whole models. The head never leaves the client.
LG-FedAvg (lgfedavg.py) is the mirror image and reuses the logic here with the other prefix.

Metrics. ``local_accuracy`` is FedMD-CG's "local test accuracy": each client's own full model (shared
part + private part, just after local training, as FedAvg reports it) on its own IID shard of the test
set, sample-weighted over the reporting clients. ``personal_test_accuracy`` is the mean of those
models on the whole test set (what Standalone reports as ``test_accuracy``). There is no
``test_accuracy``: the server holds only the shared part, so no global model exists. The paper's
"global test accuracy" averages whole local models on the server, which would need the private parts
to leave the clients, against what these methods promise; the in-process runner reports it as
``global_accuracy_oracle``, an evaluation-only oracle outside the protocol (algorithms/shared/oracle.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    register,
)
from fedistill.algorithms.fedmdcg.personalized import (
    ask_sampled,
    check_split,
    evaluates_local,
    local_report,
    part_of,
    prefixed,
    private_start,
    summarise_local,
    unprefixed,
)
from fedistill.algorithms.shared.oracle import average_local_models
from fedistill.algorithms.shared.training import LocalTraining, average_states, new_model, train_local
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet
from fedistill.federation.messages import Message, expect_arrays, state_specs
from fedistill.federation.reply_spec import TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.models.base import EXTRACTOR_PREFIX
from fedistill.seeding import torch_generator


@dataclass(frozen=True)
class SharedPartOptions:
    """`[fedper]` options (and, as `LGFedAvgOptions`, `[lgfedavg]`): how the server weighs the shared
    parts."""

    section: ClassVar[str] = "fedper"
    weighting: str = "samples"  # samples | uniform: how the server weighs the received parts

    def validate(self) -> None:
        """ConfigError unless `weighting` is samples or uniform."""
        if self.weighting not in ("samples", "uniform"):
            raise ConfigError(
                f"{self.section}.weighting must be 'samples' or 'uniform', got {self.weighting!r}"
            )


class SharedPartClient(ClientLogic):
    """Keeps a whole model; takes the shared part from each request and returns only that part."""

    shared_prefix: ClassVar[str] = EXTRACTOR_PREFIX

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.model = new_model(ctx.config, ctx.info)
        check_split(self.model.state_dict(), self.shared_prefix, ctx.config.model)
        private_start(self.model, ctx, self.shared_prefix)
        self.specs = state_specs(self.shared_state())
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    def shared_state(self) -> dict[str, torch.Tensor]:
        """The entries of the model under the shared prefix: what leaves the client."""
        return part_of(self.model.state_dict(), self.shared_prefix)

    @handles("train")
    def train(self, message: Message) -> Message:
        """`train`: put the received shared part under the private one, train, return it."""
        expect_arrays(message, "parameters", self.specs)  # exactly the shared names, nothing private
        self.model.load_state_dict({**self.model.state_dict(), **message.tensors("parameters")})
        round = int(message.scalar("config", "round"))
        generator = torch_generator(self.ctx.config.seed, "local-training", self.ctx.client_id, round)
        metrics = train_local(self.model, self.ctx.train, self.ctx.info, self.training, generator)
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            metrics |= local_report(self.ctx, self.model)
        return Message.build(
            "train", arrays={"parameters": self.shared_state()}, scalars={"metrics": metrics}
        )

    def state_dict(self) -> dict:
        """The whole model: the private part must survive a restart, the shared part is overwritten."""
        return {"model": clone_state(self.model)}

    def load_state_dict(self, state: dict) -> None:
        """Restore the whole model, private part included."""
        self.model.load_state_dict(state["model"])


class SharedPartServer(ServerLogic):
    """Holds only the shared part (a submodule of a fresh model) and averages what clients return."""

    shared_prefix: ClassVar[str] = EXTRACTOR_PREFIX

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options: SharedPartOptions = ctx.options
        model = new_model(ctx.config, ctx.info)  # same seed as the clients: the same starting part
        check_split(model.state_dict(), self.shared_prefix, ctx.config.model)
        self.part: nn.Module = getattr(model, self.shared_prefix.rstrip("."))
        self.specs = state_specs(self.shared_state())
        self.last_local: dict[str, float] = {}

    def shared_state(self) -> dict[str, torch.Tensor]:
        """The shared part the server holds, under its prefix, as a message sends it."""
        return prefixed(self.part.state_dict(), self.shared_prefix)

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        """Send the shared part, gather the trained ones, average them."""
        config = self.ctx.config
        evaluate_local = evaluates_local(config, round)
        request = Message.build(
            "train",
            arrays={"parameters": self.shared_state()},
            scalars={"config": {"round": round, "evaluate_local": evaluate_local}},
        )
        expect = ReplySpec({"parameters": self.specs}, (*TRAIN_METRICS, TRAIN_LOSS))
        replies = ask_sampled(
            fleet, request, config, round, f"trained {self.shared_prefix}* parameters", expect
        )
        counts = [float(r.scalar("metrics", "num_samples")) for r in replies]
        weights = counts if self.options.weighting == "samples" else [1.0] * len(replies)
        average = average_states([r.tensors("parameters") for r in replies], weights)
        self.part.load_state_dict(unprefixed(average, self.shared_prefix))
        losses = [float(r.scalar("metrics", "train_loss")) for r in replies]
        metrics = {"train_loss": float(np.average(losses, weights=counts)), "clients": len(replies)}
        if evaluate_local:
            self.last_local = summarise_local(replies)
            metrics |= self.last_local
        return metrics

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The personalised models' metrics of the last evaluated round (no global model exists)."""
        return dict(self.last_local)

    def models(self) -> dict[str, nn.Module]:
        """The shared part, saved as `global_<prefix>` (there is no global model)."""
        return {"global_" + self.shared_prefix.rstrip("."): self.part}

    def state_dict(self) -> dict:
        """The shared part and the last local metrics, for the checkpoint."""
        return {"part": clone_state(self.part), "last_local": dict(self.last_local)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict()` returned."""
        self.part.load_state_dict(state["part"])
        self.last_local = dict(state.get("last_local", {}))


register(
    Algorithm(
        "fedper",
        "FedPer: average the extractors, keep each classifier private (local accuracy; no global model)",
        SharedPartClient,
        SharedPartServer,
        SharedPartOptions,
        oracle=average_local_models,
    )
)
