"""FedAvg (McMahan et al. 2017) and the two variants the papers compare against:
FedProx (Li et al. 2020: a proximal term on the client) and FedAvgM (Hsu et al. 2019: server momentum).

Round: the server sends the global parameters to a sample of clients; each trains locally and sends
its parameters back; the server averages them (by sample count or uniformly) and, for FedAvgM,
applies the average as a pseudo-gradient with momentum.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    register,
)
from fedistill.algorithms.drop_worst import accuracy, drop_worst_weights, predict_logits
from fedistill.algorithms.training import (
    LocalTraining,
    average_states,
    evaluate_model,
    new_model,
    train_local,
)
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message, expect_arrays, state_specs
from fedistill.seeding import numpy_generator, torch_generator


@dataclass(frozen=True)
class FedAvgOptions:
    weighting: str = "samples"  # samples | uniform (FedDF's code averages uniformly)
    mu: float = 0.0  # FedProx proximal weight; 0 is plain FedAvg
    server_momentum: float = 0.0  # FedAvgM's beta; 0 is plain FedAvg
    server_lr: float = 1.0
    drop_worst: bool = False  # FedDF's filter: leave out models at chance on the server's validation split

    def validate(self) -> None:
        if self.weighting not in ("samples", "uniform"):
            raise ConfigError(f"weighting must be 'samples' or 'uniform', got {self.weighting!r}")
        if self.mu < 0:
            raise ConfigError(f"mu must be >= 0, got {self.mu}")
        if not 0 <= self.server_momentum < 1:
            raise ConfigError(f"server_momentum must be in [0, 1), got {self.server_momentum}")
        if self.server_lr <= 0:
            raise ConfigError(f"server_lr must be > 0, got {self.server_lr}")


@dataclass(frozen=True)
class FedProxOptions(FedAvgOptions):
    mu: float = 0.01


@dataclass(frozen=True)
class FedAvgMOptions(FedAvgOptions):
    server_momentum: float = 0.9


def sample_clients(clients: list[int], fraction: float, seed: int, round: int) -> list[int]:
    """max(1, round(fraction * K)) clients without replacement, drawn from (seed, round) alone."""
    count = max(1, round_half_up(fraction * len(clients)))
    if count >= len(clients):
        return list(clients)
    chosen = numpy_generator(seed, "client-sampling", round).choice(len(clients), size=count, replace=False)
    return sorted(clients[i] for i in chosen)


def round_half_up(value: float) -> int:
    return int(np.floor(value + 0.5))


class FedAvgClient(ClientLogic):
    """Trains the received global model on private data and returns the trained parameters."""

    def __init__(self, ctx: ClientContext, model_name: str | None = None) -> None:
        self.ctx = ctx
        self.model = new_model(ctx.config, ctx.info, model_name)
        self.specs = state_specs(self.model.state_dict())
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    @handles("train")
    def train(self, message: Message) -> Message:
        expect_arrays(message, "parameters", self.specs)
        self.model.load_state_dict(message.tensors("parameters"))
        round = int(message.scalar("config", "round"))
        generator = torch_generator(self.ctx.config.seed, "local-training", self.ctx.client_id, round)
        metrics = train_local(
            self.model,
            self.ctx.train,
            self.ctx.info,
            self.training,
            generator,
            prox_mu=float(message.scalar("config", "prox_mu", 0.0)),
        )
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            local = evaluate_model(self.model, self.ctx.test, self.ctx.info)
            metrics |= {"local_accuracy": local["accuracy"], "local_count": local["count"]}
        return Message.build(
            "train", arrays={"parameters": self.model.state_dict()}, scalars={"metrics": metrics}
        )


class FedAvgServer(ServerLogic):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options: FedAvgOptions = ctx.options
        self.model = new_model(ctx.config, ctx.info)
        self.specs = state_specs(self.model.state_dict())
        self.momentum: dict[str, torch.Tensor] = {}
        self.last_local: dict[str, float] = {}
        if self.options.drop_worst and (ctx.validation is None or len(ctx.validation) == 0):
            raise ConfigError("drop_worst needs the server's validation split: set val_fraction > 0")

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        config = self.ctx.config
        chosen = sample_clients(fleet.clients, config.fraction, config.seed, round)
        evaluate_local = round % config.eval_every == 0 or round == config.rounds
        request = Message.build(
            "train",
            arrays={"parameters": self.model.state_dict()},
            scalars={
                "config": {"round": round, "prox_mu": self.options.mu, "evaluate_local": evaluate_local}
            },
        )
        replies = successful(
            fleet.broadcast(request, chosen, timeout=config.timeout or None),
            minimum=min(config.min_clients, len(chosen)),
            what="trained parameters",
        )
        for reply in replies.values():
            expect_arrays(reply, "parameters", self.specs)
        states = [reply.tensors("parameters") for reply in replies.values()]
        counts = [float(reply.scalar("metrics", "num_samples")) for reply in replies.values()]
        kept = self._drop_worst(states) if self.options.drop_worst else list(range(len(states)))
        weights = [counts[i] if self.options.weighting == "samples" else 1.0 for i in kept]
        self._apply(average_states([states[i] for i in kept], weights))
        metrics = {
            "train_loss": float(
                np.average([r.scalar("metrics", "train_loss") for r in replies.values()], weights=counts)
            ),
            "clients": len(replies),
        }
        if self.options.drop_worst:
            metrics["dropped"] = len(states) - len(kept)
        if evaluate_local:
            local_counts = [float(r.scalar("metrics", "local_count")) for r in replies.values()]
            local = [float(r.scalar("metrics", "local_accuracy")) for r in replies.values()]
            metrics["local_accuracy"] = float(np.average(local, weights=local_counts))
            self.last_local = {"local_accuracy": metrics["local_accuracy"]}
        return metrics

    def _drop_worst(self, states: list[dict[str, torch.Tensor]]) -> list[int]:
        """Indices of the received models that FedDF's drop-worst rule keeps (see drop_worst.py)."""
        validation = self.ctx.validation
        assert validation is not None
        scratch = copy.deepcopy(self.model)
        accuracies = []
        for state in states:
            scratch.load_state_dict(state)
            accuracies.append(accuracy(predict_logits(scratch, validation, self.ctx.info), validation.y))
        weights = drop_worst_weights(accuracies, self.ctx.info.num_classes)
        return [i for i, w in enumerate(weights) if w > 0]

    def _apply(self, average: dict[str, torch.Tensor]) -> None:
        """Plain replacement, or FedAvgM: v = beta * v + (avg - w); w = w + server_lr * v."""
        beta, lr = self.options.server_momentum, self.options.server_lr
        if beta == 0 and lr == 1.0:
            self.model.load_state_dict(average)
            return
        current = self.model.state_dict()
        new = {}
        for name, value in average.items():
            if not value.is_floating_point() or name not in dict(self.model.named_parameters()):
                new[name] = value  # buffers (BatchNorm statistics) are simply averaged
                continue
            delta = value - current[name]
            velocity = beta * self.momentum[name] + delta if name in self.momentum else delta
            self.momentum[name] = velocity
            new[name] = current[name] + lr * velocity
        self.model.load_state_dict(new)

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        result = self.ctx.evaluate(self.model)
        return {"test_accuracy": result["accuracy"], "test_loss": result["loss"], **self.last_local}

    def models(self) -> dict[str, torch.nn.Module]:
        return {"global": self.model}

    def state_dict(self) -> dict:
        return {
            "model": clone_state(self.model),
            "momentum": dict(self.momentum),
            "last_local": self.last_local,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.momentum = dict(state.get("momentum", {}))
        self.last_local = dict(state.get("last_local", {}))


register(
    Algorithm("fedavg", "FedAvg: average locally trained models", FedAvgClient, FedAvgServer, FedAvgOptions)
)
register(
    Algorithm(
        "fedprox", "FedProx: FedAvg with a proximal term (mu)", FedAvgClient, FedAvgServer, FedProxOptions
    )
)
register(
    Algorithm("fedavgm", "FedAvgM: FedAvg with server momentum", FedAvgClient, FedAvgServer, FedAvgMOptions)
)
