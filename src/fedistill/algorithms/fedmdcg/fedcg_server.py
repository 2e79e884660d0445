"""FedCG's server: it sends γ(t), averages the received classifiers and generators, and with
``aggregation = "distill"`` distils the averaged pair towards the clients' ensemble (the round is in
fedcg.py)."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedistill.algorithms.base import ServerContext, ServerLogic, clone_state
from fedistill.algorithms.fedmdcg.fedcg_options import GAMMA_SCHEDULES, FedCGOptions, generator_options
from fedistill.algorithms.fedmdcg.fedgen_options import build_generator
from fedistill.algorithms.fedmdcg.label_statistics import sample_labels
from fedistill.algorithms.fedmdcg.local_model_losses import ramp_factor
from fedistill.algorithms.fedmdcg.personalized import (
    GENERATOR_PREFIX,
    ask_sampled,
    decoupled_model,
    evaluates_local,
    load_pair,
    pair_state,
    summarise_local,
    unprefixed,
)
from fedistill.algorithms.shared.training import average_states, check_finite
from fedistill.federation.fleet import Fleet
from fedistill.federation.messages import ArraySpec, Message, state_specs
from fedistill.federation.reply_spec import TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.models.base import CLASSIFIER_PREFIX, unknown_choice
from fedistill.models.feature_generator import FeatureGenerator
from fedistill.seeding import torch_generator


def gamma_at(options: FedCGOptions, round_index: int, rounds: int) -> float:
    """γ(t) for round index t of R (0 in the first round under the two ramps)."""
    if options.gamma_schedule == "cubic":
        return options.gamma * ramp_factor(round_index, rounds, "cubic")
    if options.gamma_schedule == "sigmoid":
        p = min(round_index / 50.0, 1.0)
        return options.gamma * (2.0 / (1.0 + math.exp(-10.0 * p)) - 1.0)
    if options.gamma_schedule != "constant":
        raise unknown_choice("FedCG gamma schedule", options.gamma_schedule, GAMMA_SCHEDULES)
    return options.gamma


def distill_pair(
    generator: FeatureGenerator,
    classifier: nn.Module,
    optimizer: torch.optim.Optimizer,
    generator_template: nn.Module,
    head_template: nn.Module,
    teachers: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]],
    shares: list[float],
    counts: torch.Tensor,
    rng: torch.Generator,
    *,
    steps: int,
    batch_size: int,
    temperature: float,
) -> float:
    """KD of the global pair: C(G(y)) mimics softmax(Σ_k π_k·C_k(G_k(y))/T); returns the mean KL.

    The KL is averaged over samples and classes and not scaled by T² (the code's KLDivLoss "mean").
    """
    generator.train()
    classifier.train()
    total = 0.0
    for step in range(steps):
        labels = sample_labels(counts, batch_size, generator=rng)
        student = classifier(generator(labels, generator=rng))
        with torch.no_grad():
            teacher = torch.zeros_like(student)
            for (g_state, c_state), share in zip(teachers, shares, strict=True):
                features = functional_call(generator_template, g_state, (labels,), {"generator": rng})
                teacher = teacher + share * functional_call(head_template, c_state, (features,))
            target = F.softmax(teacher / temperature, dim=1)
        log_q = F.log_softmax(student / temperature, dim=1)
        loss = F.kl_div(log_q, target, reduction="sum") / target.numel()
        check_finite(loss, "FedCG's server distillation", step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / steps


class FedCGServer(ServerLogic):
    """Holds the global classifier and generator; averages (and optionally distils) what clients send."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options: FedCGOptions = ctx.options
        model = decoupled_model(ctx.config, ctx.info, "FedCG")  # same seed as the clients: the same start
        self.classifier: nn.Module = model.classifier
        self.generator = build_generator(
            ctx.config, ctx.info, model, **generator_options(self.options, ctx.info)
        )
        self.specs = state_specs(self.shared_state())
        self.optimizer: torch.optim.Optimizer | None = None
        if self.options.aggregation == "distill":
            self.optimizer = torch.optim.Adam(
                [*self.generator.parameters(), *self.classifier.parameters()],
                lr=self.options.distill_lr,
                betas=(0.9, 0.999),
                weight_decay=1e-4,
            )
            self.generator_template = copy.deepcopy(self.generator).eval()
            self.head_template = copy.deepcopy(self.classifier).eval()
        self.last_local: dict[str, float] = {}

    def shared_state(self) -> dict[str, torch.Tensor]:
        """What the server shares and averages: the classifier's and the generator's parameters."""
        return pair_state(self.classifier, self.generator)

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        config, options = self.ctx.config, self.options
        evaluate_local = evaluates_local(config, round)
        distill = options.aggregation == "distill"
        request = Message.build(
            "train",
            arrays={"parameters": self.shared_state()},
            scalars={
                "config": {
                    "round": round,
                    "gamma": gamma_at(options, round - 1, config.rounds),
                    "evaluate_local": evaluate_local,
                    "send_label_counts": distill,
                }
            },
        )
        counts = {"class_counts": ArraySpec("int64", (self.ctx.info.num_classes,))}
        expect = ReplySpec(
            {"parameters": self.specs, **({"label-statistics": counts} if distill else {})},
            (*TRAIN_METRICS, TRAIN_LOSS, "discriminator_loss", "generator_loss"),
            non_negative=frozenset({"label-statistics"}),  # the distillation draws labels from them
        )
        replies = ask_sampled(fleet, request, config, round, "trained classifiers and generators", expect)
        states = [reply.tensors("parameters") for reply in replies]
        sizes = [float(r.scalar("metrics", "num_samples")) for r in replies]
        weights = sizes if options.weighting == "samples" else [1.0] * len(replies)
        load_pair(average_states(states, weights), self.classifier, self.generator)

        losses = [float(r.scalar("metrics", "train_loss")) for r in replies]
        metrics: dict[str, float] = {
            "train_loss": float(np.average(losses, weights=sizes)),
            "clients": len(replies),
        }
        for key in ("discriminator_loss", "generator_loss"):
            metrics[key] = float(
                np.average([float(r.scalar("metrics", key)) for r in replies], weights=sizes)
            )
        if distill:
            metrics["distill_loss"] = self._distill(replies, states, weights, round)
        if evaluate_local:
            self.last_local = summarise_local(replies)
            metrics |= self.last_local
        return metrics

    def _distill(
        self, replies: list[Message], states: list[dict[str, torch.Tensor]], weights: list[float], round: int
    ) -> float:
        counts = torch.stack([r.tensor("label-statistics", "class_counts") for r in replies]).to(
            torch.float64
        )
        teachers = [(unprefixed(s, GENERATOR_PREFIX), unprefixed(s, CLASSIFIER_PREFIX)) for s in states]
        total = sum(weights)
        assert self.optimizer is not None
        return distill_pair(
            self.generator,
            self.classifier,
            self.optimizer,
            self.generator_template,
            self.head_template,
            teachers,
            [w / total for w in weights],
            counts,
            torch_generator(self.ctx.config.seed, "fedcg-distill", round),
            steps=self.options.distill_steps,
            batch_size=self.options.distill_batch_size,
            temperature=self.options.distill_temperature,
        )

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The personalised models' metrics of the last evaluated round (no global model exists)."""
        return dict(self.last_local)

    def models(self) -> dict[str, nn.Module]:
        return {"global_classifier": self.classifier, "generator": self.generator}

    def state_dict(self) -> dict:
        state = {
            "classifier": clone_state(self.classifier),
            "generator": clone_state(self.generator),
            "last_local": dict(self.last_local),
        }
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.classifier.load_state_dict(state["classifier"])
        self.generator.load_state_dict(state["generator"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.last_local = dict(state.get("last_local", {}))
