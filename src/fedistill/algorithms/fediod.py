"""FedIOD: one-shot, data-free federated learning by input and output collaborative distillation.

Stage 1 (nothing is sent): every client trains its own model T_k once, with any architecture.
Stage 2: the server holds a generator G and the central student S; every client holds its frozen
T_k and a patch discriminator D_k that it trains on its own data. One distillation step:

1. server -> clients  `query.generate`: synthetic inputs x = G(w), and per-client loss weights.
   Each client updates D_k on (x, a batch of its own data), then returns its logits T_k(x) and its
   density ratio D_k(x) / E[D_k(x')] (Eq. 8), keeping the graph of the terms it computes alone:
   pi_k * L_gan^k (Eq. 2) and pi_k * H(T_k(x)) (Eq. 3).
2. The server computes the terms that need every client at once, L_unique = -JSD (Eq. 4-5) and
   -L_mimic (Eq. 9-10, S against the importance-weighted ensemble), and sends each client
   `query.backprop`: the gradient with respect to its logits. Each client returns the input-gradient
   of its local terms plus the server's terms pulled through T_k, in one backward pass. The server
   adds the gradient through S and updates G with the sum dL/dx.
3. server -> clients `query.student`: the inputs of all S-steps of this iteration in one message;
   clients return logits and density ratios; the server takes the S-steps on L_mimic.

No client ever sends parameters. Clients send label statistics only when the ensemble weighting
needs them (Eq. 8 or the released code's class shares), and model selection uses the clients'
validation splits (`evaluate.student`: S's parameters down, metrics up).

Differential privacy (``dp_enabled = true``; the paper's "Privacy Analysis" appendix, Table 5)
------------------------------------------------------------------------------------------
*What is sanitised.* The paper "adopt[s] the DP analysis in DP-CGAN and GS-WGAN to measure the
privacy cost of the gradients used to train the generator. By clipping and adding Gaussian noise to
these gradients, it satisfies (eps, delta)-DP". The gradients used to train G that leave client k are
its `query.backprop` reply: for every synthetic sample x_i, the gradient with respect to x_i of
``c_gan L_gan^k(D_k(x)) + c_conf H(T_k(x)) + <dL_server/dz_k, T_k(x)>``, that is GS-WGAN's upstream
gradient (what D_k sends back towards G) plus the two terms that flow through T_k. That whole
per-sample input-gradient is sanitised at the client, after its backward pass and before the reply is
built: scaled to L2 norm <= ``dp_clip_norm``, then N(0, (dp_noise_multiplier * dp_clip_norm)^2) added
to every coordinate (`sanitize_per_sample`). Clipping only the D_k term and adding the T_k terms
unclipped would leave the released tensor unbounded, so the sum is clipped. D_k's parameter gradient
is not sanitised (that would be DP-CGAN's DP-SGD on D): D_k never leaves the client, the paper
sanitises the generator's gradients, and D_k's BatchNorm mixes the samples of a batch, so per-sample
clipping of its parameter gradients would bound nothing. The norm bound applies to the returned
tensor, the gradient of batch-mean losses (about 1/B of a per-sample loss gradient): choose
``dp_clip_norm`` on that scale.

*Accounting* (``dp_accounting``), per client, on its own `ClientAccountant`:

* ``"d-step"`` (default): the D-step's use of real data is a subsampled Gaussian mechanism with
  sample rate ``q_k = B / n_k`` (the real batch over the client's data size) and the applied noise
  multiplier, one accountant step per D-step (one per G-step). This is DP-CGAN's accounting, which the
  paper cites; it is exact for a discriminator trained with DP-SGD. Here D_k carries unnoised state
  from step to step, so it measures the cost the way the paper reports it, not a worst-case bound.
* ``"release"``: the worst case for the gradient channel (GS-WGAN's bound without discriminator
  subsampling). Each `query.backprop` releases B clipped per-sample gradients; removing one real
  record may change D_k and so every one of them, each by up to 2C: an L2 sensitivity of
  ``2 C sqrt(B)``. Each release is accounted as a Gaussian mechanism with noise multiplier
  ``sigma / (2 sqrt(B))`` at sample rate 1.

Neither covers T_k's logits (`query.generate`, `query.student`; the paper applies PATE to local
outputs, `fedistill.privacy.pate`), Eq. 8's density ratios (from D_k and the mean score on the real
batch), stage 1 (teacher training, label and sample counts) or the validation accuracies used for
model selection. With DP on, clients leave their real-batch D-loss out of their metrics.

*Budget.* ``dp_target_epsilon`` with no noise multiplier calibrates the noise once per client
(`calibrate_noise`) for the planned number of G-steps, which the server sends. A client whose next
step would exceed the target refuses it (`PrivacyBudgetExceeded`, answered as a refusal); the server
then ends the run cleanly: the partial epoch is evaluated, the best student kept and the summary
written with every client's epsilon (``epsilon_client_<k>``, ``epsilon_max``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from fedistill.algorithms import fediod_losses as L
from fedistill.algorithms.base import (
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    StopRun,
    clone_state,
    model_cycle,
    register,
)
from fedistill.algorithms.bn_matching import batchnorm_statistics_loss
from fedistill.algorithms.option_checks import check_choices
from fedistill.algorithms.stage1 import trained_once
from fedistill.algorithms.synthetic_pool import SyntheticPool
from fedistill.algorithms.training import LocalTraining, evaluate_model, new_model, train_local
from fedistill.data.transforms import to_float
from fedistill.errors import ConfigError, FederationError
from fedistill.experiment.config import RunConfig
from fedistill.experiment.plots import plot_image_grid
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.federation.reply_spec import TRAIN_METRICS, ReplySpec
from fedistill.metrics.generation import adapted_inception_score, class_coverage
from fedistill.models.discriminator import build_discriminator
from fedistill.models.generator import build_generator
from fedistill.privacy.accounting import PrivacyBudgetExceeded
from fedistill.privacy.budget import (
    ClientBudget,
    DPOptions,
    epsilon_summary,
    epsilons_of,
    refusal,
    refusal_reason,
)
from fedistill.privacy.sanitize import sanitize_per_sample
from fedistill.seeding import seeded, torch_generator

log = logging.getLogger(__name__)

PRESETS = ("paper", "official-code")
WEIGHTINGS = ("eq8", "class-share", "uniform")
MIMIC_MODES = ("l2", "kl", "kl-official", "l1")
SELECTIONS = ("validation", "last", "best-on-test")
DP_ACCOUNTINGS = ("d-step", "release")


@dataclass(frozen=True)
class FedIODOptions(DPOptions):
    """Defaults follow the paper; `preset = "official-code"` switches to the released code's choices.

    The ``dp_*`` options (see `DPOptions` and the module docstring) sanitise the input-gradients.
    """

    preset: str = "paper"
    teachers: str = ""  # one model name for all clients, or a comma list cycled over clients; "" = `model`
    student: str = ""  # "" = `model`
    teacher_epochs: int = 30  # stage 1: local epochs of each teacher (uses the common lr/batch/optimizer)
    # synthetic batch, and each client's real batch for D_k (named apart from the common `batch_size`,
    # which an algorithm table overrides for local training: here, stage 1)
    synthetic_batch_size: int = 64
    iters_per_epoch: int | str = "max"  # max | min (over clients of ceil(n_k / batch)), or a number
    student_steps: int = 5  # S-steps per G-step (the released code's 5)
    # Carry step t's S-step inputs in step t+1's query.generate (clients answer them before their
    # D-step): the same arithmetic with 2 instead of 3 exchanges per G-step, plus one per epoch.
    merge_student_queries: bool = True
    latent_dim: int = 100
    generator_width: int = 64
    discriminator_width: int = 128
    lr_generator: float = 1e-3  # the paper: Adam, cosine from 1e-3 to 0, for G, D_k and S
    lr_discriminator: float = 2e-4  # 1e-3 lets every D_k win within an epoch on small data
    lr_student: float = 1e-3
    student_optimizer: str = "adam"  # adam | sgd (sgd: momentum 0.9, weight decay 3e-5 as the code)
    schedule: str = "cosine"  # cosine | constant
    gan_weighting: str = "pi"  # pi (Eq. 2) | average (Table 6 ablation)
    gan_loss: str = "non-saturating"  # non-saturating | minimax
    ensemble_weighting: str = "eq8"  # eq8 | class-share (the code) | uniform (Table 6 ablation)
    mimic: str = "l2"  # l2 (tau -> infinity, Eq. 10) | kl (temperature tau) | kl-official | l1
    tau: float = 1.0
    use_conf: bool = True
    use_unique: bool = True
    js: str = "paper"  # paper (-JSD, Eq. 4-5) | official (the code's + (1/K) sum KL(M || P_k), clamped)
    w_gan: float = 1.0
    w_conf: float = 1.0
    w_unique: float = 1.0
    # Eq. 11 weighs every term 1. Measured on digits (K=5, 160 G-steps): with w_adv = 1 and no balance
    # term G collapsed onto 1-2 classes and S stayed at chance (10%); with w_adv = 0.2 and the released
    # code's class-balance term (w_balance = 10) every class stayed covered and S reached 62%.
    # Set w_adv = 1, w_balance = 0 for the paper's literal weights.
    w_adv: float = 0.2  # weight of -L_mimic in G's loss (G searches inputs where S lags)
    w_balance: float = 10.0  # the released code's class-balance term (not in the paper)
    # teachers: the code's per-teacher class marginals; ensemble: the weighted ensemble's (Eq. 9) marginal.
    # Measured on digits (K=10, alpha 0.5, lenet-fedmdcg, 100 G-steps; S test %, teachers -> ensemble):
    # 30 teacher epochs 44.4 -> 41.7, with lr_student = lr_generator = 3e-3 54.7 -> 61.9, 60 teacher
    # epochs 10.0 (G collapsed onto one class in epoch 1) -> 24.4. Not yet measured on MNIST-size data.
    balance: str = "teachers"
    selection: str = "validation"  # validation | last | best-on-test (only with the official-code preset)
    collapse_share: float = 0.5  # warn when one class takes more than this share of G's samples
    samples_every: int = 1  # save a grid of synthetic samples every N epochs (0: never)
    dp_accounting: str = "d-step"  # d-step (q = B / n_k per D-step, the paper's) | release (worst case)
    # The bound is on each returned per-sample input-gradient (a batch-mean loss's, so ~1/B of a
    # per-sample loss gradient). Measured on digits (B = 64, lenet-fedmdcg teachers, first epoch):
    # median norm 0.005, 90th percentile 0.01, max 0.02.
    dp_clip_norm: float = 0.01
    # Stabilisers from the one-shot literature (0 = off, the paper). Measured on the digits demo (K = 10,
    # alpha 0.5, lenet-fedmdcg, 100 G-steps, seeds 0-2; README "FedIOD" section): see `pool_size`.
    w_bn: float = 0.0  # DeepInversion batch-norm statistic matching on each teacher (bn_matching.py)
    pool_size: int = 0  # synthetic samples kept with their ensemble targets for replay (0: no pool)
    pool_steps: int = 0  # extra S-steps per G-step on batches drawn from the pool

    def validate(self) -> None:
        self.validate_dp()
        choices = {
            "preset": PRESETS,
            "ensemble_weighting": WEIGHTINGS,
            "mimic": MIMIC_MODES,
            "selection": SELECTIONS,
            "gan_weighting": ("pi", "average"),
            "gan_loss": ("non-saturating", "minimax"),
            "js": ("paper", "official"),
            "schedule": ("cosine", "constant"),
            "student_optimizer": ("adam", "sgd"),
            "balance": ("ensemble", "teachers"),
            "dp_accounting": DP_ACCOUNTINGS,
        }
        check_choices("fediod", self, choices)
        if self.selection == "best-on-test" and self.preset != "official-code":
            raise ConfigError(
                "fediod.selection = 'best-on-test' selects on the test set; it exists only to reproduce the "
                "released code (set fediod.preset = 'official-code')"
            )
        if self.iters_per_epoch not in ("max", "min") and not (
            isinstance(self.iters_per_epoch, int) and self.iters_per_epoch >= 1
        ):
            raise ConfigError(
                f"fediod.iters_per_epoch must be max, min or a number; got {self.iters_per_epoch!r}"
            )
        for key in (
            "teacher_epochs",
            "synthetic_batch_size",
            "student_steps",
            "latent_dim",
            "generator_width",
        ):
            if getattr(self, key) < 1:
                raise ConfigError(f"fediod.{key} must be >= 1")
        for key in ("lr_generator", "lr_discriminator", "lr_student", "tau"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"fediod.{key} must be > 0")
        for key in ("w_bn", "pool_size", "pool_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"fediod.{key} must be >= 0")
        if self.pool_steps and not self.pool_size:
            raise ConfigError("fediod.pool_steps replays the pool: set fediod.pool_size > 0 too")

    @property
    def needs_label_counts(self) -> bool:
        return self.ensemble_weighting in ("eq8", "class-share")


#: What `preset = "official-code"` changes (notes §2.5-2.9): only keys the user did not set.
OFFICIAL_CODE = {
    "teachers": "resnet8-wide",
    "student": "resnet8-wide",
    "ensemble_weighting": "class-share",
    "mimic": "kl-official",
    "js": "official",
    "w_unique": 5.0,
    "w_adv": 0.2,
    "w_balance": 10.0,
    "balance": "teachers",
    "lr_generator": 1e-4,
    "lr_discriminator": 1e-4,
    "lr_student": 5e-3,
    "student_optimizer": "sgd",
    "iters_per_epoch": "max",
    "selection": "best-on-test",
}


def resolve_options(config: RunConfig, options: FedIODOptions) -> FedIODOptions:
    if options.preset != "official-code":
        return options
    explicit = set(config.options.get("fediod", {}))
    return dataclasses.replace(options, **{k: v for k, v in OFFICIAL_CODE.items() if k not in explicit})


def teacher_name(options: FedIODOptions, config: RunConfig, client_id: int) -> str:
    names = model_cycle(options.teachers, config.model, key="fediod.teachers")
    return names[client_id % len(names)]


def cosine_lr(base: float, step: int, total: int, schedule: str) -> float:
    if schedule == "constant" or total <= 0:
        return base
    return 0.5 * base * (1.0 + math.cos(math.pi * min(step, total) / total))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


# ------------------------------------------------------------------------------------------------
# Client
# ------------------------------------------------------------------------------------------------
class FedIODClient(ClientLogic):
    """One site: trains T_k once, then answers the server's queries with its frozen T_k and D_k."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options = resolve_options(ctx.config, ctx.options)
        self.teacher = new_model(ctx.config, ctx.info, teacher_name(self.options, ctx.config, ctx.client_id))
        self.discriminator = seeded(
            ctx.config.seed,
            lambda: build_discriminator(ctx.info, width=self.options.discriminator_width),
            "discriminator-init",
        )
        self.d_optimizer = torch.optim.Adam(
            self.discriminator.parameters(), lr=self.options.lr_discriminator, betas=(0.5, 0.999)
        )
        self.real_mean = 0.5  # running E_{x' in X'_k}[D_k(x')], refreshed at every D-step
        self.pending: tuple[torch.Tensor, ...] | None = None  # (x, T_k(x), local loss) of this G-step
        self.pending_inputs: dict[str, Any] = {}  # what rebuilds `pending` in another process
        self.student = new_model(ctx.config, ctx.info, self.options.student or ctx.config.model)
        self.student_specs = state_specs(self.student.state_dict())
        self.budget = ClientBudget(self.options.dp, ctx.client_id) if self.options.dp_enabled else None

    # --- stage 1 -------------------------------------------------------------------------------
    @handles("train")
    def train(self, message: Message) -> Message:
        config = self.ctx.config
        spec = dataclasses.replace(
            LocalTraining.from_config(config, self.ctx.info), epochs=self.options.teacher_epochs, steps=0
        )
        generator = torch_generator(config.seed, "teacher-training", self.ctx.client_id)
        architecture = teacher_name(self.options, config, self.ctx.client_id)
        metrics = trained_once(
            self.teacher,
            self.ctx,
            architecture,
            spec,
            lambda: train_local(self.teacher, self.ctx.train, self.ctx.info, spec, generator),
            purpose="teacher",
        )
        self.teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        metrics["num_samples"] = len(self.ctx.train)
        val = evaluate_model(self.teacher, self.ctx.val, self.ctx.info)
        metrics["teacher_val_accuracy"] = val["accuracy"] if val["count"] else -1.0
        arrays = {}
        if message.scalar("config", "send_label_counts", False):
            counts = torch.bincount(self.ctx.train.y, minlength=self.ctx.info.num_classes)
            arrays["label-statistics"] = {"class_counts": counts.to(torch.int64)}
        return Message.build("train", arrays=arrays, scalars={"metrics": metrics})

    # --- stage 2: one G-step ---------------------------------------------------------------------
    def _real_batch(self, step: int, size: int) -> torch.Tensor:
        generator = torch_generator(self.ctx.config.seed, "real-batch", self.ctx.client_id, step)
        n = len(self.ctx.train)
        index = torch.randperm(n, generator=generator)[: min(size, n)]
        return to_float(self.ctx.train.x[index], self.ctx.info)

    def _density_ratio(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 8's D_k(x) / E[D_k(x')] for S-step inputs. D_k's BatchNorm runs on batch statistics;
        its running statistics are scored on copies, so answering leaves the client state as it was."""
        buffers = {name: b.clone() for name, b in self.discriminator.named_buffers()}
        with torch.no_grad():
            scores = functional_call(
                self.discriminator, (dict(self.discriminator.named_parameters()), buffers), (x,)
            )
        return L.density_ratio(L.patch_scores(scores), self.real_mean)

    @handles("query.generate")
    def generate(self, message: Message) -> Message:
        carried = "student_x" in message.arrays.get("synthetic-inputs", {})
        specs = {"x": self._input_spec()} | ({"student_x": self._input_spec()} if carried else {})
        expect_arrays(message, "synthetic-inputs", specs)
        step = int(message.scalar("config", "step"))
        x = message.tensor("synthetic-inputs", "x")
        dp_metrics: dict[str, float] = {}
        if self.budget is not None:  # the step's privacy first: a refused step touches no data
            try:
                dp_metrics = self._spend(x.shape[0], int(message.scalar("config", "total_steps")))
            except PrivacyBudgetExceeded as exc:
                return refusal("query.generate", exc, self.budget.epsilon())
        # the previous step's S-step targets first: with D_k as it was before this step's D-step
        student = (
            self._student_answer(
                message.tensor("synthetic-inputs", "student_x"), bool(message.scalar("config", "want_ratio"))
            )
            if carried
            else {}
        )
        # (1) D-step on (x, a batch of this site's data)
        set_lr(self.d_optimizer, float(message.scalar("config", "lr_discriminator")))
        real = self._real_batch(step, x.shape[0])
        real_logits = self.discriminator(real)
        d_loss = L.discriminator_loss(real_logits, self.discriminator(x))
        self.d_optimizer.zero_grad(set_to_none=True)
        d_loss.backward()
        self.d_optimizer.step()
        # E_{x' in X'_k}[D_k(x')] of Eq. 8, from this step's real batch (scored before the update)
        self.real_mean = float(L.patch_scores(real_logits.detach()).mean())
        # (2) the terms this site computes alone, and their gradient with respect to x
        self.pending_inputs = {
            "x": x.detach().clone(),
            "step": step,
            **{key: message.scalar("config", key) for key in ("c_gan", "c_conf", "tau", "gan_loss")},
            "c_bn": float(message.scalar("config", "c_bn", 0.0)),
        }
        x, logits, fake_logits, local, gan, conf = self._local_terms(self.pending_inputs)
        # keep the graph: query.backprop differentiates the local terms and the server's terms together
        self.pending = (x, logits, local)
        ratio = L.density_ratio(L.patch_scores(fake_logits.detach()), self.real_mean)
        arrays: dict[str, dict[str, torch.Tensor]] = {
            "logits": {"z": logits.detach()},
            "discriminator-outputs": {"ratio": ratio},
        }
        for kind, named in student.items():
            arrays[kind].update({f"student_{name}": value for name, value in named.items()})
        # with DP on, the loss on the real batch stays here (it is not sanitised)
        metrics = {"gan_loss": gan.item(), "entropy": conf.item()}
        metrics |= {"d_loss": d_loss.item()} if self.budget is None else dp_metrics
        return Message.build("query.generate", arrays=arrays, scalars={"metrics": metrics})

    def _spend(self, batch: int, planned_steps: int) -> dict[str, float]:
        """Record this G-step on the accountant (refusing it past the target); see the module docstring."""
        assert self.budget is not None
        n = len(self.ctx.train)
        if self.options.dp_accounting == "d-step":
            rate, scale = min(batch, n) / n, 1.0
        else:  # release: B per-sample gradients, each may move by 2C: L2 sensitivity 2C sqrt(B)
            rate, scale = 1.0, 2.0 * math.sqrt(batch)
        noise = self.budget.noise_multiplier(rate, planned_steps, scale)
        epsilon = self.budget.spend(noise / scale, rate)
        return {"epsilon": epsilon, "noise_multiplier": noise}

    def _local_terms(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        """pi_k L_gan^k + pi_k H(T_k(x)) (+ pi_k w_bn L_bn(T_k, x)) on the current D_k, with the graph
        back to x."""
        x = inputs["x"].clone().requires_grad_(True)
        c_bn = float(inputs.get("c_bn", 0.0))
        with batchnorm_statistics_loss(self.teacher if c_bn else nn.Identity()) as bn_terms:
            logits = self.teacher(x)
        fake_logits = self.discriminator(x)
        gan = L.generator_gan_loss(fake_logits, mode=str(inputs["gan_loss"]))
        conf = L.entropy(logits, float(inputs["tau"])).mean()
        local = float(inputs["c_gan"]) * gan + float(inputs["c_conf"]) * conf
        if bn_terms:
            local = local + c_bn * torch.stack(bn_terms).sum()
        return x, logits, fake_logits, local, gan, conf

    @handles("query.backprop")
    def backprop(self, message: Message) -> Message:
        if self.pending is None and self.pending_inputs:
            # this process did not answer query.generate (a Flower deployment starts one process per
            # message): rebuild the same graph from the saved inputs and the saved D_k
            x, logits, _, local, _, _ = self._local_terms(self.pending_inputs)
            self.pending = (x, logits, local)
        if self.pending is None:
            raise FederationError("query.backprop arrived before query.generate")
        x, logits, local = self.pending
        expect_arrays(message, "output-gradients", {"z": ArraySpec("float32", tuple(logits.shape))})
        # d/dx [local terms + <dL_server/dz_k, T_k(x)>]: one backward pass through T_k and D_k
        linearised = local + (logits * message.tensor("output-gradients", "z")).sum()
        (grad,) = torch.autograd.grad(linearised, x)
        if self.budget is not None:  # the sanitisation point: every per-sample gradient that leaves
            assert self.budget.noise is not None
            noise = torch_generator(
                self.ctx.config.seed, "dp-input-gradients", self.ctx.client_id, self.pending_inputs["step"]
            )
            grad = sanitize_per_sample(grad, self.options.dp_clip_norm, self.budget.noise, noise)
        self.pending, self.pending_inputs = None, {}
        return Message.build("query.backprop", arrays={"input-gradients": {"x": grad}})

    # --- stage 2: the S-steps ---------------------------------------------------------------------
    @handles("query.student", read_only=True)
    def student_targets(self, message: Message) -> Message:
        expect_arrays(message, "synthetic-inputs", {"x": self._input_spec()})
        answer = self._student_answer(
            message.tensor("synthetic-inputs", "x"), bool(message.scalar("config", "want_ratio", False))
        )
        return Message.build("query.student", arrays=answer)

    def _student_answer(self, x: torch.Tensor, want_ratio: bool) -> dict[str, dict[str, torch.Tensor]]:
        with torch.no_grad():
            logits = self.teacher(x)
        arrays: dict[str, dict[str, torch.Tensor]] = {"logits": {"z": logits}}
        if want_ratio:
            arrays["discriminator-outputs"] = {"ratio": self._density_ratio(x)}
        return arrays

    # --- evaluation ------------------------------------------------------------------------------
    @handles("evaluate.student", read_only=True)
    def evaluate_student(self, message: Message) -> Message:
        expect_arrays(message, "parameters", self.student_specs)
        self.student.load_state_dict(message.tensors("parameters"))
        val = evaluate_model(self.student, self.ctx.val, self.ctx.info)
        return Message.build(
            "evaluate.student",
            scalars={
                "metrics": {
                    "val_accuracy": val["accuracy"] if val["count"] else 0.0,
                    "val_count": val["count"],
                }
            },
        )

    @handles("evaluate.teachers", read_only=True)
    def evaluate_teacher(self, message: Message) -> Message:
        """Evaluation only (not part of the protocol): the teacher's logits on the shared test set,
        so the report can state the standalone accuracies and the ensemble's one-shot ceiling."""
        x = to_float(self.ctx.global_test.x, self.ctx.info)
        with torch.no_grad():
            logits = torch.cat([self.teacher(chunk) for chunk in x.split(512)])
        return Message.build("evaluate.teachers", arrays={"logits": {"z": logits}})

    def _input_spec(self) -> ArraySpec:
        info = self.ctx.info
        return ArraySpec("float32", (None, info.channels, info.image_size, info.image_size))

    def state_dict(self) -> dict:
        return {
            "teacher": clone_state(self.teacher),
            "discriminator": clone_state(self.discriminator),
            "d_optimizer": self.d_optimizer.state_dict(),
            "real_mean": self.real_mean,
            "pending": dict(self.pending_inputs),  # between query.generate and query.backprop
            **({"dp": self.budget.state_dict()} if self.budget is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self.teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.discriminator.load_state_dict(state["discriminator"])
        self.d_optimizer.load_state_dict(state["d_optimizer"])
        self.real_mean = float(state["real_mean"])
        self.pending, self.pending_inputs = None, dict(state.get("pending") or {})
        if self.budget is not None and "dp" in state:
            self.budget.load_state_dict(state["dp"])


# ------------------------------------------------------------------------------------------------
# Server
# ------------------------------------------------------------------------------------------------
@dataclass
class Federation:
    """What the server learned in stage 1: client sizes and (if the weighting needs them) class counts."""

    clients: list[int]
    sizes: torch.Tensor  # (K,)
    counts: torch.Tensor | None  # (K, C)
    teacher_val: dict[int, float] = field(default_factory=dict)

    def pi(self, clients: list[int]) -> torch.Tensor:
        sizes = torch.stack([self.sizes[self.clients.index(c)] for c in clients])
        return sizes / sizes.sum()

    def share(self, clients: list[int], num_classes: int) -> torch.Tensor:
        if self.counts is None:
            return torch.full((len(clients), num_classes), 1.0 / len(clients))
        return L.class_share(torch.stack([self.counts[self.clients.index(c)] for c in clients]).float())


class FedIODServer(ServerLogic):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, info = ctx.config, ctx.info
        self.options = options = resolve_options(config, ctx.options)
        if options.selection == "validation" and config.val_fraction == 0:
            raise ConfigError(
                "fediod.selection = 'validation' needs validation splits: set val_fraction > 0 "
                "or fediod.selection = 'last'"
            )
        self.generator = seeded(
            config.seed,
            lambda: build_generator(info, latent_dim=options.latent_dim, width=options.generator_width),
            "generator-init",
        )
        self.student = new_model(config, info, options.student or config.model)
        self.g_optimizer = torch.optim.Adam(
            self.generator.parameters(), lr=options.lr_generator, betas=(0.5, 0.999)
        )
        if options.student_optimizer == "sgd":
            self.s_optimizer: torch.optim.Optimizer = torch.optim.SGD(
                self.student.parameters(), lr=options.lr_student, momentum=0.9, weight_decay=3e-5
            )
        else:
            self.s_optimizer = torch.optim.Adam(self.student.parameters(), lr=options.lr_student)
        self.federation: Federation | None = None
        self.iters = 0
        self.step = 0
        self.best: dict[str, Any] = {"score": -1.0, "epoch": 0, "state": None}
        self.reference: dict[str, float] = {}
        self.last_coverage: dict[str, Any] = {}
        self.carried: tuple[torch.Tensor, float] | None = None  # S-step inputs and lr, merged mode
        self.epsilons: dict[int, float] = {}  # each client's latest reported epsilon (DP runs)
        self.pool = SyntheticPool(options.pool_size)
        if options.dp_enabled:
            log.info(
                "FedIOD with DP: input-gradients clipped to %g, accounting %r at delta %g; logits, density "
                "ratios and stage 1 are not covered (see the fediod module docstring)",
                options.dp_clip_norm,
                options.dp_accounting,
                options.dp_delta,
            )

    # --- stage 1 ---------------------------------------------------------------------------------
    def setup(self, fleet: Fleet) -> None:
        config, options = self.ctx.config, self.options
        request = Message.build(
            "train", scalars={"config": {"send_label_counts": options.needs_label_counts}}
        )
        counts_spec = {"class_counts": ArraySpec("int64", (self.ctx.info.num_classes,))}
        expect = ReplySpec(
            {"label-statistics": counts_spec} if options.needs_label_counts else {},
            (*TRAIN_METRICS, "teacher_val_accuracy"),
        )
        replies = successful(
            fleet.broadcast(request, timeout=config.timeout or None, expect=expect),
            minimum=min(config.min_clients, len(fleet.clients)),
            what="trained teachers",
        )
        clients = sorted(replies)
        sizes = torch.tensor([float(replies[c].scalar("metrics", "num_samples")) for c in clients])
        if float(sizes.sum()) <= 0:
            raise FederationError("every teacher reports 0 training samples; FedIOD cannot weight them")
        counts = None
        if options.needs_label_counts:
            counts = torch.stack([replies[c].tensor("label-statistics", "class_counts") for c in clients])
        self.federation = Federation(
            clients,
            sizes,
            counts,
            {c: float(replies[c].scalar("metrics", "teacher_val_accuracy")) for c in clients},
        )
        per_client = [math.ceil(float(s) / options.synthetic_batch_size) for s in sizes]
        if options.iters_per_epoch == "max":
            self.iters = max(per_client)
        elif options.iters_per_epoch == "min":
            self.iters = min(per_client)
        else:
            self.iters = int(options.iters_per_epoch)
        self.reference = self._teacher_report(fleet)
        # how many teachers came from their site's stage-1 cache (algorithms/stage1.py) instead of training
        self.reference["teachers_from_cache"] = float(
            sum(float(replies[c].scalar("metrics", "stage1_cached", 0.0)) for c in clients)
        )
        log.info(
            "FedIOD stage 1 done: %d teachers, %d G-steps per epoch; %s",
            len(clients),
            self.iters,
            self.reference,
        )

    def _teacher_report(self, fleet: Fleet) -> dict[str, float]:
        """Standalone accuracies and the ensemble's accuracy (the one-shot ceiling), evaluation only."""
        assert self.federation is not None
        n, c = len(self._test_labels()), self.ctx.info.num_classes
        expect = ReplySpec({"logits": {"z": ArraySpec("float32", (n, c))}})
        replies = successful(
            fleet.broadcast(Message.build("evaluate.teachers"), self.federation.clients, expect=expect),
            what="teacher logits",
        )
        clients = sorted(replies)
        logits = torch.stack([replies[c].tensor("logits", "z") for c in clients])  # (K, N, C)
        labels = self._test_labels()
        acc = (logits.argmax(-1) == labels).float().mean(1)
        pi = self.federation.pi(clients)
        share = self.federation.share(clients, self.ctx.info.num_classes)
        shares = share[:, None, :].expand_as(logits)
        report = {
            "teacher_mean_accuracy": float(acc.mean()),
            "teacher_std_accuracy": float(acc.std(unbiased=False)),
            "ensemble_accuracy": float(
                (L.ensemble_logits(logits, shares).argmax(-1) == labels).float().mean()
            ),
            "ensemble_uniform_accuracy": float((logits.mean(0).argmax(-1) == labels).float().mean()),
            "ensemble_pi_accuracy": float(
                ((pi[:, None, None] * logits).sum(0).argmax(-1) == labels).float().mean()
            ),
        }
        return report

    def _test_labels(self) -> torch.Tensor:
        if self.ctx.test_labels is None:
            raise FederationError("FedIOD's teacher report needs the evaluation harness's test labels")
        return self.ctx.test_labels

    # --- stage 2 ---------------------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        return self.iters * self.ctx.config.rounds

    def _lrs(self) -> tuple[float, float, float]:
        o = self.options
        return tuple(
            cosine_lr(b, self.step, self.total_steps, o.schedule)
            for b in (o.lr_generator, o.lr_discriminator, o.lr_student)
        )  # type: ignore[return-value]

    def _weights(self, logits: torch.Tensor, ratio: torch.Tensor | None, clients: list[int]) -> torch.Tensor:
        assert self.federation is not None
        k, b, c = logits.shape
        if self.options.ensemble_weighting == "uniform":
            return L.uniform_weights(k, b, c)
        share = self.federation.share(clients, c)
        return L.importance_weights(share, ratio if self.options.ensemble_weighting == "eq8" else None)

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        values: dict[str, list[float]] = {}
        steps = tqdm(
            range(self.iters),
            desc=f"epoch {round} G-steps",
            leave=False,
            disable=not self.ctx.progress,
            file=sys.stderr,
        )
        try:
            for _ in steps:
                losses = self.distillation_step(fleet)
                for key, value in losses.items():
                    values.setdefault(key, []).append(value)
                student = values.get("loss_student", [float("nan")])[-1]
                steps.set_postfix(
                    mimic=f"{losses['loss_mimic']:.3f}", student=f"{student:.3f}",
                    d=f"{losses['loss_discriminator']:.3f}", gan=f"{losses['loss_gan']:.3f}",
                )  # fmt: skip
        except StopRun as stop:  # a client's privacy budget: report the partial epoch, then stop
            if self.carried is not None:  # the last completed G-step's S-steps (no data is touched)
                values.setdefault("loss_student", []).append(self._flush_student(fleet))
            totals = {key: float(np.mean(v)) for key, v in values.items()}
            raise StopRun(stop.reason, totals | self._privacy_metrics()) from None
        if self.carried is not None:  # the epoch's last S-steps, before evaluation and checkpoint
            values.setdefault("loss_student", []).append(self._flush_student(fleet))
        totals = {key: float(np.mean(v)) for key, v in values.items()}
        self._samples(round)
        coverage = {f"coverage_{k}": v for k, v in self.last_coverage.items() if isinstance(v, float | int)}
        return totals | coverage | self._privacy_metrics()

    def _privacy_metrics(self) -> dict[str, float]:
        """Each client's epsilon so far (DP runs; empty otherwise)."""
        return epsilon_summary(self.epsilons, self.options.dp_delta) if self.options.dp_enabled else {}

    def distillation_step(self, fleet: Fleet) -> dict[str, float]:
        assert self.federation is not None
        options, config = self.options, self.ctx.config
        lr_g, lr_d, lr_s = self._lrs()
        set_lr(self.g_optimizer, lr_g)
        set_lr(self.s_optimizer, lr_s)
        clients = self.federation.clients
        pi_all = self.federation.pi(clients)
        gan_weight = pi_all if options.gan_weighting == "pi" else torch.full_like(pi_all, 1.0 / len(clients))
        latent_gen = torch_generator(config.seed, "latent", self.step)
        self.generator.train()
        x = self.generator(self.generator.sample_latent(options.synthetic_batch_size, latent_gen))
        carried = self.carried
        inputs = {"x": x.detach()} if carried is None else {"x": x.detach(), "student_x": carried[0]}
        requests = {
            cid: Message.build(
                "query.generate",
                arrays={"synthetic-inputs": inputs},
                scalars={
                    "config": {
                        **({"want_ratio": self._want_ratio()} if carried is not None else {}),
                        "step": self.step,
                        "lr_discriminator": lr_d,
                        "c_gan": options.w_gan * float(gan_weight[i]),
                        "c_conf": options.w_conf * float(pi_all[i]) if options.use_conf else 0.0,
                        "tau": options.tau,
                        "gan_loss": options.gan_loss,
                        **({"c_bn": options.w_bn * float(pi_all[i])} if options.w_bn else {}),
                        **({"total_steps": self.total_steps} if options.dp_enabled else {}),
                    }
                },
            )
            for i, cid in enumerate(clients)
        }
        timeout = config.timeout or None
        b, c = options.synthetic_batch_size, self.ctx.info.num_classes
        logits_spec = {"z": ArraySpec("float32", (b, c))}
        ratio_spec = {"ratio": ArraySpec("float32", (b,))}
        if carried is not None:  # step t-1's S-step targets ride along
            logits_spec["student_z"] = ArraySpec("float32", (len(carried[0]), c))
            if self._want_ratio():
                ratio_spec["student_ratio"] = ArraySpec("float32", (len(carried[0]),))
        expect = ReplySpec({"logits": logits_spec, "discriminator-outputs": ratio_spec})
        sent = fleet.send(requests, step=self.step, timeout=timeout, expect=expect)
        self.epsilons.update(epsilons_of(sent))
        reason = refusal_reason(sent, f"G-step {self.step}")
        if reason is not None:
            raise StopRun(reason)
        replies = successful(sent, minimum=min(config.min_clients, len(clients)), what="generator queries")
        answered = sorted(replies)
        pi = self.federation.pi(answered)
        s_losses = []
        if carried is not None:  # step t-1's S-steps, at its learning rate, before this step's L_mimic
            set_lr(self.s_optimizer, carried[1])
            s_losses.append(self._student_update(carried[0], replies, "student_z", "student_ratio"))
            set_lr(self.s_optimizer, lr_s)
            self.carried = None
        logits = torch.stack([replies[cid].tensor("logits", "z") for cid in answered]).requires_grad_(True)
        ratio = torch.stack([replies[cid].tensor("discriminator-outputs", "ratio") for cid in answered])
        x_server = x.detach().requires_grad_(True)
        weights = self._weights(logits.detach(), ratio, answered)
        self.student.train()
        ensemble = L.ensemble_logits(logits, weights)
        mimic = L.mimic_loss(self.student(x_server), ensemble, mode=options.mimic, tau=options.tau)
        server_loss = -options.w_adv * mimic
        unique = torch.zeros(())
        if options.use_unique:
            unique = (
                L.unique_loss(logits, pi, options.tau)
                if options.js == "paper"
                else L.official_js_loss(logits, options.tau)
            )
            server_loss = server_loss + options.w_unique * unique
        if options.w_balance:
            if options.balance == "ensemble":
                balance = L.marginal_balance_loss(ensemble)
            else:
                balance = L.balance_loss(logits, pi)
            server_loss = server_loss + options.w_balance * balance
        grad_logits, grad_x = torch.autograd.grad(server_loss, [logits, x_server])
        back = successful(
            fleet.send(
                {
                    cid: Message.build("query.backprop", arrays={"output-gradients": {"z": grad_logits[i]}})
                    for i, cid in enumerate(answered)
                },
                step=self.step,
                timeout=timeout,
                expect=ReplySpec({"input-gradients": {"x": ArraySpec("float32", tuple(x.shape))}}),
            ),
            minimum=min(config.min_clients, len(answered)),
            what="input-gradients",
        )
        total = grad_x.clone()
        for reply in back.values():
            total += reply.tensor("input-gradients", "x")
        self.g_optimizer.zero_grad(set_to_none=True)
        x.backward(total)
        self.g_optimizer.step()
        if options.merge_student_queries:
            self.carried = (self._student_inputs(), lr_s)
        else:
            s_losses.append(self._student_steps(fleet, answered))
        self.step += 1

        def client_mean(name: str) -> float:  # nan when no client reports it (d_loss under DP)
            values = [
                float(r.scalar("metrics", name)) for r in replies.values() if name in r.scalars["metrics"]
            ]
            return float(np.mean(values)) if values else float("nan")

        return {
            "loss_mimic": mimic.item(),
            "loss_unique": unique.item(),
            **({"loss_student": s_losses[0]} if s_losses else {}),
            "loss_discriminator": client_mean("d_loss"),
            "loss_gan": client_mean("gan_loss"),
            "entropy": client_mean("entropy"),
        }

    def _want_ratio(self) -> bool:
        return self.options.ensemble_weighting == "eq8"

    def _student_inputs(self) -> torch.Tensor:
        n, b = self.options.student_steps, self.options.synthetic_batch_size
        latent_gen = torch_generator(self.ctx.config.seed, "student-latent", self.step)
        with torch.no_grad():
            return self.generator(self.generator.sample_latent(n * b, latent_gen))

    def _student_steps(self, fleet: Fleet, clients: list[int], xs: torch.Tensor | None = None) -> float:
        """One `query.student` exchange for the S-steps' targets, then the S-steps."""
        config = self.ctx.config
        xs = self._student_inputs() if xs is None else xs
        request = Message.build(
            "query.student",
            arrays={"synthetic-inputs": {"x": xs}},
            scalars={"config": {"want_ratio": self._want_ratio()}},
        )
        c = self.ctx.info.num_classes
        arrays = {"logits": {"z": ArraySpec("float32", (len(xs), c))}}
        if self._want_ratio():
            arrays["discriminator-outputs"] = {"ratio": ArraySpec("float32", (len(xs),))}
        replies = successful(
            fleet.broadcast(
                request, clients, step=self.step, timeout=config.timeout or None, expect=ReplySpec(arrays)
            ),
            minimum=min(config.min_clients, len(clients)),
            what="student targets",
        )
        return self._student_update(xs, replies, "z", "ratio")

    def _flush_student(self, fleet: Fleet) -> float:
        assert self.carried is not None and self.federation is not None
        xs, lr = self.carried
        self.carried = None
        set_lr(self.s_optimizer, lr)
        return self._student_steps(fleet, self.federation.clients, xs)

    def _student_update(
        self, xs: torch.Tensor, replies: dict[int, Message], z_name: str, ratio_name: str
    ) -> float:
        """The S-steps on L_mimic against the weighted ensemble of the clients' logits on `xs`."""
        options = self.options
        n, b = options.student_steps, options.synthetic_batch_size
        answered = sorted(replies)
        logits = torch.stack([replies[cid].tensor("logits", z_name) for cid in answered])
        ratio = (
            torch.stack([replies[cid].tensor("discriminator-outputs", ratio_name) for cid in answered])
            if self._want_ratio()
            else None
        )
        targets = L.ensemble_logits(logits, self._weights(logits, ratio, answered))
        self.last_coverage = class_coverage(targets)
        self.last_coverage["adapted_is"] = adapted_inception_score(logits)
        self.student.train()
        losses = []
        for j in range(n):
            part = slice(j * b, (j + 1) * b)
            loss = L.mimic_loss(self.student(xs[part]), targets[part], mode=options.mimic, tau=options.tau)
            if not torch.isfinite(loss):
                raise FederationError(
                    f"the student's loss is {float(loss)} at step {self.step}; lower fediod.lr_student"
                )
            self.s_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.s_optimizer.step()
            losses.append(loss.item())
        if options.pool_size:
            self.pool.add(xs, targets)
            self._replay()
        return float(np.mean(losses))

    def _replay(self) -> None:
        """`pool_steps` S-steps on batches of earlier synthetic samples and their ensemble targets: the
        student keeps fitting what G has left behind while G moves on (no new query to any client)."""
        options = self.options
        rng = torch_generator(self.ctx.config.seed, "pool", self.step)
        for _ in range(options.pool_steps):
            x, target = self.pool.sample(options.synthetic_batch_size, rng)
            loss = L.mimic_loss(self.student(x), target, mode=options.mimic, tau=options.tau)
            self.s_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.s_optimizer.step()

    def _samples(self, epoch: int) -> None:
        if self.last_coverage.get("max_share", 0.0) > self.options.collapse_share:
            log.warning(
                "epoch %d: generator collapse? one class takes %.0f%% of the samples",
                epoch,
                100 * self.last_coverage["max_share"],
            )
        every = self.options.samples_every
        if not every or epoch % every or self.ctx.run_dir is None:
            return
        with torch.no_grad():
            self.generator.eval()
            images = self.generator.forward_unit(
                self.generator.sample_latent(32, torch_generator(self.ctx.config.seed, "samples"))
            )
            self.generator.train()
        plot_image_grid(
            images.numpy(),
            self.ctx.run_dir / "plots" / f"synthetic_epoch_{epoch:04d}.png",
            title=f"G samples, epoch {epoch}",
        )

    # --- evaluation and model selection ----------------------------------------------------------
    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        test = self.ctx.evaluate(self.student)
        metrics = {"test_accuracy": test["accuracy"], "test_loss": test["loss"]}
        selection = self.options.selection
        if selection == "validation":
            request = Message.build("evaluate.student", arrays={"parameters": self.student.state_dict()})
            expect = ReplySpec(metrics=("val_accuracy", "val_count"))
            replies = successful(
                fleet.broadcast(request, timeout=self.ctx.config.timeout or None, expect=expect),
                what="validation metrics",
            )
            counts = np.array([float(r.scalar("metrics", "val_count")) for r in replies.values()])
            accs = np.array([float(r.scalar("metrics", "val_accuracy")) for r in replies.values()])
            score = float(np.average(accs, weights=counts)) if counts.sum() > 0 else 0.0
            metrics["val_accuracy"] = score
        elif selection == "best-on-test":
            score = test["accuracy"]
        else:
            score = float(round)
        if score > self.best["score"]:
            self.best = {"score": score, "epoch": round, "state": clone_state(self.student)}
        return metrics

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        final = dict(last)
        if self.best["state"] is not None:
            self.student.load_state_dict(self.best["state"])
            test = self.ctx.evaluate(self.student)
            final |= {
                "test_accuracy": test["accuracy"],
                "test_loss": test["loss"],
                "selected_epoch": self.best["epoch"],
            }
        final["selection"] = {
            "validation": "best on the clients' validation splits",
            "last": "last epoch",
            "best-on-test": "best on the TEST set (official-code preset; not a valid protocol)",
        }[self.options.selection]
        final |= self.reference
        if self.options.dp_enabled:
            final |= self._privacy_metrics() | {"dp_accounting": self.options.dp_accounting}
        if self.reference.get("ensemble_accuracy"):
            final["fraction_of_ensemble"] = final["test_accuracy"] / self.reference["ensemble_accuracy"]
        return final

    def models(self) -> dict[str, nn.Module]:
        return {"student": self.student, "generator": self.generator}

    def state_dict(self) -> dict:
        assert self.federation is not None
        f = self.federation
        return {
            "generator": clone_state(self.generator),
            "student": clone_state(self.student),
            "g_optimizer": self.g_optimizer.state_dict(),
            "s_optimizer": self.s_optimizer.state_dict(),
            "step": self.step,
            "iters": self.iters,
            "best": self.best,
            "reference": self.reference,
            "epsilons": {str(k): v for k, v in self.epsilons.items()},
            "pool": self.pool.state_dict(),
            "federation": {
                "clients": f.clients,
                "sizes": f.sizes,
                "counts": f.counts,
                "teacher_val": {str(k): v for k, v in f.teacher_val.items()},
            },
        }

    def load_state_dict(self, state: dict) -> None:
        self.generator.load_state_dict(state["generator"])
        self.student.load_state_dict(state["student"])
        self.g_optimizer.load_state_dict(state["g_optimizer"])
        self.s_optimizer.load_state_dict(state["s_optimizer"])
        self.step, self.iters = int(state["step"]), int(state["iters"])
        self.best, self.reference = state["best"], dict(state["reference"])
        self.epsilons = {int(k): float(v) for k, v in state.get("epsilons", {}).items()}
        self.pool.load_state_dict(state.get("pool", {}))
        f = state["federation"]
        self.federation = Federation(
            list(f["clients"]), f["sizes"], f["counts"], {int(k): v for k, v in f["teacher_val"].items()}
        )


register(
    Algorithm(
        "fediod",
        "FedIOD: one-shot data-free input+output distillation (no client sends parameters)",
        FedIODClient,
        FedIODServer,
        FedIODOptions,
    )
)
