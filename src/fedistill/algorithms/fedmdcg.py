"""FedMD-CG: model decoupling; a client shares a conditional feature generator instead of its extractor.

Each client i holds a model F_i (``extractor.*``) → C_i (``classifier.*``) and a generator G_i(y, ε)
that imitates F_i's features. One round t (t = round − 1 of R):

1. server → sampled clients ``train``: from t = 1 on, the global pair (C_g, G_g) and the global label
   distribution of the previous round.
2. Client, stage 1 (local model): C_i := C_g, then SGD steps on
   CE + λ1(t)·KL(D_i(Ĝ(y))/T_c ‖ D_i(F_i(x))/T_c) + λ2(t)·CE(D_i(Ĝ(ŷ)), ŷ) + λ3(t)·MSE(F_i(x), Ĝ(y)),
   with Ĝ = G_g frozen, ŷ drawn from the global label distribution and λ(t) ramped from 0 (round 0:
   CE only). Stage 2 (local generator, which persists across rounds): Adam steps over the round's
   cached real batches on CE + KL from the local model + feature MSE to F_i + diversity.
3. Client → server: C_i, G_i and its label counts. F_i never leaves the client.
4. Server (it holds no data): (C_g, G_g) := the sample-weighted average of the received pairs, then
   the crossed data-free distillation Σ_i w_{i,y}·(L1 + L2 + L3) (see :mod:`fedmdcg_losses`).

Metrics. ``local_accuracy`` is the paper's "local accuracy": each client's full model on its own IID
test shard, sample-weighted (algorithms/personalized.py). The paper's "global accuracy" averages the *full*
local models, extractors included, which the protocol never moves; the in-process runner reports it
as ``global_accuracy_oracle``, computed from the clients' own states outside the protocol and the
ledger (algorithms/oracle.py); :func:`oracle_global_accuracy` does the same from saved client states.

Where the paper and the released code differ, ``preset = "official-code"`` switches to the code:
uniform noise, the batch cache that is never cleared (with its label-sum de-duplication), label
counts taken from that cache, and the softmax fed to the server's L3 (reference notes §4.7).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedistill import devices
from fedistill.algorithms import fedmdcg_losses as L
from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    register,
)
from fedistill.algorithms.option_checks import check_choices, check_nonnegative, check_positive
from fedistill.algorithms.oracle import ORACLE_LABEL, ORACLE_METRIC, average_local_models
from fedistill.algorithms.personalized import (
    ask_sampled,
    class_counts,
    decoupled_model,
    evaluates_local,
    load_pair,
    local_report,
    pair_state,
    private_start,
    summarise_local,
)
from fedistill.algorithms.training import LocalTraining
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import augment, to_float
from fedistill.errors import ConfigError, FederationError
from fedistill.experiment.config import RunConfig
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.federation.reply_spec import TRAIN_LOSS, TRAIN_METRICS, ReplySpec
from fedistill.models.base import CLASSIFIER_PREFIX, Classifier
from fedistill.models.feature_generator import FeatureGenerator, feature_generator_for
from fedistill.seeding import seeded, torch_generator

PRESETS = ("paper", "official-code")
LABEL_COUNTS = ("data", "cache")
LAMBDAS = (  # stage 1 (ramped), then stage 2
    "lambda_kl", "lambda_ce_gen", "lambda_mse",
    "gen_lambda_ce", "gen_lambda_kl", "gen_lambda_mse", "gen_lambda_div",
)  # fmt: skip


@dataclass(frozen=True)
class FedMDCGOptions:
    """Defaults: the paper's method with the released code's hyper-parameters (reference notes §4.2).

    The common run keys carry the local model's training: the paper's setting is ``optimizer = "sgd"``,
    ``lr = 0.05``, ``batch_size = 64``, ``local_steps = 20`` (mini-batch steps, not epochs), K = 10
    clients, 100 rounds, model ``lenet-fedmdcg``.
    """

    preset: str = "paper"  # paper | official-code (switches noise, clear_cache, dedup, label counts, L3)
    # stage 1: weights of the ramped terms, the ramp, and T_c
    lambda_kl: float = 1.0
    lambda_ce_gen: float = 1.0
    lambda_mse: float = 0.1
    ramp: str = "cubic"  # cubic: λ⁰·(t/(R−1))^power | none: λ⁰ from round 1 on (round 0 is CE only)
    ramp_power: float = 3.0
    client_temperature: float = 10.0
    generated_batch_size: int = 64  # labels ŷ drawn per step for the CE on Ĝ's features
    # stage 2: the local generator
    generator_hidden: str = ""  # comma list of hidden widths; "" = FedMD-CG's table for the dataset
    noise_dim: int = 0  # 0 = FedMD-CG's table for the dataset
    noise: str = "normal"  # normal (paper) | uniform (the code's torch.rand)
    diversity: str = "div2"  # div2 | div1 | div0 | none
    gen_lambda_ce: float = 1.0
    gen_lambda_kl: float = 1.0
    gen_lambda_mse: float = 1.0
    gen_lambda_div: float = 1.0
    generator_passes: int = 1  # Adam steps per cached batch and round (the code's I_gg)
    generator_lr: float = 3e-4
    generator_weight_decay: float = 1e-4
    # The code's cache of real batches: never cleared (a typo) and de-duplicated by label sum.
    clear_cache: bool = True
    dedup_label_sum: bool = False
    label_counts: str = "data"  # data: the training split's class counts | cache: the code's (§4.3)
    # server
    server_distillation: bool = True  # the code's distill_aggregation; False: plain weighted average
    server_steps: int = 50
    server_lr: float = 3e-4
    server_weight_decay: float = 1e-4  # Adam's coupled L2 (the code's): it outweighs the tiny KD gradient and
    # shrinks C_g ~20 % a round early on (metrics classifier_norm*; benchmarks/fedmdcg_variants.py)
    server_batch_size: int = 64
    server_temperature: float = 10.0
    softmax_bug: bool = False  # L3 feeds a softmax where KLDivLoss wants a log-softmax (the code)

    def validate(self) -> None:
        choices = {
            "preset": PRESETS,
            "ramp": L.RAMP_SCHEDULES,
            "noise": ("normal", "uniform"),
            "diversity": L.DIVERSITY_TYPES,
            "label_counts": LABEL_COUNTS,
        }
        check_choices("fedmdcg", self, choices)
        check_positive(
            "fedmdcg",
            self,
            "generated_batch_size generator_passes server_steps server_batch_size "
            "ramp_power client_temperature generator_lr server_lr server_temperature",
        )
        check_nonnegative("fedmdcg", self, "generator_weight_decay server_weight_decay")
        if self.noise_dim < 0:
            raise ConfigError(
                f"fedmdcg.noise_dim must be >= 0 (0: the dataset's default), got {self.noise_dim}"
            )
        check_nonnegative("fedmdcg", self, " ".join(LAMBDAS))
        self.hidden_dims()

    def local_lambdas(self) -> L.LocalModelLambdas:
        return L.LocalModelLambdas(self.lambda_kl, self.lambda_ce_gen, self.lambda_mse)

    def generator_lambdas(self) -> L.GeneratorLambdas:
        return L.GeneratorLambdas(
            self.gen_lambda_ce, self.gen_lambda_kl, self.gen_lambda_mse, self.gen_lambda_div
        )

    def hidden_dims(self) -> tuple[int, ...] | None:
        if not self.generator_hidden.strip():
            return None
        try:
            dims = tuple(int(w) for w in self.generator_hidden.split(","))
        except ValueError:
            dims = ()
        if not dims or min(dims) < 1:
            raise ConfigError(
                "fedmdcg.generator_hidden must be a comma list of positive widths, "
                f"got {self.generator_hidden!r}"
            )
        return dims


#: What `preset = "official-code"` changes (notes §4.3, §4.7): only keys the user did not set.
OFFICIAL_CODE = {
    "noise": "uniform",
    "clear_cache": False,
    "dedup_label_sum": True,
    "label_counts": "cache",
    "softmax_bug": True,
}


def resolve_options(config: RunConfig, options: FedMDCGOptions) -> FedMDCGOptions:
    if options.preset != "official-code":
        return options
    explicit = set(config.options.get("fedmdcg", {}))
    return dataclasses.replace(options, **{k: v for k, v in OFFICIAL_CODE.items() if k not in explicit})


def new_generator(
    config: RunConfig, info: DatasetInfo, options: FedMDCGOptions, model: Classifier
) -> FeatureGenerator:
    """G imitating ``model.extractor``; seeded from the run seed, so every site and the server start equal."""
    sizes: dict[str, Any] = {"noise": options.noise}
    if options.hidden_dims() is not None:
        sizes["hidden_dims"] = options.hidden_dims()
    if options.noise_dim:
        sizes["noise_dim"] = options.noise_dim
    return seeded(
        config.seed, lambda: feature_generator_for(model, info, **sizes), "model-init", "fedmdcg-generator"
    )


def _finite(value: torch.Tensor, what: str) -> float:
    number = float(value.detach())
    if not math.isfinite(number):
        raise FederationError(f"FedMD-CG {what} diverged: loss is {number} (lower the learning rates)")
    return number


def _frozen(module: nn.Module) -> nn.Module:
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


class FedMDCGClient(ClientLogic):
    """Owns F_i, C_i, G_i, their optimisers and the cache of real batches; shares only C_i, G_i, counts."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options = resolve_options(ctx.config, ctx.options)
        self.model = decoupled_model(ctx.config, ctx.info, "FedMD-CG")
        private_start(self.model, ctx, CLASSIFIER_PREFIX)  # F_i never leaves the client
        self.generator = new_generator(ctx.config, ctx.info, self.options, self.model)  # G_i
        self.received = _frozen(new_generator(ctx.config, ctx.info, self.options, self.model))  # Ĝ
        self.training = LocalTraining.from_config(ctx.config, ctx.info)
        self.optimizer = self.training.make_optimizer(self.model.parameters())
        self.generator_optimizer = torch.optim.Adam(
            self.generator.parameters(),
            lr=self.options.generator_lr,
            weight_decay=self.options.generator_weight_decay,
        )
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []  # augmented uint8 images, labels
        self.specs = state_specs(pair_state(self.model.classifier, self.generator))

    @handles("train")
    def train(self, message: Message) -> Message:
        round = int(message.scalar("config", "round"))
        t, num_classes = round - 1, self.ctx.info.num_classes
        distribution = None
        if message.arrays.get("parameters"):
            expect_arrays(message, "parameters", self.specs)  # exactly C_g and G_g: no extractor
            expect_arrays(
                message, "label-statistics", {"label_distribution": ArraySpec("float32", (num_classes,))}
            )
            load_pair(message.tensors("parameters"), self.model.classifier, self.received)
            distribution = message.tensor("label-statistics", "label_distribution")
        elif L.distillation_active(t):
            raise FederationError(f"round {round}: FedMD-CG clients need the global classifier and generator")
        metrics = self._train_model(round, distribution)
        metrics |= self._train_generator(round)
        counts = self._label_counts(t)
        if self.options.clear_cache:
            self.cache = []
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            metrics |= local_report(self.ctx, self.model)
        return Message.build(
            "train",
            arrays={
                "parameters": pair_state(self.model.classifier, self.generator),
                "label-statistics": {"class_counts": counts},
            },
            scalars={"metrics": metrics},
        )

    # --- stage 1: the local model -----------------------------------------------------------------
    def _batches(self, round: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(augmented uint8 x, y) batches for this round's steps (or epochs), reshuffled every epoch."""
        data, spec = self.ctx.train, self.training
        if len(data) < 2:
            raise FederationError(f"a client needs at least 2 training samples, this one has {len(data)}")
        generator = torch_generator(self.ctx.config.seed, "fedmdcg-batches", self.ctx.client_id, round)
        stop = len(data) - len(data) % spec.batch_size if len(data) > spec.batch_size else len(data)
        steps, epoch = 0, 0
        while True:
            order = torch.randperm(len(data), generator=generator)
            for start in range(0, stop, spec.batch_size):
                idx = order[start : start + spec.batch_size]
                x = augment(data.x[idx], self.ctx.info, generator) if spec.augment else data.x[idx]
                yield devices.on_device(x), devices.on_device(data.y[idx])
                steps += 1
                if spec.steps > 0 and steps >= spec.steps:
                    return
            epoch += 1
            if spec.steps <= 0 and epoch >= spec.epochs:
                return

    def _remember(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Cache a real batch for stage 2; the code skips a batch whose label sum (or size) it has seen."""
        if self.options.dedup_label_sum and any(
            len(cy) != len(y) or int(cy.sum()) == int(y.sum()) for _, cy in self.cache
        ):
            return
        self.cache.append((x.clone(), y.clone()))

    def _train_model(self, round: int, distribution: torch.Tensor | None) -> dict[str, float]:
        options, model, t = self.options, self.model, round - 1
        lambdas = options.local_lambdas().at_round(
            t, self.ctx.config.rounds, options.ramp, options.ramp_power
        )
        distil = L.distillation_active(t) and distribution is not None
        noise = torch_generator(self.ctx.config.seed, "fedmdcg-local-noise", self.ctx.client_id, round)
        model.train()
        total, ce_sum, count = 0.0, 0.0, 0
        for x_raw, y in self._batches(round):
            self._remember(x_raw, y)
            x = to_float(x_raw, self.ctx.info)
            features = model.extractor(x)
            logits = model.classifier(features)
            ce = L.local_ce(logits, y)
            kl = ce_gen = mse = None
            if distil:
                assert distribution is not None
                with torch.no_grad():
                    target = model.classifier(self.received(y, generator=noise))
                    sampled = L.sample_labels(distribution, options.generated_batch_size, noise)
                    generated = self.received(sampled, generator=noise)
                    paired = self.received(y, generator=noise)
                kl = L.logit_kd_from_global(logits, target, options.client_temperature)
                ce_gen = L.generated_ce(model.classifier(generated), sampled)
                mse = L.feature_kd_to_global(features, paired)
            loss = L.local_model_objective(ce, kl, ce_gen, mse, lambdas)
            value = _finite(loss, "local model training")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            total += value * len(y)
            ce_sum += float(ce.detach()) * len(y)
            count += len(y)
        return {
            "train_loss": total / count,
            "train_ce": ce_sum / count,
            "ramp": L.ramp_factor(t, self.ctx.config.rounds, options.ramp, options.ramp_power),
        }

    # --- stage 2: the local generator -------------------------------------------------------------
    def _train_generator(self, round: int) -> dict[str, float]:
        options, model, generator = self.options, self.model, self.generator
        noise = torch_generator(self.ctx.config.seed, "fedmdcg-generator-noise", self.ctx.client_id, round)
        eps = [generator.sample_noise(len(y), noise) for _, y in self.cache]  # one ε per batch and round
        lambdas = options.generator_lambdas()
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        generator.train()
        losses, hits, seen = [], 0, 0
        try:
            for _ in range(options.generator_passes):
                for (x_raw, y), e in zip(self.cache, eps, strict=True):
                    with torch.no_grad():
                        real = model.extractor(to_float(x_raw, self.ctx.info))
                        real_logits = model.classifier(real)
                    fake = generator(y, e)
                    fake_logits = model.classifier(fake)
                    div = None
                    if options.diversity != "none":
                        div = L.diversity_loss(options.diversity, e, fake, generator.label_code(y))
                    loss = L.generator_objective(
                        L.generator_ce(fake_logits, y),
                        L.logit_kd_from_local(fake_logits, real_logits),
                        L.feature_kd_from_local(fake, real),
                        div,
                        lambdas,
                    )
                    losses.append(_finite(loss, "local generator training"))
                    hits += int((fake_logits.detach().argmax(1) == y).sum())
                    seen += len(y)
                    self.generator_optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.generator_optimizer.step()
        finally:
            for p in model.parameters():
                p.requires_grad_(True)
        return {
            "generator_loss": float(np.mean(losses)) if losses else 0.0,
            "generator_accuracy": hits / seen if seen else 0.0,  # C_i(G_i(y)) = y during its steps
            "generator_steps": len(losses),
        }

    def _label_counts(self, t: int) -> torch.Tensor:
        """The training split's class counts, or the code's: a floor (0 in round 0, else 1) + the cache's."""
        c = self.ctx.info.num_classes
        if self.options.label_counts == "data":
            return class_counts(self.ctx.train, c)
        counts = torch.full((c,), 0 if t == 0 else 1, dtype=torch.int64)
        for _, y in self.cache:
            counts += torch.bincount(y, minlength=c)
        return counts

    def state_dict(self) -> dict:
        """Everything private that must survive a restart (the received Ĝ comes again with each request)."""
        return {
            "model": clone_state(self.model),
            "generator": clone_state(self.generator),
            "optimizer": self.optimizer.state_dict(),
            "generator_optimizer": self.generator_optimizer.state_dict(),
            "cache_x": [x.clone() for x, _ in self.cache],
            "cache_y": [y.clone() for _, y in self.cache],
            "num_samples": len(self.ctx.train),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.generator.load_state_dict(state["generator"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator_optimizer.load_state_dict(state["generator_optimizer"])
        self.cache = list(zip(state["cache_x"], state["cache_y"], strict=True))


# --- server ----------------------------------------------------------------------------------------


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
    (its share of class y). Every generator call draws its own ε; C_g(G_g(y)) (L1) and G_g(y) read
    by every C_i (L3) are computed once per step for all clients.
    """
    for module in (*local_generators, *local_classifiers):
        _frozen(module)
    weights = L.label_weights(counts)
    generator.train()
    classifier.train()
    first = last = None
    for _ in range(steps):
        y = L.sample_labels(counts, batch_size, rng)
        with torch.no_grad():
            teachers = torch.stack(
                [c(g(y, generator=rng)) for g, c in zip(local_generators, local_classifiers, strict=True)]
            )
            local_features = [g(y, generator=rng) for g in local_generators]
        global_pair = classifier(generator(y, generator=rng))
        head_on_local = torch.stack([classifier(f) for f in local_features])
        global_features = generator(y, generator=rng)
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
        _finite(loss, "server distillation")
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
    """How often C(G(y)) = y for labels drawn ∝ ``counts``: a data-free check that the pair agrees."""
    was_training = generator.training
    generator.eval()
    y = L.sample_labels(counts, size, rng)
    hits = (classifier(generator(y, generator=rng)).argmax(1) == y).float().mean()
    generator.train(was_training)
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


def oracle_global_accuracy(
    client_states: Sequence[Mapping[str, Any]], config: RunConfig, info: DatasetInfo, test: ImageSet
) -> dict[str, float]:
    """The paper's "global accuracy", as an evaluation-only oracle outside the protocol.

    It averages the *full* local models (extractors included, weighted by n_i) and scores the average
    on the whole test set, as the released code does. The protocol never moves an extractor, so this
    reads each site's own state (``client.state_dict()`` in one process, or a checkpoint's client
    parts) and nothing of it appears in the ledger. Report it under :data:`ORACLE_LABEL`.
    """
    if not client_states:
        raise ConfigError("the global-accuracy oracle needs at least one client state")
    decoupled_model(config, info, "FedMD-CG")  # the model must split into extractor and classifier
    weights = [float(s["num_samples"]) for s in client_states]
    return {ORACLE_METRIC: average_local_models(client_states, weights, config, info, test)}


register(
    Algorithm(
        "fedmdcg",
        "FedMD-CG: clients share a classifier and a feature generator (never the extractor); the "
        "server aggregates them by crossed data-free distillation. local_accuracy is the paper's local "
        "accuracy. Its global accuracy averages the full local models, which the protocol never "
        f"sends: global_accuracy_oracle, the {ORACLE_LABEL}",
        FedMDCGClient,
        FedMDCGServer,
        FedMDCGOptions,
        oracle=average_local_models,
    )
)
