"""FedGen's server: it learns the feature generator from the received heads and label counts, averages
the shared parameters and sends both (the round is in fedgen.py)."""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedistill.algorithms.base import ServerContext, ServerLogic, clone_state
from fedistill.algorithms.fedmdcg.fedgen_options import (
    LABEL_SAMPLINGS,
    FedGenOptions,
    build_generator,
    generator_options,
    shared_prefix,
)
from fedistill.algorithms.fedmdcg.generator_losses import diversity_div0
from fedistill.algorithms.fedmdcg.label_statistics import label_weights, sample_labels
from fedistill.algorithms.fedmdcg.personalized import (
    GENERATOR_PREFIX,
    ask_sampled,
    decoupled_model,
    evaluates_local,
    part_of,
    prefixed,
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


def regularizer_weight(initial: float, round_index: int, decay: float, floor: float) -> float:
    """FedGen's max(floor, w₀·decay^t) for round index t (0 for the first round)."""
    return max(floor, initial * decay**round_index)


def server_labels(
    counts: torch.Tensor, batch_size: int, sampling: str, generator: torch.Generator
) -> torch.Tensor:
    """Labels for one generator step: ∝ the summed (K, C) counts, or uniform over the labels some
    client holds more than one sample of (FedGen's code; any held label if none qualifies)."""
    if sampling == "counts":
        return sample_labels(counts, batch_size, generator=generator)
    if sampling != "uniform":
        raise unknown_choice("FedGen label sampling", sampling, LABEL_SAMPLINGS)
    qualified = torch.nonzero(counts.max(dim=0).values > 1).flatten()
    if qualified.numel() == 0:
        qualified = torch.nonzero(counts.sum(dim=0) > 0).flatten()
    return qualified[torch.randint(len(qualified), (batch_size,), generator=generator).to(qualified.device)]


def ensemble_teacher(
    head: nn.Module,
    heads: list[dict[str, torch.Tensor]],
    weights: torch.Tensor,
    features: torch.Tensor,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedGen's teacher loss Σ_k mean_b w_{k,y_b}·CE(head_k(h_b), y_b) and ensemble Σ_k w_{k,y}·head_k(h).

    `head` is a template module run with each client's head state; `weights` is (K, C).
    """
    per_sample = weights[:, labels].to(features.dtype)  # (K, B)
    loss = features.new_zeros(())
    ensemble = torch.zeros(())
    for k, state in enumerate(heads):
        logits = functional_call(head, state, (features,))
        loss = loss + (F.cross_entropy(logits, labels, reduction="none") * per_sample[k]).mean()
        ensemble = ensemble + logits * per_sample[k].unsqueeze(1)
    return loss, ensemble


def train_generator(
    generator: FeatureGenerator,
    optimizer: torch.optim.Optimizer,
    head: nn.Module,
    heads: list[dict[str, torch.Tensor]],
    counts: torch.Tensor,
    options: FedGenOptions,
    rng: torch.Generator,
    student: dict[str, torch.Tensor] | None = None,
) -> dict[str, float]:
    """The server's `generator_steps` Adam steps on G; returns the mean of each term.

    Loss = teacher_weight·teacher + diversity_weight·div − adversarial_weight·KL(ensemble ‖ student),
    the last only when `student` (the global head) is given and its weight is > 0.
    """
    weights = label_weights(counts)
    generator.train()
    sums = {"generator_teacher_loss": 0.0, "generator_diversity_loss": 0.0}
    adversarial = options.adversarial_weight > 0 and student is not None
    if adversarial:
        sums["generator_adversarial_loss"] = 0.0
    for step in range(options.generator_steps):
        labels = server_labels(counts, options.generator_batch_size, options.label_sampling, rng)
        features, noise = generator(labels, generator=rng, return_noise=True)
        teacher, ensemble = ensemble_teacher(head, heads, weights, features, labels)
        diversity = diversity_div0(noise, features, options.diversity_metric)
        loss = options.teacher_weight * teacher + options.diversity_weight * diversity
        if adversarial:
            assert student is not None
            student_logits = functional_call(head, student, (features,))
            target = F.softmax(ensemble, dim=1)  # the code keeps this term's gradient through the ensemble
            gap = F.kl_div(F.log_softmax(student_logits, dim=1), target, reduction="sum") / target.numel()
            loss = loss - options.adversarial_weight * gap
            sums["generator_adversarial_loss"] += gap.item()
        check_finite(loss, "FedGen's generator training", step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sums["generator_teacher_loss"] += teacher.item()
        sums["generator_diversity_loss"] += diversity.item()
    return {name: total / options.generator_steps for name, total in sums.items()}


class FedGenServer(ServerLogic):
    """Trains G from the received heads and label counts, averages the shared parameters, sends both."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options: FedGenOptions = ctx.options
        self.model = decoupled_model(ctx.config, ctx.info, "FedGen")
        self.prefix = shared_prefix(self.options)
        self.specs = state_specs(part_of(self.model.state_dict(), self.prefix))
        self.generator = build_generator(ctx.config, ctx.info, self.model, **generator_options(self.options))
        self.optimizer = torch.optim.Adam(
            self.generator.parameters(),
            lr=self.options.generator_lr,
            betas=(0.9, 0.999),
            weight_decay=self.options.generator_weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(
            self.optimizer, gamma=self.options.generator_lr_decay
        )
        self.head = copy.deepcopy(self.model.classifier).eval()  # a template run with each client's head
        for p in self.head.parameters():
            p.requires_grad_(False)
        self.global_counts: torch.Tensor | None = None  # summed class counts of the last round's clients
        self.last_local: dict[str, float] = {}

    def _request(self, round: int, evaluate_local: bool) -> Message:
        options = self.options
        regularize = self.global_counts is not None  # G has been trained on some round's heads
        arrays: dict[str, dict[str, torch.Tensor]] = {
            "parameters": part_of(self.model.state_dict(), self.prefix)
        }
        if regularize:
            arrays["parameters"] |= prefixed(self.generator.state_dict(), GENERATOR_PREFIX)
            if options.label_sampling == "counts":
                assert self.global_counts is not None
                arrays["label-statistics"] = {"global_counts": self.global_counts}
        t = round - 1
        config = {
            "round": round,
            "evaluate_local": evaluate_local,
            "regularize": regularize,
            "generative_alpha": regularizer_weight(
                options.generative_alpha, t, options.decay, options.min_weight
            ),
            "generative_beta": regularizer_weight(
                options.generative_beta, t, options.decay, options.min_weight
            ),
        }
        return Message.build("train", arrays=arrays, scalars={"config": config})

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        config, options = self.ctx.config, self.options
        evaluate_local = evaluates_local(config, round)
        request = self._request(round, evaluate_local)
        count_spec = {"class_counts": ArraySpec("int64", (self.ctx.info.num_classes,))}
        expect = ReplySpec(
            {"parameters": self.specs, "label-statistics": count_spec},
            (*TRAIN_METRICS, TRAIN_LOSS),
            non_negative=frozenset({"label-statistics"}),  # they weigh the heads and draw the labels
        )
        replies = ask_sampled(fleet, request, config, round, "trained parameters and label counts", expect)
        states = [reply.tensors("parameters") for reply in replies]
        counts = torch.stack([r.tensor("label-statistics", "class_counts") for r in replies]).to(
            torch.float64
        )
        sizes = [float(r.scalar("metrics", "num_samples")) for r in replies]

        # G learns from this round's heads; the student (if any) is the global head before averaging.
        heads = [unprefixed(state, CLASSIFIER_PREFIX) for state in states]
        student = None
        if options.adversarial_weight > 0:
            student = unprefixed(clone_state(self.model), CLASSIFIER_PREFIX)
        rng = torch_generator(config.seed, "fedgen-generator", round)
        metrics: dict[str, float] = train_generator(
            self.generator, self.optimizer, self.head, heads, counts, options, rng, student
        )
        self.scheduler.step()

        weights = sizes if options.weighting == "samples" else [1.0] * len(replies)
        self.model.load_state_dict({**self.model.state_dict(), **average_states(states, weights)})
        self.global_counts = counts.sum(dim=0).to(torch.int64)

        losses = [float(r.scalar("metrics", "train_loss")) for r in replies]
        metrics |= {"train_loss": float(np.average(losses, weights=sizes)), "clients": len(replies)}
        if evaluate_local:
            self.last_local = summarise_local(replies)
            metrics |= self.last_local
        return metrics

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The global model's test metrics when whole models are shared; the personal models' always."""
        if self.prefix:
            return dict(self.last_local)
        result = self.ctx.evaluate(self.model)
        return {"test_accuracy": result["accuracy"], "test_loss": result["loss"], **self.last_local}

    def models(self) -> dict[str, nn.Module]:
        shared = {"global_classifier": self.model.classifier} if self.prefix else {"global": self.model}
        return shared | {"generator": self.generator}

    def state_dict(self) -> dict:
        return {
            "model": clone_state(self.model),
            "generator": clone_state(self.generator),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "global_counts": self.global_counts,
            "last_local": dict(self.last_local),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.generator.load_state_dict(state["generator"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_counts = state.get("global_counts")
        self.last_local = dict(state.get("last_local", {}))
