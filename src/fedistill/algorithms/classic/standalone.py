"""Standalone (local training) and Centralized: the lower and upper bounds of every table.

Standalone: each client trains its own model on its own data and nothing but metrics ever leaves
it; the reported accuracy is the mean (and std) of the clients' models on the test set, as in
FedIOD's table. The FedMD-CG paper's "global accuracy" of Local Training averages the local models
instead: the in-process runner reports it as ``global_accuracy_oracle`` (algorithms/shared/oracle.py),
outside the protocol. Centralized is the same logic with a single client holding all training data:
not federated at all, the upper bound. Its one model is worth keeping (`fedistill predict`, `export`), so
at the end its server asks for it (`query.model`, one message in the ledger); a Standalone site never
sends its model.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from fedistill.algorithms.base import (
    ALL_TASKS,
    TEXT_TASKS,
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    register,
)
from fedistill.algorithms.shared.decision_threshold import ThresholdCounts
from fedistill.algorithms.shared.norm_statistics import NormStatistics
from fedistill.algorithms.shared.oracle import average_local_models
from fedistill.algorithms.shared.training import (
    LocalTraining,
    evaluate_model,
    local_metric_names,
    local_metrics,
    new_model,
    task_of,
    test_metrics,
    train_local,
)
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message, state_specs
from fedistill.federation.reply_spec import TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.seeding import torch_generator


class StandaloneClient(ClientLogic, ThresholdCounts):
    """Keeps its model and optimiser across rounds; answers with metrics only."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.model = new_model(ctx.config, ctx.info)
        self.training = LocalTraining.from_config(ctx.config, ctx.info)
        self.optimizer = self.training.make_optimizer(self.model.parameters())

    @handles("train")
    def train(self, message: Message) -> Message:
        """`train`: one round of local training on the client's own data; only metrics go back."""
        round = int(message.scalar("config", "round"))
        generator = torch_generator(self.ctx.config.seed, "local-training", self.ctx.client_id, round)
        metrics = train_local(
            self.model, self.ctx.train, self.ctx.info, self.training, generator, optimizer=self.optimizer
        )
        metrics["num_samples"] = len(self.ctx.train)
        return Message.build("train", scalars={"metrics": metrics})

    @handles("evaluate", read_only=True)
    def evaluate(self, message: Message) -> Message:
        """`evaluate`: the client's model on the shared test set and on its own test share."""
        task = self.training.task
        ctx = self.ctx
        test = evaluate_model(
            self.model,
            ctx.global_test,
            ctx.info,
            task=task,
            meta=ctx.global_test_meta,
            groups=ctx.global_test_sources,
        )
        local = evaluate_model(self.model, self.ctx.test, self.ctx.info, task=task)
        metrics = test_metrics(test) | local_metrics(task, local)
        return Message.build("evaluate", scalars={"metrics": metrics})

    def state_dict(self) -> dict:
        """The client's model and optimiser, for its checkpoint (never sent)."""
        return {"model": clone_state(self.model), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the model and optimiser `state_dict()` returned."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class StandaloneServer(ServerLogic):
    """Tells every client to train, then gathers their test metrics: no model crosses the boundary."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.task = task_of(ctx.config, ctx.info)

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        """Tell every client to train a round; gather their training metrics."""
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
        """Every client's test metrics: the mean and spread of the local models."""
        request = Message.build("evaluate", scalars={"config": {"round": round}})
        headline = f"test_{self.task.headline}"
        local_name, local_count = local_metric_names(self.task)
        expect = ReplySpec(metrics=(headline, "test_loss", local_name, local_count))
        replies = list(
            successful(
                fleet.broadcast(request, timeout=self.ctx.config.timeout or None, expect=expect),
                what="metrics",
            ).values()
        )
        # every test metric all clients report: the mean over the clients' models
        shared = set.intersection(*(set(r.scalars["metrics"]) for r in replies))
        names = [n for n in replies[0].scalars["metrics"] if n.startswith("test_") and n in shared]
        metrics = {n: float(np.mean([float(r.scalar("metrics", n)) for r in replies])) for n in names}
        values = np.array([float(r.scalar("metrics", headline)) for r in replies])
        if len(values) > 1:  # the spread over the sites (Standalone's "mean ± std" of the papers' tables)
            metrics |= {
                f"{headline}_std": float(values.std()),
                f"{headline}_min": float(values.min()),
                f"{headline}_max": float(values.max()),
            }
        local = np.array([float(r.scalar("metrics", local_name)) for r in replies])
        local_counts = np.array([float(r.scalar("metrics", local_count)) for r in replies])
        if local_counts.sum() > 0:
            metrics[local_name] = float(np.average(local, weights=local_counts))
        return metrics


#: Centralized's request for the model its pooled "site" trained, once, after the last round.
MODEL_QUERY = "query.model"


class CentralizedClient(StandaloneClient, NormStatistics):
    """Standalone's client on the pooled data, which also hands its trained model over when asked."""

    @handles(MODEL_QUERY, read_only=True)
    def send_model(self, message: Message) -> Message:
        """`query.model`: the trained parameters (and running statistics)."""
        return Message.build(MODEL_QUERY, arrays={"parameters": self.model.state_dict()})


class CentralizedServer(StandaloneServer):
    """Standalone's server, which collects the pooled model at the end so the run exports it as `global`."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.model = new_model(ctx.config, ctx.info)

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        """Ask the pooled client for its trained model; the reported metrics stay its last evaluation."""
        expect = ReplySpec(arrays={"parameters": state_specs(self.model.state_dict())})
        replies = successful(
            fleet.broadcast(
                Message.build(MODEL_QUERY), timeout=self.ctx.config.timeout or None, expect=expect
            ),
            what="the trained model",
        )
        self.model.load_state_dict(next(iter(replies.values())).tensors("parameters"))
        return last

    def models(self) -> dict[str, nn.Module]:
        return {"global": self.model}


register(
    Algorithm(
        "standalone",
        "Standalone: each client trains alone (mean and std of the local models)",
        StandaloneClient,
        StandaloneServer,
        oracle=average_local_models,
        tasks=(*ALL_TASKS, *TEXT_TASKS),
        unused_keys={"fraction": "every client trains every round; none is sampled out"},
    )
)
register(
    Algorithm(
        "centralized",
        "Centralized: all training data pooled in one place (not federated; the upper bound)",
        CentralizedClient,
        CentralizedServer,
        pooled=True,
        tasks=(*ALL_TASKS, *TEXT_TASKS),
        unused_keys={"fraction": "its one pooled model trains every round"},
    )
)
