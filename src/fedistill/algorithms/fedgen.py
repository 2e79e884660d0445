"""FedGen (Zhu et al. 2021, "Data-Free Knowledge Distillation for Heterogeneous Federated Learning").

The server learns a conditional *feature* generator G(y, ε) from what the clients upload: their
heads (``classifier.*``) and their label counts. G must produce, for a label y, latent features that
the clients' heads classify as y, each head trusted on a class in proportion to its share of that
class's samples (w_{k,c} = n_{k,c} / Σ_j n_{j,c}); a diversity term keeps G from collapsing to one
point per class. G then travels to the clients, where it regularises local training through the head:

    L_k = CE(f_k(x), y) + (B_g/B)·α_t·CE(head_k(G(ŷ)), ŷ) + β_t·KL(softmax(head_k(G(y))) ‖ f_k(x)),

with ŷ drawn from the global label distribution, α_t = max(1e-4, α₀·0.98^t), β_t likewise, from the
second round on (there is no trained G in the first). The server also averages what it received
(weighted by sample counts) and sends it back with G.

What leaves a client each round: the parameters it shares (``share``) and its class counts
(ledger kind ``label-statistics``). FedGen's code averages whole models (``share = "model"``, the
default, giving a global model and a ``test_accuracy``); the FedMD-CG paper compares against FedGen
"sharing the clients' classifiers" (``share = "classifier"``): the extractors stay private, as in
LG-FedAvg, and only the personal models' metrics exist.

Defaults are FedGen's MNIST configuration: G = one hidden layer of 256 (Linear, BatchNorm, ReLU),
noise ε ~ U[0, 1)^32, one-hot labels; 50 Adam steps per round on batches of 32 labels (lr 3e-4,
weight decay 1e-2, learning rate ×0.98 per round); teacher weight 1, diversity weight 1 with FedGen's
distances (squared L2 on ε, L1 on G's outputs), no adversarial student term; α₀ = β₀ = 10 on the clients.

Where the paper and the released code differ, the paper is the default and the code an option:
``label_sampling = "counts"`` draws labels ∝ the global label counts (the paper's p̂(y)); the code
draws them uniformly (the server over labels some client holds more than one sample of, the clients
over all labels), ``label_sampling = "uniform"``. Label counts are those of the client's training
data; the code counts the labels of the batches seen in the round, plus one.

Metrics as in fedper.py (algorithms/personalized.py): ``local_accuracy`` is each client's model just
after local training on its own IID test shard (sample-weighted), ``personal_test_accuracy`` the mean
of those models on the test set.
The in-process runner adds the FedMD-CG paper's global accuracy, ``global_accuracy_oracle``: the
average of the full local models, an evaluation-only oracle outside the protocol (algorithms/oracle.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    register,
)
from fedistill.algorithms.fedmdcg_losses import (
    diversity_div0,
    label_distribution,
    label_weights,
    sample_labels,
)
from fedistill.algorithms.option_checks import (
    check_choices,
    check_nonnegative,
    check_positive,
    parse_widths,
)
from fedistill.algorithms.oracle import average_local_models
from fedistill.algorithms.personalized import (
    GENERATOR_PREFIX,
    ask_sampled,
    class_counts,
    decoupled_model,
    evaluates_local,
    local_report,
    part_of,
    prefixed,
    summarise_local,
    unprefixed,
)
from fedistill.algorithms.training import LocalTraining, average_states, check_finite, local_batches
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError
from fedistill.experiment.config import RunConfig
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.federation.reply_spec import TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.models.base import CLASSIFIER_PREFIX, Classifier
from fedistill.models.feature_generator import (
    LABEL_INPUTS,
    NOISE_DISTRIBUTIONS,
    FeatureGenerator,
    feature_generator_for,
)
from fedistill.seeding import seeded, torch_generator


@dataclass(frozen=True)
class FedGenOptions:
    share: str = "model"  # model (FedGen's code: whole models averaged) | classifier (FedMD-CG's comparison)
    weighting: str = "samples"  # samples | uniform: how the server weighs the received parameters
    label_sampling: str = "counts"  # counts (the paper's p̂(y)) | uniform (the released code)
    generative_alpha: float = 10.0  # α₀: client CE on generated features of sampled labels
    generative_beta: float = 10.0  # β₀: client KL to the head's answer on generated features (EMNIST: 1)
    decay: float = 0.98  # α_t = max(min_weight, α₀·decay^t), same for β_t
    min_weight: float = 1e-4
    generator_batch_size: int = 32  # labels per generated batch, on the server and in the client's CE
    generator_steps: int = 50  # server Adam steps on G per round (10 epochs × 5 iterations)
    generator_lr: float = 3e-4
    generator_weight_decay: float = 1e-2
    generator_lr_decay: float = 0.98  # ExponentialLR factor, one step per round
    teacher_weight: float = 1.0  # server: the label-weighted CE of the clients' heads on G(y)
    diversity_weight: float = 1.0  # server: exp(−mean d_ε·d_G)
    diversity_metric: str = "l1"  # distance on G's outputs: l1 (FedGen) | l2 (the FedMD-CG repo's FedGen)
    adversarial_weight: float = 0.0  # server: −β·KL(ensemble ‖ global head) on G(y); FedGen uses 0
    noise: str = "uniform"  # uniform (the code's U[0, 1)) | normal
    noise_dim: int = 32
    generator_hidden: str = "256"  # comma-separated hidden widths
    label_input: str = "one-hot"  # one-hot | embedding

    def validate(self) -> None:
        choices = {
            "share": ("model", "classifier"),
            "weighting": ("samples", "uniform"),
            "label_sampling": ("counts", "uniform"),
            "diversity_metric": ("l1", "l2"),
            "noise": NOISE_DISTRIBUTIONS,
            "label_input": LABEL_INPUTS,
        }
        check_choices("fedgen", self, choices)
        check_nonnegative(
            "fedgen",
            self,
            "generative_alpha generative_beta min_weight generator_weight_decay teacher_weight "
            "diversity_weight adversarial_weight",
        )
        check_positive("fedgen", self, "generator_batch_size generator_steps generator_lr noise_dim")
        if not 0 < self.decay <= 1 or not 0 < self.generator_lr_decay <= 1:
            raise ConfigError(
                f"fedgen.decay and fedgen.generator_lr_decay must be in (0, 1], "
                f"got {self.decay} and {self.generator_lr_decay}"
            )
        parse_widths("fedgen.generator_hidden", self.generator_hidden)


# ------------------------------------------------------------------------------------------------
# The feature generator (shared with fedcg.py)
# ------------------------------------------------------------------------------------------------
def build_generator(
    config: RunConfig, info: DatasetInfo, model: Classifier, **options: object
) -> FeatureGenerator:
    """G for `model`'s features, initialised from the run seed: the server and every client start equal."""
    return seeded(
        config.seed, lambda: feature_generator_for(model, info, **options), "feature-generator-init"
    )


# ------------------------------------------------------------------------------------------------
# The pieces of FedGen, as functions
# ------------------------------------------------------------------------------------------------
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


def train_regularized(
    model: Classifier,
    generator: FeatureGenerator | None,
    data: ImageSet,
    info: DatasetInfo,
    spec: LocalTraining,
    batch_rng: torch.Generator,
    sample_rng: torch.Generator,
    *,
    alpha: float = 0.0,
    beta: float = 0.0,
    label_probs: torch.Tensor | None = None,
    generator_batch_size: int = 32,
) -> dict[str, float]:
    """Local training: CE, plus FedGen's two generator terms through the head when `generator` is given."""
    optimizer = spec.make_optimizer(model.parameters())
    model.train()
    if generator is not None:
        generator.eval()
        if label_probs is None:
            raise ValueError("FedGen's regulariser needs the label distribution to draw ŷ from")
    ratio = generator_batch_size / spec.batch_size
    total, count, steps = 0.0, 0, 0
    teacher_sum, latent_sum = 0.0, 0.0
    for x, y in local_batches(data, info, spec, batch_rng):
        logits = model(x)
        ce = F.cross_entropy(logits, y)
        loss = ce
        if generator is not None:
            assert label_probs is not None
            with torch.no_grad():
                target = F.softmax(model.classifier(generator(y, generator=sample_rng)), dim=1)
                sampled = torch.multinomial(
                    label_probs.cpu(), generator_batch_size, True, generator=sample_rng
                )
                sampled = sampled.to(label_probs.device)
                generated = generator(sampled, generator=sample_rng)
            latent = F.kl_div(F.log_softmax(logits, dim=1), target, reduction="batchmean")
            teacher = F.cross_entropy(model.classifier(generated), sampled)
            loss = ce + ratio * alpha * teacher + beta * latent
            teacher_sum += teacher.item()
            latent_sum += latent.item()
        check_finite(loss, "local training", steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += ce.item() * len(y)
        count += len(y)
        steps += 1
    metrics = {"train_loss": total / count, "steps": steps}
    if generator is not None:
        metrics |= {"teacher_loss": teacher_sum / steps, "latent_loss": latent_sum / steps}
    return metrics


# ------------------------------------------------------------------------------------------------
# Client
# ------------------------------------------------------------------------------------------------
def shared_prefix(options: FedGenOptions) -> str:
    """'' shares every model entry; 'classifier.' only the head."""
    return "" if options.share == "model" else CLASSIFIER_PREFIX


def generator_options(options: FedGenOptions) -> dict[str, object]:
    return {
        "hidden_dims": parse_widths("fedgen.generator_hidden", options.generator_hidden),
        "noise_dim": options.noise_dim,
        "noise": options.noise,
        "label_input": options.label_input,
    }


class FedGenClient(ClientLogic):
    """Trains the received model (or its own extractor under the received head) with G's regulariser."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: FedGenOptions = ctx.options
        self.model = decoupled_model(ctx.config, ctx.info, "FedGen")
        self.prefix = shared_prefix(self.options)
        self.generator = build_generator(ctx.config, ctx.info, self.model, **generator_options(self.options))
        self.specs = state_specs(part_of(self.model.state_dict(), self.prefix))
        self.generator_specs = state_specs(prefixed(self.generator.state_dict(), GENERATOR_PREFIX))
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    @handles("train")
    def train(self, message: Message) -> Message:
        regularize = bool(message.scalar("config", "regularize", False))
        expect_arrays(message, "parameters", self.specs | (self.generator_specs if regularize else {}))
        received = message.tensors("parameters")
        shared = {k: v for k, v in received.items() if not k.startswith(GENERATOR_PREFIX)}
        self.model.load_state_dict({**self.model.state_dict(), **shared})
        label_probs = None
        if regularize:
            self.generator.load_state_dict(unprefixed(received, GENERATOR_PREFIX))
            num_classes = self.ctx.info.num_classes
            if self.options.label_sampling == "counts":
                spec = {"global_counts": ArraySpec("int64", (num_classes,))}
                expect_arrays(message, "label-statistics", spec)
                label_probs = label_distribution(message.tensor("label-statistics", "global_counts"))
            else:
                label_probs = torch.full((num_classes,), 1.0 / num_classes)
        round = int(message.scalar("config", "round"))
        seed, cid = self.ctx.config.seed, self.ctx.client_id
        metrics = train_regularized(
            self.model,
            self.generator if regularize else None,
            self.ctx.train,
            self.ctx.info,
            self.training,
            torch_generator(seed, "local-training", cid, round),
            torch_generator(seed, "fedgen-client-sampling", cid, round),
            alpha=float(message.scalar("config", "generative_alpha", 0.0)),
            beta=float(message.scalar("config", "generative_beta", 0.0)),
            label_probs=label_probs,
            generator_batch_size=self.options.generator_batch_size,
        )
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            metrics |= local_report(self.ctx, self.model)
        arrays = {
            "parameters": part_of(self.model.state_dict(), self.prefix),
            "label-statistics": {"class_counts": class_counts(self.ctx.train, self.ctx.info.num_classes)},
        }
        return Message.build("train", arrays=arrays, scalars={"metrics": metrics})

    def state_dict(self) -> dict:
        """The whole model (its private extractor when only the head is shared); G is resent each round."""
        return {"model": clone_state(self.model)}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])


# ------------------------------------------------------------------------------------------------
# Server
# ------------------------------------------------------------------------------------------------
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
            {"parameters": self.specs, "label-statistics": count_spec}, (*TRAIN_METRICS, TRAIN_LOSS)
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


register(
    Algorithm(
        "fedgen",
        "FedGen: a server-trained feature generator regularises local training; models averaged",
        FedGenClient,
        FedGenServer,
        FedGenOptions,
        oracle=average_local_models,
    )
)
