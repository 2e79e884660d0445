"""Standalone (local training) and Centralized: the lower and upper bounds of every table.

Standalone: each client trains its own model on its own data and nothing but metrics ever leaves
it; the reported accuracy is the mean (and std) of the clients' models on the test set, as in
FedIOD's table. The FedMD-CG paper's "global accuracy" of Local Training averages the local models
instead: the in-process runner reports it as ``global_accuracy_oracle`` (algorithms/oracle.py),
outside the protocol. Centralized is the same logic with a single client holding all training data:
not federated at all, the upper bound.
"""

from __future__ import annotations

import numpy as np

from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerLogic,
    clone_state,
    register,
)
from fedistill.algorithms.oracle import average_local_models
from fedistill.algorithms.training import LocalTraining, evaluate_model, new_model, train_local
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message
from fedistill.federation.reply_spec import LOCAL_METRICS, TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.seeding import torch_generator


class StandaloneClient(ClientLogic):
    """Keeps its model and optimiser across rounds; answers with metrics only."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.model = new_model(ctx.config, ctx.info)
        self.training = LocalTraining.from_config(ctx.config, ctx.info)
        self.optimizer = self.training.make_optimizer(self.model.parameters())

    @handles("train")
    def train(self, message: Message) -> Message:
        round = int(message.scalar("config", "round"))
        generator = torch_generator(self.ctx.config.seed, "local-training", self.ctx.client_id, round)
        metrics = train_local(
            self.model, self.ctx.train, self.ctx.info, self.training, generator, optimizer=self.optimizer
        )
        metrics["num_samples"] = len(self.ctx.train)
        return Message.build("train", scalars={"metrics": metrics})

    @handles("evaluate", read_only=True)
    def evaluate(self, message: Message) -> Message:
        test = evaluate_model(self.model, self.ctx.global_test, self.ctx.info)
        local = evaluate_model(self.model, self.ctx.test, self.ctx.info)
        metrics = {
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "local_accuracy": local["accuracy"],
            "local_count": local["count"],
        }
        return Message.build("evaluate", scalars={"metrics": metrics})

    def state_dict(self) -> dict:
        return {"model": clone_state(self.model), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class StandaloneServer(ServerLogic):
    """Tells every client to train, then gathers their test metrics: no model crosses the boundary."""

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        request = Message.build("train", scalars={"config": {"round": round}})
        expect = ReplySpec(metrics=(*TRAIN_METRICS, TRAIN_LOSS))
        replies = successful(
            fleet.broadcast(request, timeout=self.ctx.config.timeout or None, expect=expect),
            minimum=min(self.ctx.config.min_clients, len(fleet.clients)),
        )
        counts = [float(r.scalar("metrics", "num_samples")) for r in replies.values()]
        losses = [float(r.scalar("metrics", "train_loss")) for r in replies.values()]
        return {"train_loss": float(np.average(losses, weights=counts)), "clients": len(replies)}

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        request = Message.build("evaluate", scalars={"config": {"round": round}})
        expect = ReplySpec(metrics=("test_accuracy", "test_loss", *LOCAL_METRICS))
        replies = successful(
            fleet.broadcast(request, timeout=self.ctx.config.timeout or None, expect=expect), what="metrics"
        )
        acc = np.array([float(r.scalar("metrics", "test_accuracy")) for r in replies.values()])
        loss = np.array([float(r.scalar("metrics", "test_loss")) for r in replies.values()])
        local = np.array([float(r.scalar("metrics", "local_accuracy")) for r in replies.values()])
        local_counts = np.array([float(r.scalar("metrics", "local_count")) for r in replies.values()])
        metrics = {"test_accuracy": float(acc.mean()), "test_loss": float(loss.mean())}
        if len(acc) > 1:
            metrics |= {
                "test_accuracy_std": float(acc.std()),
                "test_accuracy_min": float(acc.min()),
                "test_accuracy_max": float(acc.max()),
            }
        if local_counts.sum() > 0:
            metrics["local_accuracy"] = float(np.average(local, weights=local_counts))
        return metrics


register(
    Algorithm(
        "standalone",
        "Standalone: each client trains alone (mean and std of the local models)",
        StandaloneClient,
        StandaloneServer,
        oracle=average_local_models,
    )
)
register(
    Algorithm(
        "centralized",
        "Centralized: all training data pooled in one place (not federated; the upper bound)",
        StandaloneClient,
        StandaloneServer,
        pooled=True,
    )
)
