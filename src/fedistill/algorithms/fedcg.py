"""FedCG (Wu et al. 2022, "FedCG: Leverage Conditional GAN for Protecting Privacy and Maintaining
Competitive Performance in Federated Learning"), as the FedMD-CG paper re-implements it for its comparison.

Each client has a private feature extractor F_k, a shared classifier C and a conditional feature
generator G_k(y, ε) with a private feature discriminator D_k. A round on client k:

1. put the received global classifier under F_k and reset G_k to the received global generator Ĝ;
2. train F_k and C on private data with CE + γ(t)·MSE(F_k(x), Ĝ(y, ε)) (Ĝ frozen): the extractor is
   pulled towards the features the federation's generator draws for the same labels;
3. train G_k against D_k on this round's batches (one D step and one G step per batch): D_k tells the
   trained extractor's features F_k(x) from G_k(y, ε) (the standard GAN losses), so G_k learns to
   draw F_k's features for a label;
4. upload C and G_k. The extractor never leaves the client; the discriminator neither.

The server averages the classifiers and the generators (by sample count). With ``aggregation =
"distill"`` it then distils the averaged pair (G, C) for ``distill_steps`` Adam steps towards the
sample-weighted ensemble softmax(Σ_k π_k·C_k(G_k(y))/T), y drawn ∝ the clients' label counts (the
FedMD-CG repo's ``fedcg`` server mode, and the original's KD); only then do clients send label counts.

Defaults are the FedMD-CG repo's (its FedCG baseline): γ(t) = γ₀·(t/(R−1))³ with γ₀ = 1; G =
FedMD-CG's generator (two Linear-BatchNorm-ReLU blocks, sizes by dataset, ε ~ U[0, 1), one-hot
labels, no output activation); D = the classifier's shape with one output, Linear(h, w) → Linear(w, 1)
(no activation in between, as the code's "classifier with output dimension 1") and a sigmoid, w =
FedMD-CG's fc1 width for the dataset; Adam lr 3e-4, betas (0.9, 0.999), weight decay 1e-4 for G and D,
optimiser states and D kept across rounds; plain averaging on the server.

The original FedCG differs; its cheap differences are options: ``gamma_schedule = "sigmoid"``
(γ = γ₀·(2/(1+e^{−10p}) − 1), p = min(t/50, 1)), ``noise = "normal"``, ``label_input = "embedding"``,
``output_activation = "sigmoid"``, ``conditional_discriminator`` (D also sees the label; only
useful with ``discriminator_activation = "leaky-relu"``, since a linear D turns the label into a
bias), ``gan_beta1 = 0.5``, ``gan_passes = 20`` (epochs of GAN training), ``aggregation = "distill"``. Not
reproduced: its LeNet-5 feature maps and convolutional generator/discriminator, and its KD's shared ε
between student and teachers (here every generator call draws its own ε, as in the FedMD-CG repo).
Nor the repo's de-duplication of cached batches by label sum (a bug that drops some batches from the
GAN stage): every batch of the round is used.

Metrics as in fedper.py (algorithms/personalized.py): ``local_accuracy`` (each client's full model
after local training, on its own IID test shard, sample-weighted) and ``personal_test_accuracy``;
there is no global model. The in-process runner adds the FedMD-CG paper's global accuracy,
``global_accuracy_oracle``: the average of the full local models, an evaluation-only oracle outside
the protocol (algorithms/oracle.py).
"""

from __future__ import annotations

import copy
import math
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
from fedistill.algorithms.fedgen import build_generator
from fedistill.algorithms.fedmdcg_losses import ramp_factor, sample_labels
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
    load_pair,
    local_report,
    pair_state,
    private_start,
    summarise_local,
    unprefixed,
)
from fedistill.algorithms.training import LocalTraining, average_states, check_finite, local_batches
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.federation.reply_spec import TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.models.base import CLASSIFIER_PREFIX, Classifier
from fedistill.models.feature_generator import (
    LABEL_INPUTS,
    NOISE_DISTRIBUTIONS,
    OUTPUT_ACTIVATIONS,
    FeatureGenerator,
    fedmdcg_generator_sizes,
)
from fedistill.models.lenet import fedmdcg_widths
from fedistill.seeding import seeded, torch_generator

DISCRIMINATOR_ACTIVATIONS: tuple[str, ...] = ("none", "leaky-relu")


@dataclass(frozen=True)
class FedCGOptions:
    gamma: float = 1.0  # γ₀: weight of MSE(F(x), Ĝ(y)) at full ramp
    gamma_schedule: str = "cubic"  # cubic (FedMD-CG repo: (t/(R−1))³) | sigmoid (original) | constant
    generator_hidden: str = ""  # comma-separated widths; empty: FedMD-CG's table for the dataset
    noise_dim: int = 0  # 0: FedMD-CG's table for the dataset
    noise: str = "uniform"  # uniform (the code's U[0, 1)) | normal (the original)
    label_input: str = "one-hot"  # one-hot | embedding (the original)
    output_activation: str = "none"  # none | sigmoid (the original)
    discriminator_hidden: int = 0  # 0: FedMD-CG's fc1 width (digits/MNIST 32, FMNIST 64, else 128)
    conditional_discriminator: bool = False  # the original's D also sees the label
    discriminator_activation: str = "none"  # none (the code: D linear in h) | leaky-relu
    generator_lr: float = 3e-4
    discriminator_lr: float = 3e-4
    gan_beta1: float = 0.9  # Adam beta1 of G and D (the original: 0.5)
    gan_weight_decay: float = 1e-4
    gan_passes: int = 1  # passes over the round's batches in the GAN stage (the original: 20 epochs)
    weighting: str = "samples"  # samples | uniform: how the server averages classifiers and generators
    aggregation: str = "average"  # average (FedMD-CG repo default) | distill (average, then KD)
    distill_steps: int = 20
    distill_batch_size: int = 64
    distill_lr: float = 1e-3
    distill_temperature: float = 10.0

    def validate(self) -> None:
        choices = {
            "gamma_schedule": ("cubic", "sigmoid", "constant"),
            "noise": NOISE_DISTRIBUTIONS,
            "label_input": LABEL_INPUTS,
            "output_activation": OUTPUT_ACTIVATIONS,
            "weighting": ("samples", "uniform"),
            "aggregation": ("average", "distill"),
            "discriminator_activation": DISCRIMINATOR_ACTIVATIONS,
        }
        check_choices("fedcg", self, choices)
        check_nonnegative("fedcg", self, "gamma gan_weight_decay noise_dim discriminator_hidden")
        check_positive(
            "fedcg",
            self,
            "generator_lr discriminator_lr gan_passes distill_steps distill_batch_size distill_lr "
            "distill_temperature",
        )
        if not 0 <= self.gan_beta1 < 1:
            raise ConfigError(f"fedcg.gan_beta1 must be in [0, 1), got {self.gan_beta1}")
        if self.generator_hidden:
            parse_widths("fedcg.generator_hidden", self.generator_hidden)


def gamma_at(options: FedCGOptions, round_index: int, rounds: int) -> float:
    """γ(t) for round index t of R (0 in the first round under the two ramps)."""
    if options.gamma_schedule == "cubic":
        return options.gamma * ramp_factor(round_index, rounds, "cubic")
    if options.gamma_schedule == "sigmoid":
        p = min(round_index / 50.0, 1.0)
        return options.gamma * (2.0 / (1.0 + math.exp(-10.0 * p)) - 1.0)
    return options.gamma


class FeatureDiscriminator(nn.Module):
    """D(h[, y]) → one logit: Linear(feature_dim [+ C], hidden) → [LeakyReLU] → Linear(hidden, 1).

    The sigmoid is in the loss. Without the activation (the FedMD-CG code's classifier-shaped D) D is
    linear in h, so it can only compare feature means along one direction, and an appended label
    only adds a per-class bias: conditioning needs ``activation = "leaky-relu"`` to matter.
    """

    def __init__(self, feature_dim: int, hidden: int, num_classes: int = 0, activation: str = "none") -> None:
        super().__init__()
        if activation not in DISCRIMINATOR_ACTIVATIONS:
            raise ConfigError(
                f"discriminator activation must be one of {', '.join(DISCRIMINATOR_ACTIVATIONS)}, "
                f"got {activation!r}"
            )
        self.num_classes = num_classes  # > 0: conditional, the one-hot label is appended to h
        self.fc1 = nn.Linear(feature_dim + num_classes, hidden)
        self.act = nn.LeakyReLU(0.2) if activation == "leaky-relu" else nn.Identity()
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.num_classes:
            if labels is None:
                raise ValueError("a conditional discriminator needs the labels")
            features = torch.cat((features, F.one_hot(labels, self.num_classes).to(features.dtype)), dim=1)
        return self.fc2(self.act(self.fc1(features))).squeeze(1)


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """−mean[log D(F(x))] − mean[log(1 − D(G(y)))], with D = sigmoid(logit)."""
    return -(F.logsigmoid(real_logits).mean() + F.logsigmoid(-fake_logits).mean())


def generator_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    """−mean[log D(G(y))] (the non-saturating GAN loss)."""
    return -F.logsigmoid(fake_logits).mean()


def generator_options(options: FedCGOptions, info: DatasetInfo) -> dict[str, object]:
    hidden, noise_dim = fedmdcg_generator_sizes(info.name)
    if options.generator_hidden:
        hidden = parse_widths("fedcg.generator_hidden", options.generator_hidden)
    return {
        "hidden_dims": hidden,
        "noise_dim": options.noise_dim or noise_dim,
        "noise": options.noise,
        "label_input": options.label_input,
        "output_activation": options.output_activation,
    }


def train_gan(
    extractor: nn.Module,
    generator: FeatureGenerator,
    discriminator: FeatureDiscriminator,
    g_optimizer: torch.optim.Optimizer,
    d_optimizer: torch.optim.Optimizer,
    cache: list[tuple[torch.Tensor, torch.Tensor]],
    rng: torch.Generator,
    passes: int = 1,
) -> dict[str, float]:
    """One D step then one G step per cached batch, `passes` times; ε is drawn once per batch.

    The extractor is frozen in eval mode: its features of the cached real batches are what G imitates.
    """
    extractor.eval()
    with torch.no_grad():
        real = [extractor(x) for x, _ in cache]
    noises = [generator.sample_noise(len(y), rng) for _, y in cache]
    conditional = discriminator.num_classes > 0
    generator.train()
    discriminator.train()
    d_sum, g_sum, n = 0.0, 0.0, 0
    for _ in range(passes):
        for (_, y), h, eps in zip(cache, real, noises, strict=True):
            labels = y if conditional else None
            with torch.no_grad():
                fake = generator(y, eps)
            d_loss = discriminator_loss(discriminator(h, labels), discriminator(fake, labels))
            check_finite(d_loss, "FedCG's discriminator", n)
            d_optimizer.zero_grad(set_to_none=True)
            d_loss.backward()
            d_optimizer.step()
            g_loss = generator_loss(discriminator(generator(y, eps), labels))
            check_finite(g_loss, "FedCG's generator", n)
            g_optimizer.zero_grad(set_to_none=True)
            d_optimizer.zero_grad(set_to_none=True)
            g_loss.backward()
            g_optimizer.step()
            d_sum += d_loss.item()
            g_sum += g_loss.item()
            n += 1
    d_optimizer.zero_grad(set_to_none=True)
    return {"discriminator_loss": d_sum / max(n, 1), "generator_loss": g_sum / max(n, 1)}


def train_toward_generator(
    model: Classifier,
    generator: FeatureGenerator,
    data: ImageSet,
    info: DatasetInfo,
    spec: LocalTraining,
    batch_rng: torch.Generator,
    noise_rng: torch.Generator,
    gamma: float,
) -> tuple[dict[str, float], list[tuple[torch.Tensor, torch.Tensor]]]:
    """CE + γ·MSE(F(x), Ĝ(y, ε)) on private data; returns metrics and the batches used (for the GAN)."""
    optimizer = spec.make_optimizer(model.parameters())
    model.train()
    generator.eval()
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    total, count, steps, mse_sum = 0.0, 0, 0, 0.0
    for x, y in local_batches(data, info, spec, batch_rng):
        features = model.extractor(x)
        ce = F.cross_entropy(model.classifier(features), y)
        loss = ce
        if gamma > 0:
            with torch.no_grad():
                target = generator(y, generator=noise_rng)
            mse = F.mse_loss(features, target)
            loss = ce + gamma * mse
            mse_sum += mse.item()
        check_finite(loss, "local training", steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        cache.append((x, y))
        total += ce.item() * len(y)
        count += len(y)
        steps += 1
    metrics = {"train_loss": total / count, "steps": steps}
    if gamma > 0:
        metrics["feature_mse"] = mse_sum / steps
    return metrics, cache


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


# ------------------------------------------------------------------------------------------------
# Client
# ------------------------------------------------------------------------------------------------
def build_discriminator(ctx: ClientContext, feature_dim: int, options: FedCGOptions) -> FeatureDiscriminator:
    hidden = options.discriminator_hidden or fedmdcg_widths(ctx.info.name)[2]
    classes = ctx.info.num_classes if options.conditional_discriminator else 0
    return seeded(
        ctx.config.seed,
        lambda: FeatureDiscriminator(feature_dim, hidden, classes, options.discriminator_activation),
        "feature-discriminator-init",
    )


class FedCGClient(ClientLogic):
    """Keeps F_k, D_k and the optimiser states; shares C and G_k."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: FedCGOptions = ctx.options
        self.model = decoupled_model(ctx.config, ctx.info, "FedCG")
        private_start(self.model, ctx, CLASSIFIER_PREFIX)  # F_k never leaves the client
        self.generator = build_generator(
            ctx.config, ctx.info, self.model, **generator_options(self.options, ctx.info)
        )
        self.discriminator = build_discriminator(ctx, self.generator.feature_dim, self.options)
        betas = (self.options.gan_beta1, 0.999)
        self.g_optimizer = torch.optim.Adam(
            self.generator.parameters(),
            lr=self.options.generator_lr,
            betas=betas,
            weight_decay=self.options.gan_weight_decay,
        )
        self.d_optimizer = torch.optim.Adam(
            self.discriminator.parameters(),
            lr=self.options.discriminator_lr,
            betas=betas,
            weight_decay=self.options.gan_weight_decay,
        )
        self.specs = state_specs(self.shared_state())
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    def shared_state(self) -> dict[str, torch.Tensor]:
        """What leaves this client: the classifier and the generator, never the extractor."""
        return pair_state(self.model.classifier, self.generator)

    @handles("train")
    def train(self, message: Message) -> Message:
        expect_arrays(message, "parameters", self.specs)  # exactly C and G: nothing private comes in
        load_pair(message.tensors("parameters"), self.model.classifier, self.generator)
        round = int(message.scalar("config", "round"))
        seed, cid = self.ctx.config.seed, self.ctx.client_id
        model = self.model
        metrics, cache = train_toward_generator(
            model,
            self.generator,
            self.ctx.train,
            self.ctx.info,
            self.training,
            torch_generator(seed, "local-training", cid, round),
            torch_generator(seed, "fedcg-target-noise", cid, round),
            float(message.scalar("config", "gamma", 0.0)),
        )
        metrics |= train_gan(
            model.extractor,
            self.generator,
            self.discriminator,
            self.g_optimizer,
            self.d_optimizer,
            cache,
            torch_generator(seed, "fedcg-gan-noise", cid, round),
            self.options.gan_passes,
        )
        self.model.train()
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            metrics |= local_report(self.ctx, self.model)
        arrays = {"parameters": self.shared_state()}
        if message.scalar("config", "send_label_counts", False):
            arrays["label-statistics"] = {
                "class_counts": class_counts(self.ctx.train, self.ctx.info.num_classes)
            }
        return Message.build("train", arrays=arrays, scalars={"metrics": metrics})

    def state_dict(self) -> dict:
        return {
            "model": clone_state(self.model),
            "generator": clone_state(self.generator),
            "discriminator": clone_state(self.discriminator),
            "g_optimizer": self.g_optimizer.state_dict(),
            "d_optimizer": self.d_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.g_optimizer.load_state_dict(state["g_optimizer"])
        self.d_optimizer.load_state_dict(state["d_optimizer"])


# ------------------------------------------------------------------------------------------------
# Server
# ------------------------------------------------------------------------------------------------
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


register(
    Algorithm(
        "fedcg",
        "FedCG: private extractors; shared classifiers and conditional feature generators (cGAN) averaged",
        FedCGClient,
        FedCGServer,
        FedCGOptions,
        oracle=average_local_models,
    )
)
