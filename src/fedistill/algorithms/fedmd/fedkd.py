"""FedKD (Gong et al. 2022, "Preserving Privacy in Federated Learning with Ensemble Cross-Domain
Knowledge Distillation"): one-shot distillation of quantised, noisy client votes on unlabelled public
data into a central student.

Set-up, once:

1. `train`: every client trains its local model once (`fedkd.teachers`, a comma list cycled over the
   clients; `teacher_epochs`) through `stage1.train_teacher`, FedIOD's path: with the same
   architecture, local-training options, `teacher_epochs` and seed, FedKD and FedIOD distil the very
   same models, one cache entry per site. Clients report metrics only.
2. `query.votes`: the server sends the public images (kind `public-data`; labels, if the source has
   any, never leave the server); each client answers with its quantised outputs on them (kind
   `votes`, uint8 (N, C)): a one-hot vote for its top class (`output = "one-hot"`, the default), or
   its softmax probabilities quantised to `bits` bits (`output = "probs"`), rounded by largest
   remainder so that each sample's levels sum to exactly 2^bits - 1. `client_noise` > 0 first adds
   N(0, client_noise^2) to each probability (a local randomisation, not accounted; drawn from the run
   seed, so reproducible and regenerable by the server: no privacy against it).
3. The server sums the votes per image (probabilities as level / (2^bits - 1)) and labels each public
   image with GNMax, the noisy plurality argmax_j (n_j + N(0, sigma^2)) of PATE
   (`fedistill.privacy.pate`); sigma = 0 is the plain plurality (ties to the lower class).

Rounds: the central student (`student`, "" = the run's model) trains on the labelled public images
with cross-entropy, `student_epochs` epochs a round (Adam `student_lr` with the run's `weight_decay`,
batches of `student_batch_size` augmented as the run's `augment` says, the optimiser kept across
rounds). No client takes part after the set-up.
`test_accuracy` is the student's on the test set (the last round's; there is no model selection);
the final metrics add the local models' mean test accuracy (`teacher_mean_accuracy`, what each client
reports of its own model, the mean Standalone client of the same models) and, when the public source
has labels of the federation's classes, `public_label_accuracy`, the aggregated labels' accuracy on them
(evaluation only).

Privacy (PATE). `pate_sigma` sets GNMax's noise; `pate_epsilon` instead picks the smallest sigma whose
data-independent epsilon at `pate_delta` for labelling every public image stays within it (calibrated
on the number of queries alone, so the choice reveals nothing of the votes). The summary reports
`pate_sigma`, `pate_queries` and two epsilons of the released labels: `pate_epsilon_data_independent`
(a bound for any votes) and `pate_epsilon_data_dependent` (Papernot et al.'s Theorem 6 on these votes;
publishing it needs a smooth-sensitivity analysis this library does not do). Each client's quantised
output lies on the scaled probability simplex, so one client changing its data moves the vote sums by
at most sqrt(2) in L2, as GNMax's analysis assumes, for `probs` as for `one-hot`. As in PATE the
aggregator is trusted: the guarantee covers the labels and the student against whoever sees them, not
the individual votes the server receives.

What crosses: public images (down), votes (up, `votes`), metrics. Never parameters.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    model_cycle,
    register,
)
from fedistill.algorithms.fedmd.public_data import (
    PUBLIC,
    build_public,
    check_public,
    check_public_run,
    predict,
    public_arrays,
    read_public,
)
from fedistill.algorithms.shared.option_checks import (
    check_choices,
    check_model_names,
    check_nonnegative,
    check_positive,
)
from fedistill.algorithms.shared.stage1 import STAGE1_UNUSED_KEYS, teachers_from_cache, train_teacher
from fedistill.algorithms.shared.training import LocalTraining, evaluate_model, new_model, train_local
from fedistill.config import RunConfig
from fedistill.data.base import ImageSet
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import LOCAL_METRICS, NUM_SAMPLES, ReplySpec
from fedistill.privacy import pate
from fedistill.seeding import numpy_generator, torch_generator

log = logging.getLogger(__name__)

OUTPUTS = ("one-hot", "probs")
BITS = 4  # `bits`' default


@dataclass(frozen=True)
class FedKDOptions:
    """`[fedkd]` options. Stage 1 uses the common local-training keys (batch_size, lr, optimizer, ...)."""

    teachers: str = ""  # comma list of model names cycled over the clients; "" = the run's model
    teacher_epochs: int = 30  # as FedIOD's, so both distil the same stage-1 models
    public: str = "holdout"  # holdout | dataset:<name> | noise | generator:<path> (public_data.py)
    # a random subset of the public source; <= 0: all of it (noise and generator: the number of draws,
    # which must then be > 0)
    public_size: int = 0
    output: str = "one-hot"  # one-hot (a vote per image) | probs (softmax quantised to `bits` bits)
    bits: int = BITS  # output = probs: levels 0 .. 2^bits - 1 (at most 8)
    client_noise: float = 0.0  # std of Gaussian noise on each probability before quantising (not accounted)
    pate_sigma: float = 0.0  # GNMax noise on the vote sums; 0: the plain plurality
    pate_epsilon: float = 0.0  # > 0: calibrate pate_sigma to this (data-independent) epsilon instead
    pate_delta: float = 1e-5  # the delta of the reported PATE epsilons (and of pate_epsilon's calibration)
    # secret (the aggregator's own, drawn when it starts, never recorded) | run (from the run seed:
    # reproducible, and no privacy against whoever knows the seed, which the run's records name)
    pate_noise_seed: str = "secret"
    student: str = ""  # the central model; "" = the run's model
    student_epochs: int = 1  # the central student's epochs on the labelled public images per round
    student_batch_size: int = 64  # the central student's batch size
    student_lr: float = 1e-3  # the central student's Adam learning rate
    #: The options that name models (`check_model_names`; the run checks each serves its task)
    model_keys: ClassVar[str] = "teachers student"

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        check_public_run(self.public, "fedkd.public", config)

    def validate(self) -> None:
        """Check the output kind, the public data, the ranges, and that PATE's noise and budget are not
        both given."""
        check_choices("fedkd", self, {"output": OUTPUTS})
        check_model_names("fedkd", self, self.model_keys)
        check_public(self.public, "fedkd.public", labelled=False, size=self.public_size)
        check_positive("fedkd", self, "teacher_epochs student_epochs student_batch_size student_lr")
        check_nonnegative("fedkd", self, "client_noise pate_sigma pate_epsilon")
        if not 1 <= self.bits <= 8:
            raise ConfigError(f"fedkd.bits must be in 1..8 (uint8 levels), got {self.bits}")
        if self.output == "one-hot" and self.bits != BITS:
            raise ConfigError(
                f"fedkd.bits = {self.bits} sets the levels of output = 'probs', and output is 'one-hot' (one "
                "vote per image, which has no levels): set output = 'probs' or leave bits out"
            )
        if self.pate_sigma > 0 and self.pate_epsilon > 0:
            raise ConfigError(
                "fedkd.pate_sigma and fedkd.pate_epsilon both set: give the noise or the budget, not both"
            )
        if not 0 < self.pate_delta < 1:
            raise ConfigError(f"fedkd.pate_delta must be in (0, 1), got {self.pate_delta}")
        if self.pate_noise_seed not in ("secret", "run"):
            raise ConfigError(f"fedkd.pate_noise_seed must be secret or run, got {self.pate_noise_seed!r}")

    @property
    def levels(self) -> int:
        """What each sample's quantised output sums to: 1 for a one-hot vote, 2^bits - 1 for probs."""
        return 1 if self.output == "one-hot" else 2**self.bits - 1


def teacher_of(options: FedKDOptions, config: RunConfig, client_id: int) -> str:
    """The architecture of client `client_id`'s teacher: `fedkd.teachers` cycled over the clients."""
    names = model_cycle(options.teachers, config.model, key="fedkd.teachers")
    return names[client_id % len(names)]


# ------------------------------------------------------------------------------------------------
# The method's two defining steps: quantise at the client, aggregate at the server
# ------------------------------------------------------------------------------------------------
def quantise(probs: torch.Tensor, output: str, bits: int) -> torch.Tensor:
    """Probabilities (N, C) -> uint8 (N, C) whose rows sum to the levels: a one-hot vote for the top
    class (the lower index on ties), or round(p * (2^bits - 1)) by largest remainder (ties to the lower
    class), so each row stays a point of the scaled simplex."""
    n, c = probs.shape
    if output == "one-hot":
        votes = torch.zeros(n, c, dtype=torch.uint8)
        votes[torch.arange(n), probs.argmax(1).cpu()] = 1
        return votes
    levels = 2**bits - 1
    p = probs.double().clamp_min(0)
    p = torch.where(p.sum(1, keepdim=True) > 0, p, torch.ones_like(p))  # noise pushed all below 0
    scaled = p / p.sum(1, keepdim=True).clamp_min(1e-12) * levels
    floor = scaled.floor()
    short = (levels - floor.sum(1)).round().long()  # 0 .. C - 1 units still to hand out per row
    order = torch.argsort(-(scaled - floor), dim=1, stable=True)
    rank = torch.argsort(order, dim=1)  # each class's place in that order (the inverse permutation)
    return (floor + (rank < short[:, None]).double()).to(torch.uint8)


def aggregate(
    votes: list[torch.Tensor], levels: int, sigma: float, generator: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The vote sums (N, C), each client's row counting 1 in all, and GNMax's label for each image."""
    counts = torch.stack([v.double().cpu() for v in votes]).sum(0).numpy() / levels
    return counts, pate.gnmax_aggregate(counts, sigma, generator)


def calibrate(options: FedKDOptions, queries: int) -> float:
    """GNMax's sigma: `pate_sigma`, or the smallest one whose data-independent epsilon for `queries`
    answers stays within `pate_epsilon`."""
    if options.pate_epsilon <= 0:
        return options.pate_sigma

    def epsilon(sigma: float) -> float:
        rdp = queries * pate.rdp_gnmax_data_independent(sigma)
        return pate.rdp_to_epsilon(rdp, options.pate_delta)[0]

    try:
        return pate.calibrate_sigma(epsilon, options.pate_epsilon)
    except ValueError as exc:
        raise ConfigError(f"fedkd.pate_epsilon = {options.pate_epsilon}: {exc}") from None


@dataclass(frozen=True)
class VotesSpec(ReplySpec):
    """A `query.votes` reply: uint8 votes (N, C) whose every row sums to the levels, nothing more."""

    levels: int = 1

    def check(self, message: Message) -> None:
        super().check(message)  # no client refuses its votes: a refusal is an invalid reply here
        votes = message.array("votes", "votes")
        if (votes > self.levels).any() or (votes.sum(1, dtype=np.int64) != self.levels).any():
            raise FederationError(f"{message.type}: votes/votes rows must sum to {self.levels}")


# ------------------------------------------------------------------------------------------------
# Client
# ------------------------------------------------------------------------------------------------
class FedKDClient(ClientLogic):
    """Trains its local model once, then answers with quantised votes on public images."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: FedKDOptions = ctx.options
        self.architecture = teacher_of(self.options, ctx.config, ctx.client_id)
        self.teacher = new_model(ctx.config, ctx.info, self.architecture)

    @handles("train")
    def train(self, message: Message) -> Message:
        """Train this client's teacher once on its private data and report its accuracies; only metrics
        leave."""
        metrics = train_teacher(self.teacher, self.ctx, self.architecture, self.options.teacher_epochs)
        self.teacher.eval()
        test = evaluate_model(self.teacher, self.ctx.global_test, self.ctx.info)
        local = evaluate_model(self.teacher, self.ctx.test, self.ctx.info)
        val = evaluate_model(self.teacher, self.ctx.val, self.ctx.info)
        metrics |= {
            NUM_SAMPLES: len(self.ctx.train),
            "test_accuracy": test["accuracy"],
            "local_accuracy": local["accuracy"] if local["count"] else 0.0,
            "local_count": local["count"],
            "teacher_val_accuracy": val["accuracy"] if val["count"] else -1.0,
        }
        return Message.build("train", scalars={"metrics": metrics})

    @handles("query.votes", read_only=True)
    def votes(self, message: Message) -> Message:
        """The teacher's quantised outputs on the public images, noised first when `client_noise` is set."""
        images, _ = read_public(message, self.ctx.info, labelled=False)
        probs = torch.softmax(predict(self.teacher, images, self.ctx.info), dim=1)
        if self.options.client_noise > 0:
            noise = torch_generator(self.ctx.config.seed, "fedkd-client-noise", self.ctx.client_id)
            probs = probs + self.options.client_noise * torch.randn(probs.shape, generator=noise).to(
                probs.device
            )
        votes = quantise(probs, self.options.output, self.options.bits)
        return Message.build("query.votes", arrays={"votes": {"votes": votes}})

    def state_dict(self) -> dict[str, Any]:
        return {"teacher": clone_state(self.teacher)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.teacher.load_state_dict(state["teacher"])


# ------------------------------------------------------------------------------------------------
# Server
# ------------------------------------------------------------------------------------------------
class FedKDServer(ServerLogic):
    """Holds the public images, their aggregated labels and the student."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, options = ctx.config, ctx.options
        self.options: FedKDOptions = options
        self.public = build_public(
            options.public, ctx, size=options.public_size, key="fedkd.public", labelled=False
        )
        self.sigma = calibrate(options, len(self.public))
        self.student = new_model(config, ctx.info, options.student or config.model)
        base = LocalTraining.from_config(config, ctx.info)
        self.training = dataclasses.replace(
            base,
            epochs=options.student_epochs,
            steps=0,
            batch_size=options.student_batch_size,
            optimizer="adam",
            lr=options.student_lr,
            momentum=0.0,
        )
        self.optimizer = self.training.make_optimizer(self.student.parameters())
        self.labels: torch.Tensor | None = None
        self.reference: dict[str, float] = {}
        log.info("FedKD: public data %s; GNMax sigma %g", self.public.description, self.sigma)

    def setup(self, fleet: Fleet) -> None:
        config, info = self.ctx.config, self.ctx.info
        timeout = config.timeout or None
        needed = (NUM_SAMPLES, "test_accuracy", *LOCAL_METRICS)
        trained = successful(
            fleet.broadcast(Message.build("train"), timeout=timeout, expect=ReplySpec(metrics=needed)),
            minimum=min(config.min_clients, len(fleet.clients)),
            what="trained local models",
        )
        ask = Message.build("query.votes", arrays={PUBLIC: public_arrays(self.public.images)})
        spec = VotesSpec(
            {"votes": {"votes": ArraySpec("uint8", (len(self.public), info.num_classes))}},
            levels=self.options.levels,
        )
        answered = successful(
            fleet.broadcast(ask, sorted(trained), timeout=timeout, expect=spec),
            minimum=min(config.min_clients, len(trained)),
            what="votes on the public images",
        )
        clients = sorted(answered)
        counts, labels = aggregate(
            [answered[c].tensor("votes", "votes") for c in clients],
            self.options.levels,
            self.sigma,
            self._gnmax_noise(),
        )
        self.labels = torch.from_numpy(labels).long()
        accuracy = np.array([float(trained[c].scalar("metrics", "test_accuracy")) for c in sorted(trained)])
        self.reference = {
            "teacher_mean_accuracy": float(accuracy.mean()),
            "teacher_std_accuracy": float(accuracy.std()),
            "teachers_from_cache": teachers_from_cache(trained),
            "voters": float(len(clients)),
            "plurality_agreement": float(np.mean(labels == counts.argmax(1))),
        }
        if self.public.labels is not None:
            self.reference["public_label_accuracy"] = float(
                (self.labels == self.public.labels).float().mean()
            )
        self.reference |= self._privacy(counts)

    def _privacy(self, counts: np.ndarray) -> dict[str, float]:
        """PATE's epsilons of the released labels (module docstring); nothing without noise."""
        if self.sigma <= 0:
            return {}
        delta = self.options.pate_delta
        independent = pate.rdp_to_epsilon(len(counts) * pate.rdp_gnmax_data_independent(self.sigma), delta)[0]
        dependent = pate.rdp_to_epsilon(pate.gnmax_rdp(counts, self.sigma), delta)[0]
        return {
            "pate_sigma": self.sigma,
            "pate_queries": float(len(counts)),
            "pate_delta": delta,
            "pate_epsilon_data_independent": independent,
            "pate_epsilon_data_dependent": dependent,
        }

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        if self.labels is None:
            raise FederationError("FedKD's public images have no labels yet: its set-up did not run")
        data = ImageSet(self.public.images, self.labels)
        generator = torch_generator(self.ctx.config.seed, "fedkd-student", round)
        result = train_local(
            self.student, data, self.ctx.info, self.training, generator, optimizer=self.optimizer
        )
        return {"train_loss": result["train_loss"]}

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        result = self.ctx.evaluate(self.student)
        return {"test_accuracy": result["accuracy"], "test_loss": result["loss"]}

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        return dict(last) | self.reference

    def _gnmax_noise(self) -> np.random.Generator:
        """GNMax's noise: from a seed only the aggregator holds (`pate_noise_seed = "secret"`), since noise
        anyone can regenerate from the run's seed makes each label a function of the votes alone."""
        if self.options.pate_noise_seed == "run":
            return numpy_generator(self.ctx.config.seed, "fedkd-gnmax")
        return np.random.default_rng(secrets.randbits(128))

    def models(self) -> dict[str, torch.nn.Module]:
        return {"student": self.student}

    def state_dict(self) -> dict[str, Any]:
        return {
            "student": clone_state(self.student),
            "optimizer": self.optimizer.state_dict(),
            "labels": self.labels.clone() if self.labels is not None else torch.empty(0, dtype=torch.int64),
            "reference": dict(self.reference),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.student.load_state_dict(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.labels = state["labels"] if len(state["labels"]) else None
        self.reference = {k: float(v) for k, v in state["reference"].items()}


register(
    Algorithm(
        "fedkd",
        "FedKD: one-shot; the clients' quantised votes on public images, aggregated PATE-style, label a "
        "central student; test_accuracy is the student's on the test set",
        FedKDClient,
        FedKDServer,
        FedKDOptions,
        unused_keys={
            **STAGE1_UNUSED_KEYS,
            "local_epochs": "its sites train their stage-1 models once, for fedkd.teacher_epochs epochs, "
            "and its student for fedkd.student_epochs a round",
        },
    )
)
