"""FedDF (Lin et al. 2020, "Ensemble Distillation for Robust Model Fusion in Federated Learning").

Round t (Algorithms 1 and 3 of the paper):

1. server -> sampled clients `train`: the current model of the client's architecture group.
   Each client trains it locally (as in FedAvg) and returns its parameters and sample count.
2. The server (optionally) drops the received models that predict at random on its validation
   split (`drop_worst`), then, per architecture group, averages that group's models: the student
   initialisation.
3. Each group's student is distilled from the ensemble of ALL received models (every architecture)
   on unlabeled server-side inputs (`source`): Adam with a cosine schedule, gradient clipping,
   validation every `eval_every_steps` steps, early stopping after `patience` evaluations without
   improvement, and the best-on-validation student is kept. It goes back to that group next round.

Defaults follow the released code where the paper is silent (notes section 3): AVGLOGITS with
temperature 1 and no T^2 factor, Adam 1e-3, clipping at 5, batch 64. Two defaults are scaled for a
CPU and say so: `steps` = 500 (the paper: 10^4, early stop after 10^3) and `source` = `noise` (the
paper distils on another real dataset, e.g. CIFAR-100 for CIFAR-10; noise is its worst case, chosen
here only because it needs no files; use `dataset:fashion-mnist` for MNIST-size federations).

The student initialisation weights client models by sample count, as Algorithm 1 line 6 says; the
released code averages uniformly (`weighting = "uniform"`). Drop-worst (off by default) removes models
before both the averaging and the ensemble, as the paper says; its `weighted` variant weighs the
ensemble by validation accuracy, not the average. A group none of whose clients answered this round
starts from its previous model and is still distilled from this round's ensemble.

Measured on non-IID digits (5 clients, alpha 0.1, 5 local epochs, seed 0, 4 rounds, test accuracy):
with BatchNorm models (lenet-fedmdcg) FedAvg 67.2%, FedDF on noise 17.5% and on Fashion-MNIST 62.8%,
because the student's BatchNorm statistics follow the distillation data (`student_bn = "adapt"`, the
released code); with them frozen (`student_bn = "frozen"`, hence the default) 71.7% and 70.0%.
Without BatchNorm (mlp) FedDF on noise beats FedAvg by 12-16 points (see the tests).

Text (AG News, SST-2; token ids and a DistilBERT): `source = "holdout"` is the paper's protocol (Figure
3): with `val_fraction = 0.5` the clients fine-tune on half of the training set and the server distils
on the other half's texts without their labels, keeping `holdout_val_share` of them (default 2%: 1% of
the training set, the paper's SST-2 validation split) labelled for model selection. `dataset:<another
text dataset>` works too; noise and generators, which make images, are refused for text. The
student's dropout, like every random draw, follows the run seed (`global_rng` per step), so a resumed
run is exact.

Binary clients (FedDF Table 4): with `fuse_precision = "full"` a group of binary models (resnet8-binary)
starts from the average of their latent float weights and is distilled as the full-precision network
of those weights (real convolutions, models/binary.py `full_precision`); the result goes back as the
clients' latent weights, which they binarize again. Summaries then also report
`test_accuracy_full_precision` (the fused network) beside `test_accuracy` (as the clients compute).

Differential privacy: the ``dp_*`` options clip and noise each client's update exactly as for FedAvg
(user-level, at the client; see `fedistill.algorithms.fedavg`). The ensemble the server distils is
then made of the noisy models, and each client's epsilon is in the run's summary.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedistill import devices
from fedistill.algorithms.base import (
    TEXT_TASKS,
    Algorithm,
    ClientContext,
    ServerContext,
    ServerLogic,
    clone_state,
    model_cycle,
    register,
)
from fedistill.algorithms.distillation_data import (
    DistillationSource,
    build_source,
    parse_source,
    split_holdout,
)
from fedistill.algorithms.drop_worst import accuracy, drop_worst_weights, predict_logits
from fedistill.algorithms.fedavg import (
    FedAvgClient,
    PrivacyReport,
    mean_metric,
    sample_clients,
    sampling_rate,
)
from fedistill.algorithms.option_checks import check_choices
from fedistill.algorithms.training import average_states, evaluate_model, new_model
from fedistill.errors import ConfigError, FederationError
from fedistill.experiment.config import RunConfig
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message, state_specs
from fedistill.federation.reply_spec import LOCAL_METRICS, TRAIN_METRICS, ReplySpec
from fedistill.models.binary import full_precision, has_binary_layers
from fedistill.privacy.budget import DPOptions
from fedistill.seeding import derive_seed, global_rng, torch_generator

log = logging.getLogger(__name__)

LOSSES = ("avg-logits", "avg-probs", "avg-losses")
DROP_WORST = ("off", "drop", "weighted")


@dataclass(frozen=True)
class FedDFOptions(DPOptions):
    """`[feddf]` options. Local training uses the common keys (lr, local_epochs, batch_size, ...).

    The ``dp_*`` options (`DPOptions`) clip and noise each client's update, as for FedAvg.
    """

    groups: str = ""  # comma list of model names cycled over clients (client k: k % len); "" = `model`
    source: str = "noise"  # noise | holdout | dataset:<name> | generator:<path to .safetensors>
    source_size: int = 10000  # images drawn from a `dataset:` source (<= 0: all of its training images)
    holdout_val_share: float = 0.02  # holdout: the held-out share kept labelled to validate on
    generator_upsample: str = "bilinear"  # a `generator:` source's second upsampling (FedIOD: bilinear)
    steps: int = 500  # distillation steps per group and round (the paper: 10^4)
    distill_batch_size: int = 64  # the README runs' 64
    distill_lr: float = 1e-3
    distill_optimizer: str = "adam"  # adam (the paper) | sgd (momentum 0.9, same schedule: its Table 7)
    schedule: str = "cosine"  # cosine (annealed to 0 over `steps`) | constant
    loss: str = "avg-logits"  # avg-logits (AVGLOGITS, the paper) | avg-probs | avg-losses
    temperature: float = 1.0
    t_squared: bool = False  # multiply the KL by T^2 (Hinton et al.); the released code does not
    clip_grad_norm: float = 5.0  # 0: no clipping
    eval_every_steps: int = 50  # the code: 100
    patience: int = 4  # evaluations without improvement before stopping (the code: 1000 steps = 10)
    # True: the averaged model itself competes for "best" (the code's return_best_model_on_val, off there)
    fallback_to_average: bool = False
    # frozen: BatchNorm layers stay in eval mode and keep the averaged clients' statistics (measured
    # better, see the module docstring); adapt: they follow the distillation data (the released code).
    student_bn: str = "frozen"
    # False: no distillation, each group's average goes back as it is (per-group FedAvg, the baseline
    # FedDF's heterogeneous experiments compare against)
    distill: bool = True
    drop_worst: str = "off"  # off | drop | weighted (ensemble weights proportional to validation accuracy)
    weighting: str = "samples"  # student initialisation: samples (Algorithm 1) | uniform (the code)
    # model: each group's student computes as its clients' model does; full: groups of binary models
    # (resnet8-binary) are distilled into the full-precision network of their latent weights, which goes
    # back to the clients to be binarized again (FedDF Table 4)
    fuse_precision: str = "model"
    # average: each round's student starts from the average of its group's received models (Algorithm 1);
    # previous: from the group's fused model of the previous round (the paper's Table 5 ablation)
    student_init: str = "average"
    prox_mu: float = 0.0  # FedProx's proximal term in the clients' local training (the paper's Table 8)

    def validate(self) -> None:
        self.validate_dp()
        choices = {
            "loss": LOSSES,
            "drop_worst": DROP_WORST,
            "weighting": ("samples", "uniform"),
            "schedule": ("cosine", "constant"),
            "generator_upsample": ("bilinear", "nearest"),
            "student_bn": ("adapt", "frozen"),
            "fuse_precision": ("model", "full"),
            "student_init": ("average", "previous"),
            "distill_optimizer": ("adam", "sgd"),
        }
        check_choices("feddf", self, choices)
        parse_source(self.source)
        for key in ("steps", "distill_batch_size", "eval_every_steps", "patience"):
            if getattr(self, key) < 1:
                raise ConfigError(f"feddf.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("distill_lr", "temperature"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"feddf.{key} must be > 0, got {getattr(self, key)}")
        if not self.prox_mu >= 0:
            raise ConfigError(f"feddf.prox_mu must be >= 0, got {self.prox_mu}")
        if self.clip_grad_norm < 0:
            raise ConfigError(f"feddf.clip_grad_norm must be >= 0 (0: off), got {self.clip_grad_norm}")
        if not 0 < self.holdout_val_share < 1:
            raise ConfigError(f"feddf.holdout_val_share must be in (0, 1), got {self.holdout_val_share}")


def group_names(options: FedDFOptions, config: RunConfig) -> list[str]:
    """The per-client cycle of model names, as given (a name may repeat to weight the cycle)."""
    return model_cycle(options.groups, config.model, key="feddf.groups")


def group_of(options: FedDFOptions, config: RunConfig, client_id: int) -> str:
    names = group_names(options, config)
    return names[client_id % len(names)]


# ------------------------------------------------------------------------------------------------
# The fusion: ensemble distillation
# ------------------------------------------------------------------------------------------------
def ensemble_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    weights: torch.Tensor,
    *,
    mode: str = "avg-logits",
    temperature: float = 1.0,
    t_squared: bool = False,
) -> torch.Tensor:
    """KL(target || softmax(student / T)), batch mean, for teacher logits (K, B, C) and weights (K,).

    avg-logits: target = softmax(sum_k w_k z_k / T) (AVGLOGITS). avg-probs: target = sum_k w_k
    softmax(z_k / T) (the released code applies T to the student only here; at T = 1 they agree).
    avg-losses: sum_k w_k KL(softmax(z_k / T) || softmax(student / T)).
    """
    log_student = F.log_softmax(student_logits / temperature, dim=-1)
    w = weights.to(teacher_logits.dtype).view(-1, 1, 1)
    if mode == "avg-logits":
        target = F.softmax((w * teacher_logits).sum(0) / temperature, dim=-1)
        loss = F.kl_div(log_student, target, reduction="batchmean")
    elif mode == "avg-probs":
        target = (w * F.softmax(teacher_logits / temperature, dim=-1)).sum(0)
        loss = F.kl_div(log_student, target, reduction="batchmean")
    elif mode == "avg-losses":
        targets = F.softmax(teacher_logits / temperature, dim=-1)
        loss = sum(
            float(w[k]) * F.kl_div(log_student, targets[k], reduction="batchmean")
            for k in range(teacher_logits.shape[0])
        )
    else:
        raise ConfigError(f"unknown FedDF loss {mode!r}; choose one of {', '.join(LOSSES)}")
    return loss * temperature**2 if t_squared else loss  # type: ignore[return-value]


@dataclass
class DistillationReport:
    """What one distillation did: evaluations as (step, validation accuracy); step 0 is the start."""

    steps: int = 0
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    selected_step: int = -1  # the step whose student was kept (0: the averaged model itself)
    selected_accuracy: float = float("nan")
    stopped_early: bool = False
    losses: list[float] = field(default_factory=list)


def distill(
    student: nn.Module,
    teachers: Sequence[nn.Module],
    weights: Sequence[float],
    source: DistillationSource,
    validate: Callable[[nn.Module], float],
    options: FedDFOptions,
    generator: torch.Generator,
) -> DistillationReport:
    """Distil the weighted ensemble of `teachers` into `student` in place; leave the best-on-validation
    student in it (the averaged start competes only with `fallback_to_average`). Teachers run in eval
    mode; the student in train mode with its BatchNorm layers frozen by default (`student_bn =
    "adapt"`, the released code, lets their statistics follow the distillation data). The last step
    is always evaluated."""
    if not teachers:
        raise FederationError("FedDF has no teacher to distil from (every received model was dropped)")
    for teacher in teachers:
        teacher.eval()
    w = torch.tensor(list(weights), dtype=torch.float32, device=devices.current())
    w = w / w.sum()
    if options.distill_optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            student.parameters(), lr=options.distill_lr, momentum=0.9
        )
    else:
        optimizer = torch.optim.Adam(student.parameters(), lr=options.distill_lr)
    report = DistillationReport()
    start = validate(student)
    report.evaluations.append((0, start))
    best_accuracy, best_state = (start, clone_state(student)) if options.fallback_to_average else (-1.0, None)
    best_step, since_best = 0, 0
    for step in range(1, options.steps + 1):
        _train_mode(student, options.student_bn)
        if options.schedule == "cosine":
            lr = 0.5 * options.distill_lr * (1.0 + math.cos(math.pi * (step - 1) / options.steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
        x = source.batch(options.distill_batch_size, generator)
        with torch.no_grad():
            targets = torch.stack([teacher(x) for teacher in teachers])
        with global_rng(derive_seed(generator.initial_seed(), "student-dropout", step)):
            outputs = student(x)
        loss = ensemble_loss(
            outputs,
            targets,
            w,
            mode=options.loss,
            temperature=options.temperature,
            t_squared=options.t_squared,
        )
        if not torch.isfinite(loss):
            raise FederationError(
                f"FedDF's distillation loss is {float(loss)} at step {step}; lower feddf.distill_lr"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if options.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(student.parameters(), options.clip_grad_norm)
        optimizer.step()
        report.losses.append(loss.item())
        report.steps = step
        if step % options.eval_every_steps and step != options.steps:
            continue
        score = validate(student)
        report.evaluations.append((step, score))
        if score > best_accuracy:
            best_accuracy, best_state, best_step, since_best = score, clone_state(student), step, 0
        else:
            since_best += 1
            if since_best >= options.patience:
                report.stopped_early = step < options.steps
                break
    if best_state is not None:
        student.load_state_dict(best_state)
    report.selected_step, report.selected_accuracy = best_step, best_accuracy
    return report


def _train_mode(student: nn.Module, bn: str) -> None:
    """Train mode; with `bn = "frozen"` the BatchNorm layers stay in eval mode (running statistics)."""
    student.train()
    if bn == "frozen":
        for module in student.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()


# ------------------------------------------------------------------------------------------------
# Client: FedAvg's local training, on the model of its architecture group
# ------------------------------------------------------------------------------------------------
class FedDFClient(FedAvgClient):
    """Trains the received model of its group on private data and returns the trained parameters."""

    def __init__(self, ctx: ClientContext) -> None:
        super().__init__(ctx, model_name=group_of(ctx.options, ctx.config, ctx.client_id))


# ------------------------------------------------------------------------------------------------
# Server
# ------------------------------------------------------------------------------------------------
class FedDFServer(ServerLogic):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, info = ctx.config, ctx.info
        self.options: FedDFOptions = ctx.options
        if ctx.validation is None or len(ctx.validation) == 0:
            raise ConfigError(
                "feddf needs the server's validation split (model selection and early stopping): "
                "set val_fraction > 0"
            )
        self.validation = ctx.validation
        kind, argument = parse_source(self.options.source)
        held_out = None  # holdout: part of the held-out split stays labelled, the rest is distilled on
        if kind == "holdout":
            share = self.options.holdout_val_share
            self.validation, held_out = split_holdout(ctx.validation, share, config.seed)
        if kind == "dataset" and argument.strip().lower() == config.dataset.strip().lower():
            raise ConfigError(
                f"feddf.source = {self.options.source!r} is the federation's own dataset: the server "
                "would hold the clients' training images. Use another dataset, a generator or noise"
            )
        self.cycle = group_names(self.options, config)
        self.group_models = {name: new_model(config, info, name) for name in dict.fromkeys(self.cycle)}
        self.specs = {name: state_specs(model.state_dict()) for name, model in self.group_models.items()}
        binary = any(map(has_binary_layers, self.group_models.values()))
        if self.options.fuse_precision == "full" and not binary:
            raise ConfigError(
                "feddf.fuse_precision = 'full' fuses binary models in full precision, but no group "
                f"({', '.join(self.group_models)}) has binary layers; use one such as resnet8-binary"
            )
        self.source = build_source(
            self.options.source,
            info,
            data_dir=config.data_dir,
            size=self.options.source_size,
            seed=config.seed,
            upsample=self.options.generator_upsample,
            held_out=held_out,
        )
        log.info("FedDF distils on %s", self.source.description)
        self.last_local: dict[str, float] = {}
        self.privacy = PrivacyReport(self.options, sampling_rate(config.fraction, ctx.num_clients))

    def group(self, client: int) -> str:
        return self.cycle[client % len(self.cycle)]

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        config, options = self.ctx.config, self.options
        chosen = sample_clients(fleet.clients, config.fraction, config.seed, round)
        evaluate_local = round % config.eval_every == 0 or round == config.rounds
        settings = {"round": round, "prox_mu": options.prox_mu, "evaluate_local": evaluate_local}
        requests = {
            name: Message.build(
                "train", arrays={"parameters": model.state_dict()}, scalars={"config": settings}
            )
            for name, model in self.group_models.items()
        }
        needed = TRAIN_METRICS + (LOCAL_METRICS if evaluate_local else ())
        expect = {cid: ReplySpec({"parameters": self.specs[self.group(cid)]}, needed) for cid in chosen}
        sent = fleet.send(
            {cid: requests[self.group(cid)] for cid in chosen}, timeout=config.timeout or None, expect=expect
        )
        self.privacy.check(sent, round)
        replies = successful(sent, minimum=min(config.min_clients, len(chosen)), what="trained parameters")
        clients = sorted(replies)
        states = [replies[cid].tensors("parameters") for cid in clients]
        counts = [float(replies[cid].scalar("metrics", "num_samples")) for cid in clients]
        teachers = [self._frozen(self.group(cid), state) for cid, state in zip(clients, states, strict=True)]

        # drop-worst and the ensemble's own validation accuracy (the ceiling the students chase)
        labels = devices.on_device(self.validation.y)
        val_logits = torch.stack([predict_logits(t, self.validation, self.ctx.info) for t in teachers])
        accuracies = [accuracy(z, labels) for z in val_logits]
        if options.drop_worst == "off":
            weights = [1.0 / len(clients)] * len(clients)
        else:
            weights = drop_worst_weights(
                accuracies, self.ctx.info.num_classes, weighted=options.drop_worst == "weighted"
            )
        kept = [i for i, w in enumerate(weights) if w > 0]
        ensemble = (torch.tensor(weights, device=val_logits.device).view(-1, 1, 1) * val_logits).sum(0)
        metrics: dict[str, float] = {
            "train_loss": mean_metric({c: replies[c] for c in clients}, "train_loss", counts),
            "clients": len(clients),
            "teachers": len(kept),
            "dropped": len(clients) - len(kept),
            "teacher_val_accuracy_mean": float(np.mean(accuracies)),
            "ensemble_val_accuracy": accuracy(ensemble, labels),
        }

        # per group: average its kept models, then distil the whole ensemble into it
        selected = []
        for name, student in self.group_models.items():
            members = [i for i in kept if self.group(clients[i]) == name]
            if members and options.student_init == "average":  # else the group's previous model
                shares = [counts[i] if options.weighting == "samples" else 1.0 for i in members]
                student.load_state_dict(average_states([states[i] for i in members], shares))
            if not options.distill:
                selected.append(self._validate(student))
                metrics |= {f"members_{name}": len(members), f"val_accuracy_{name}": selected[-1]}
                continue
            with self._precision(student):
                report = distill(
                    student,
                    [teachers[i] for i in kept],
                    [weights[i] for i in kept],
                    self.source,
                    self._validate,
                    options,
                    torch_generator(config.seed, "feddf-distillation", round, name),
                )
            selected.append(report.selected_accuracy)
            metrics |= {
                f"members_{name}": len(members),
                f"val_accuracy_average_{name}": report.evaluations[0][1],
                f"val_accuracy_{name}": report.selected_accuracy,
                f"distill_steps_{name}": report.steps,
                f"selected_step_{name}": report.selected_step,
                f"distill_loss_first_{name}": report.losses[0],
                f"distill_loss_last_{name}": report.losses[-1],
            }
        metrics["val_accuracy"] = float(np.mean(selected))
        if evaluate_local:
            local_counts = [float(replies[c].scalar("metrics", "local_count")) for c in clients]
            local = [float(replies[c].scalar("metrics", "local_accuracy")) for c in clients]
            metrics["local_accuracy"] = float(np.average(local, weights=local_counts))
            self.last_local = {"local_accuracy": metrics["local_accuracy"]}
        self.privacy.rounds_done = round
        return metrics | self.privacy.metrics()

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        return dict(last) | self.privacy.final(fleet, self.ctx.config.timeout or None)

    def _frozen(self, group: str, state: dict[str, torch.Tensor]) -> nn.Module:
        """A received model as a frozen teacher (eval mode, no gradients)."""
        model = copy.deepcopy(self.group_models[group])
        model.load_state_dict(state)
        model.eval()
        model.requires_grad_(False)
        return model

    def _precision(self, student: nn.Module) -> AbstractContextManager[nn.Module]:
        """The precision the student is distilled and selected in (`fuse_precision`)."""
        return full_precision(student) if self.options.fuse_precision == "full" else nullcontext(student)

    def _validate(self, model: nn.Module) -> float:
        return evaluate_model(model, self.validation, self.ctx.info)["accuracy"]

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """Test metrics per group (`test_accuracy_<model>`); `test_accuracy` is their mean."""
        results = {name: self.ctx.evaluate(model) for name, model in self.group_models.items()}
        metrics = {f"test_accuracy_{name}": r["accuracy"] for name, r in results.items()}
        metrics |= {f"test_loss_{name}": r["loss"] for name, r in results.items()}
        metrics["test_accuracy"] = float(np.mean([r["accuracy"] for r in results.values()]))
        if self.options.fuse_precision == "full":  # the fused network itself, before clients binarize it
            full = []
            for model in self.group_models.values():
                with full_precision(model):
                    full.append(self.ctx.evaluate(model)["accuracy"])
            metrics["test_accuracy_full_precision"] = float(np.mean(full))
        metrics["test_loss"] = float(np.mean([r["loss"] for r in results.values()]))
        return metrics | self.last_local

    def models(self) -> dict[str, nn.Module]:
        if len(self.group_models) == 1:
            return {"global": next(iter(self.group_models.values()))}
        return {f"global_{name}": model for name, model in self.group_models.items()}

    def state_dict(self) -> dict:
        return {
            "models": {name: clone_state(model) for name, model in self.group_models.items()},
            "last_local": self.last_local,
            "privacy": self.privacy.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        for name, model_state in state["models"].items():
            self.group_models[name].load_state_dict(model_state)
        self.last_local = dict(state.get("last_local", {}))
        self.privacy.load_state_dict(state.get("privacy", {}))


register(
    Algorithm(
        "feddf",
        "FedDF: average per architecture, then distil the ensemble of all client models on unlabeled data",
        FedDFClient,
        FedDFServer,
        FedDFOptions,
        tasks=("classification", *TEXT_TASKS),
    )
)
