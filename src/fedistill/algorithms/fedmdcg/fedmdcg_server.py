"""FedMD-CG's server: it holds no data, averages the received pairs (C_i, G_i) and distils the average
by the crossed data-free distillation (the round is in fedmdcg.py)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedistill.algorithms.base import ServerContext, ServerLogic, clone_state
from fedistill.algorithms.fedmdcg import losses as L
from fedistill.algorithms.fedmdcg.fedmdcg_options import finite_loss, frozen, new_generator, resolve_options
from fedistill.algorithms.fedmdcg.personalized import (
    ask_sampled,
    decoupled_model,
    evaluates_local,
    load_pair,
    pair_state,
    summarise_local,
)
from fedistill.federation.fleet import Fleet
from fedistill.federation.messages import ArraySpec, Message, state_specs
from fedistill.federation.reply_spec import TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.models.feature_generator import FeatureGenerator
from fedistill.seeding import torch_generator


def crossed_distillation_steps(
    generator: FeatureGenerator,
    classifier: nn.Module,
    local_generators: Sequence[FeatureGenerator],
    local_classifiers: Sequence[nn.Module],
    counts: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    steps: int,
    batch_size: int,
    temperature: float = L.SERVER_TEMPERATURE,
    softmax_bug: bool = False,
    rng: torch.Generator | None = None,
) -> dict[str, float]:
    """The server's data-free step, ``steps`` times: (G_g, C_g) learn from the frozen local pairs.

    Labels y are drawn ∝ the summed (K, C) label counts; each client i teaches with weight w_{i,y}
    (its share of class y). Each generator draws its own ε once per step, and its output feeds every
    term it appears in, as in the released code: G_i(y) is read by C_i (the teacher) and by C_g (L2),
    G_g(y) by C_g (L1) and by every C_i (L3).
    """
    for module in (*local_generators, *local_classifiers):
        frozen(module)
    weights = L.label_weights(counts)
    generator.train()
    classifier.train()
    first = last = None
    for _ in range(steps):
        y = L.sample_labels(counts, batch_size, rng)
        with torch.no_grad():
            local_features = [g(y, generator=rng) for g in local_generators]
            teachers = torch.stack([c(f) for f, c in zip(local_features, local_classifiers, strict=True)])
        global_features = generator(y, generator=rng)
        global_pair = classifier(global_features)
        head_on_local = torch.stack([classifier(f) for f in local_features])
        local_on_global = torch.stack([c(global_features) for c in local_classifiers])
        terms = L.crossed_distillation(
            global_pair,
            head_on_local,
            local_on_global,
            teachers,
            L.per_sample_label_weights(weights, y),
            temperature,
            official_softmax_bug=softmax_bug,
        )
        loss = terms.total
        finite_loss(loss, "server distillation")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        last = {
            "server_l1": float(terms.l1.detach()),
            "server_l2": float(terms.l2.detach()),
            "server_l3": float(terms.l3.detach()),
            "server_loss": float(loss.detach()),
        }
        first = first or last
    assert first is not None and last is not None
    return last | {"server_loss_first": first["server_loss"]}


@torch.no_grad()
def parameter_norm(module: nn.Module) -> float:
    """The L2 norm of all of a module's parameters: shows the server's weight decay shrinking C_g."""
    return float(torch.linalg.vector_norm(torch.cat([p.flatten() for p in module.parameters()])))


@torch.no_grad()
def pair_accuracy(
    generator: FeatureGenerator, classifier: nn.Module, counts: torch.Tensor, size: int, rng: torch.Generator
) -> float:
    """How often C(G(y)) = y for labels drawn ∝ ``counts``: a data-free check that the pair agrees.

    Both modules are read in eval mode (BatchNorm's running statistics, no dropout) and then put back in
    the mode they were in.
    """
    modes = [(module, module.training) for module in (generator, classifier)]
    generator.eval()
    classifier.eval()
    y = L.sample_labels(counts, size, rng)
    hits = (classifier(generator(y, generator=rng)).argmax(1) == y).float().mean()
    for module, was_training in modes:
        module.train(was_training)
    return float(hits)


class FedMDCGServer(ServerLogic):
    """Holds only (C_g, G_g), their Adam state and the last global label distribution; no data."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options = resolve_options(ctx.config, ctx.options)
        model = decoupled_model(ctx.config, ctx.info, "FedMD-CG")
        self.classifier: nn.Module = model.classifier  # C_g; the extractor is dropped, never used
        self.generator = new_generator(ctx.config, ctx.info, self.options, model)  # G_g
        self.optimizer = torch.optim.Adam(
            [*self.generator.parameters(), *self.classifier.parameters()],
            lr=self.options.server_lr,
            weight_decay=self.options.server_weight_decay,
        )
        self.specs = state_specs(pair_state(self.classifier, self.generator))
        self.distribution: torch.Tensor | None = None  # set by the first aggregation
        self.last_local: dict[str, float] = {}

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        config, options, info = self.ctx.config, self.options, self.ctx.info
        evaluate_local = evaluates_local(config, round)
        arrays: dict[str, dict[str, torch.Tensor]] = {}
        if self.distribution is not None:
            arrays = {
                "parameters": pair_state(self.classifier, self.generator),
                "label-statistics": {"label_distribution": self.distribution},
            }
        request = Message.build(
            "train", arrays=arrays, scalars={"config": {"round": round, "evaluate_local": evaluate_local}}
        )
        count_spec = {"class_counts": ArraySpec("int64", (info.num_classes,))}
        expect = ReplySpec(
            {"parameters": self.specs, "label-statistics": count_spec},
            (*TRAIN_METRICS, TRAIN_LOSS, "generator_loss", "generator_accuracy", "ramp"),
            non_negative=frozenset({"label-statistics"}),  # they weigh the clients and draw the labels
        )
        replies = ask_sampled(
            fleet, request, config, round, "classifiers, generators and label counts", expect
        )
        sizes = [float(r.scalar("metrics", "num_samples")) for r in replies]
        states = [r.tensors("parameters") for r in replies]
        counts = torch.stack([r.tensor("label-statistics", "class_counts") for r in replies])
        load_pair(L.weighted_average(states, sizes), self.classifier, self.generator)
        self.distribution = L.label_distribution(counts)
        metrics: dict[str, float] = {
            "train_loss": float(
                np.average([r.scalar("metrics", "train_loss") for r in replies], weights=sizes)
            ),
            "generator_loss": float(np.mean([r.scalar("metrics", "generator_loss") for r in replies])),
            "generator_accuracy": float(
                np.mean([r.scalar("metrics", "generator_accuracy") for r in replies])
            ),
            "clients": len(replies),
            "ramp": float(replies[0].scalar("metrics", "ramp")),  # the same λ-ramp factor at every client
        }
        metrics["classifier_norm_averaged"] = parameter_norm(self.classifier)
        if options.server_distillation:
            heads, generators = [], []
            for state in states:
                heads.append(copy.deepcopy(self.classifier))
                generators.append(copy.deepcopy(self.generator))
                load_pair(state, heads[-1], generators[-1])
            metrics |= crossed_distillation_steps(
                self.generator,
                self.classifier,
                generators,
                heads,
                counts,
                self.optimizer,
                steps=options.server_steps,
                batch_size=options.server_batch_size,
                temperature=options.server_temperature,
                softmax_bug=options.softmax_bug,
                rng=torch_generator(config.seed, "fedmdcg-server", round),
            )
        metrics["classifier_norm"] = parameter_norm(self.classifier)  # what the clients start from
        rng = torch_generator(config.seed, "fedmdcg-server-probe", round)
        metrics["global_pair_accuracy"] = pair_accuracy(self.generator, self.classifier, counts, 512, rng)
        if evaluate_local:
            self.last_local = summarise_local(replies)
            metrics |= self.last_local
        return metrics

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The local models' metrics of the last evaluated round: the server has no data and no extractor."""
        return dict(self.last_local)

    def models(self) -> dict[str, nn.Module]:
        return {"global_classifier": self.classifier, "global_generator": self.generator}

    def state_dict(self) -> dict:
        return {
            "classifier": clone_state(self.classifier),
            "generator": clone_state(self.generator),
            "optimizer": self.optimizer.state_dict(),
            "distribution": self.distribution,
            "last_local": dict(self.last_local),
        }

    def load_state_dict(self, state: dict) -> None:
        self.classifier.load_state_dict(state["classifier"])
        self.generator.load_state_dict(state["generator"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.distribution = state.get("distribution")
        self.last_local = dict(state.get("last_local", {}))
