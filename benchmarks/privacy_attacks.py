"""Gradient inversion against what each method's client actually sends (FedMD-CG's Table 2, and FedIOD).

Threat model
------------
An honest-but-curious server. It runs the protocol as written and keeps everything it receives: exactly
what the ledger records for a client's reply. It also knows the public run configuration (architecture,
dataset shape, learning rate, local steps, the run seed) and, being the server, every request it sent. It
never sees a client's data, labels, optimiser state or any part of a model the client keeps private.

What is done
------------
For every method, clients are built from the real algorithm code (their `ClientLogic`) with a private set
chosen here, the real server logic runs one round (FedIOD: stage 1, then one distillation step) over an
in-process fleet that keeps every request and reply, and the attack runs on the intercepted reply alone.
The score is the PSNR and SSIM of the reconstruction against the batch the client really trained on
(captured inside the client by a forward hook, as ground truth only; best one-to-one match, images in
[0, 1]), averaged over ``--images`` private images per dataset. Attacks are this library's DLG (soft label
optimised) and iDLG (label read off the last layer), L-BFGS, ``--iterations`` steps.

Settings (every client trains with SGD, lr 0.05, no momentum or weight decay, no augmentation, round 1):

* ``fedavg-1step``: FedAvg, one local step on a batch of 1 (each client holds 2 images). The update is
  exactly lr x the gradient of the whole model: DLG's own setting.
* ``fedavg-multistep``: FedAvg, one local epoch of ``--multi-steps`` steps of batch 1; the update becomes
  a gradient estimate with `update_to_gradient` and is attacked as one batch of ``--multi-steps`` images.
* ``fedper``: only the extractor update is observed (the head is private).
* ``lgfedavg``: only the classifier update is observed (the extractor is private).
* ``fedmdcg``: the reply holds the classifier, the generator and label counts. The classifier update
  (round 1: cross-entropy only, so exactly lr x the head's gradient) is attacked, for one step of batch
  2 (its generator has BatchNorm1d and trains on the client's real batches, so batch 1 is impossible); the generator's update
  is an Adam step (lr x sign of its gradient, to first order) and is not attacked.
  For the three partial-sharing methods the attacker needs the private part to run a model at all:
  ``known-*`` rebuilds it from the run seed, which is exact in round 1 because this library initialises
  every site from the run seed; ``unknown-*`` uses an independently drawn initialisation, which is the
  attacker's position once the private part has been trained locally (any later round) or when sites
  initialise privately.
* ``fediod``: the client never sends a gradient of its parameters. What it returns about private data
  is its logits T_k(x) and density ratios on the server's own synthetic x, and the input-gradient of its
  local terms at x. DLG has nothing to match: the input-gradient is taken with respect to x, which the
  server chose and already knows, and inverting the logits gives back x, not a private image. The only
  channel from the private batch into the reply is the discriminator step that precedes the answer
  (one Adam step of D_k on the real batch and x) and the mean score of the real batch in the density
  ratio. ``fediod/dstep-inversion`` attacks exactly that channel, with an attacker *stronger than the
  threat model*: it is given the teacher T_k (private in FedIOD) and D_k's weights before the step (the
  seeded initialisation, exact at the first G-step). It optimises a dummy real batch so that replaying
  the client's step reproduces the observed ratios and input-gradients; the replay is checked to
  reproduce the true reply from the true batch, and scored on a batch of other real images (how much the
  reply depends on which private images were used at all). Adam's first step is lr x g / (|g| + eps), nearly
  lr x sign(g), so almost no gradient reaches the dummy batch; the attack relaxes it to
  lr x g / sqrt(g^2 + (kappa rms g)^2) while optimising. ``fediod/server-inputs`` scores the synthetic
  inputs the server holds anyway against the private set.
* ``reference/mean-image``: the training split's mean image against each attacked image: the PSNR an
  attacker gets by knowing only the data distribution. Scores at or below it mean nothing was recovered.

Model variants (``--variants``): ``relu`` is ``lenet-fedmdcg`` as the tables train it (ReLU, BatchNorm,
max-pool). ``sigmoid`` swaps ReLU for Sigmoid and changes nothing else. ``dlg`` is the same network in
the conditions of the DLG paper: Sigmoid, the max-pools removed (the strided convolutions stay), no
normalisation. All three are registered here under their own names and built through the model registry,
so the clients run them unchanged.

    python benchmarks/privacy_attacks.py [--datasets mnist,fashion-mnist] [--images 8] [--variants relu,sigmoid,dlg]

Writes benchmarks/results/privacy_attacks.{md,json} and image grids (top row: the client's batch; then
DLG; then iDLG) under benchmarks/results/privacy_attacks/.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedistill.algorithms.base import ClientContext, ServerContext, get_algorithm
from fedistill.algorithms.fediod import losses as FL
from fedistill.algorithms.fediod.options import network_widths
from fedistill.algorithms.training import new_model
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.registry import load_dataset
from fedistill.data.transforms import to_float
from fedistill.experiment.config import RunConfig, build_config, options_for
from fedistill.federation.fleet import Reply
from fedistill.federation.inprocess import InProcessFleet
from fedistill.federation.ledger import Ledger
from fedistill.federation.messages import Message
from fedistill.metrics.image_quality import best_match_psnr, save_image_grid, ssim
from fedistill.models import build_model
from fedistill.models.base import Classifier
from fedistill.models.discriminator import build_discriminator
from fedistill.models.lenet import LeNetFedMDCG
from fedistill.models.registry import model_names, register_model
from fedistill.privacy.attacks import AttackResult, dlg_attack, idlg_attack, update_to_gradient
from fedistill.seeding import seeded

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
LR = 0.05

#: FedMD-CG's Table 2 (DLG PSNR in dB, mean over seeds; the paper has no MNIST column).
PAPER_TABLE2 = {
    "fashion-mnist": {"fedavg": 22.63, "fedper": 19.66, "lgfedavg": 6.33, "fedmdcg": 7.02},
    "emnist": {"fedavg": 24.54, "fedper": 23.55, "lgfedavg": 6.78, "fedmdcg": 6.95},
}


# --- model variants ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    model: str
    norm: str
    label: str


VARIANTS = {
    "relu": Variant(
        "lenet-fedmdcg", "batch", "lenet-fedmdcg as trained in the tables: ReLU, BatchNorm, max-pool"
    ),
    "sigmoid": Variant(
        "lenet-fedmdcg-sigmoid", "batch", "lenet-fedmdcg with Sigmoid for ReLU: BatchNorm, max-pool"
    ),
    "dlg": Variant("lenet-fedmdcg-dlg", "none", "DLG's conditions: Sigmoid, no max-pool, no normalisation"),
}


def _lenet_variant(info: DatasetInfo, norm: str, groups: int, *, pool: bool) -> Classifier:
    """FedMD-CG's LeNet (see fedistill.models.lenet) with Sigmoid activations, with or without max-pool."""
    return LeNetFedMDCG(info, norm, groups, activation="sigmoid", pool=pool)


def register_variants() -> None:
    if "lenet-fedmdcg-sigmoid" not in model_names():
        register_model(
            "lenet-fedmdcg-sigmoid", lambda info, norm, groups: _lenet_variant(info, norm, groups, pool=True)
        )
    if "lenet-fedmdcg-dlg" not in model_names():
        register_model(
            "lenet-fedmdcg-dlg", lambda info, norm, groups: _lenet_variant(info, norm, groups, pool=False)
        )


# --- capturing what crosses the boundary ------------------------------------------------------------------


class RecordingFleet(InProcessFleet):
    """The in-process transport, keeping every request and reply: what the ledger records, in full."""

    def __init__(self, clients: Mapping[int, Any]) -> None:
        super().__init__(clients, Ledger(None))
        self.exchanges: list[tuple[dict[int, Message], dict[int, Reply]]] = []

    def send(self, requests, *, step=None, timeout=None, expect=None):  # type: ignore[override]
        replies = super().send(requests, step=step, timeout=timeout, expect=expect)
        self.exchanges.append((dict(requests), dict(replies)))
        return replies

    def exchange(self, message_type: str, client: int) -> tuple[Message, Message]:
        for requests, replies in self.exchanges:
            if client in requests and requests[client].type == message_type:
                reply = replies[client]
                if reply.message is None:
                    raise RuntimeError(f"client {client} failed on {message_type}: {reply.error}")
                return requests[client], reply.message
        raise KeyError(f"no {message_type} exchange with client {client}")


def capture_training_batches(module: nn.Module) -> list[torch.Tensor]:
    """Ground truth only: the inputs ``module`` sees while training (train mode, gradients on)."""
    seen: list[torch.Tensor] = []

    def hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
        if mod.training and torch.is_grad_enabled():
            seen.append(args[0].detach().clone())

    module.register_forward_pre_hook(hook)
    return seen


# --- scoring ----------------------------------------------------------------------------------------------


def to_unit(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    return (x.detach().cpu().float() * std + mean).clamp(0, 1)


@dataclass
class Score:
    psnr: list[float]
    ssim: list[float]
    label_accuracy: float | None = None
    distance: float | None = None
    seconds: float = 0.0
    note: str = ""
    reconstruction: torch.Tensor | None = field(default=None, repr=False)  # in [0, 1], in truth's order

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "psnr_mean": float(np.mean(self.psnr)) if self.psnr else None,
            "psnr_std": float(np.std(self.psnr)) if self.psnr else None,
            "ssim_mean": float(np.mean(self.ssim)) if self.ssim else None,
            "ssim_std": float(np.std(self.ssim)) if self.ssim else None,
            "psnr": self.psnr,
            "ssim": self.ssim,
            "seconds": self.seconds,
        }
        if self.label_accuracy is not None:
            out["label_accuracy"] = self.label_accuracy
        if self.distance is not None:
            out["final_distance"] = self.distance
        if self.note:
            out["note"] = self.note
        return out


def score(truth01: torch.Tensor, rec01: torch.Tensor) -> tuple[list[float], list[float], torch.Tensor]:
    """Best one-to-one match (lowest MSE): per-reconstruction PSNR and SSIM, and the matched truth index."""
    values, index = best_match_psnr(truth01, rec01)
    side = min(truth01.shape[-2:])
    # SSIM's 11-pixel window (sigma 1.5) needs 11 pixels; smaller images (8x8 digits) get the widest that fits
    sigma = 1.5 if side >= 11 else ((side - 1) // 2 - 0.01) / 3.5
    return values.tolist(), ssim(truth01[index], rec01, sigma=sigma).tolist(), index


def merge(scores: list[Score]) -> Score:
    """Pool several clients' scores of one setting (images in the order of their truths)."""
    labelled = [s for s in scores if s.label_accuracy is not None]
    weights = [len(s.psnr) for s in labelled]
    recs = [s.reconstruction for s in scores if s.reconstruction is not None]
    return Score(
        [v for s in scores for v in s.psnr],
        [v for s in scores for v in s.ssim],
        float(np.average([s.label_accuracy for s in labelled], weights=weights)) if labelled else None,
        float(np.mean([s.distance for s in scores if s.distance is not None]))
        if any(s.distance is not None for s in scores)
        else None,
        sum(s.seconds for s in scores),
        "; ".join(sorted({s.note for s in scores if s.note})),
        torch.cat(recs) if len(recs) == len(scores) and recs else None,
    )


# --- DLG / iDLG on an observed gradient -------------------------------------------------------------------


def attack_gradient(
    model: nn.Module,
    observed: dict[str, torch.Tensor],
    truth: torch.Tensor,
    labels: torch.Tensor,
    info: DatasetInfo,
    *,
    iterations: int,
    seed: int,
) -> dict[str, Score]:
    """DLG and iDLG against ``observed`` (a gradient keyed by parameter name); ``truth`` is the client's
    batch in model-input space. iDLG needs the last layer's gradient; without it, it is reported as n/a."""
    truth01 = to_unit(truth, info)
    out: dict[str, Score] = {}
    for name, attack in (("dlg", dlg_attack), ("idlg", idlg_attack)):
        start = time.perf_counter()
        try:
            result: AttackResult = attack(
                model,
                observed,
                tuple(truth.shape),
                info.num_classes,
                iterations=iterations,
                generator=torch.Generator().manual_seed(seed),
                mode="train",
            )
        except ValueError as exc:
            out[name] = Score([], [], note=f"n/a: {exc}")
            continue
        rec01 = to_unit(result.reconstruction, info)
        psnrs, ssims, index = score(truth01, rec01)
        ordered = torch.empty_like(rec01)
        ordered[index] = rec01
        out[name] = Score(
            psnrs,
            ssims,
            float((result.labels.cpu() == labels[index]).float().mean()),
            result.final_distance,
            time.perf_counter() - start,
            "diverged" if result.diverged else "",
            ordered,
        )
    return out


def observed_gradient(
    old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], steps: int, model: nn.Module
) -> dict[str, torch.Tensor]:
    """The gradient estimate of the parameters present in both states (buffers left out)."""
    names = [n for n, _ in model.named_parameters() if n in new and n in old]
    return update_to_gradient(old, new, LR, steps, names=names)


def gradient_check(
    model: nn.Module, observed: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> float:
    """Relative error between the observed gradient and the true one of the captured batch (1-step cases)."""
    model = copy.deepcopy(model).train()
    params = dict(model.named_parameters())
    names = list(observed)
    true = torch.autograd.grad(F.cross_entropy(model(x), y), [params[n] for n in names])
    num = sum(float(((observed[n] - t) ** 2).sum()) for n, t in zip(names, true, strict=True))
    den = sum(float((t**2).sum()) for t in true)
    return math.sqrt(num / max(den, 1e-30))


# --- building one method's federation ---------------------------------------------------------------------


@dataclass
class Setup:
    dataset: str
    info: DatasetInfo
    train: ImageSet
    test: ImageSet
    variant: str
    args: argparse.Namespace


def make_config(setup: Setup, algorithm: str, clients: int, **changes: Any) -> RunConfig:
    variant = VARIANTS[setup.variant]
    layer: dict[str, Any] = {
        "algorithm": algorithm,
        "dataset": setup.dataset,
        "data_dir": setup.args.data_dir,
        "model": variant.model,
        "norm": variant.norm,
        "clients": clients,
        "rounds": 10,
        "eval_every": 10,  # round 1 asks for no local evaluation
        "local_steps": 1,
        "batch_size": 1,
        "lr": LR,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "augment": "off",
        "seed": setup.args.seed,
    }
    layer.update(changes)
    return build_config(RunConfig(), layer)


def contexts(setup: Setup, config: RunConfig, options: Any, private: list[ImageSet]) -> list[ClientContext]:
    empty = ImageSet(setup.test.x[:0], setup.test.y[:0])
    held = setup.test.subset(range(200))
    return [
        ClientContext(k, data, empty, empty, setup.info, config, options, held)
        for k, data in enumerate(private)
    ]


def server_context(setup: Setup, config: RunConfig, options: Any, clients: int) -> ServerContext:
    held = setup.test.subset(range(200))
    return ServerContext(
        setup.info, config, options, clients, lambda m: {"accuracy": 0.0, "loss": 0.0}, None, held.y
    )


def run_round(setup: Setup, algorithm: str, private: list[ImageSet], config: RunConfig):
    """Clients from the real client logic, the real server's round 1; returns (fleet, clients, server, batches)."""
    method = get_algorithm(algorithm)
    options = options_for(config, algorithm, method.options)
    clients = {ctx.client_id: method.client(ctx) for ctx in contexts(setup, config, options, private)}
    batches = {k: capture_training_batches(c.model.extractor) for k, c in clients.items()}
    server = method.server(server_context(setup, config, options, len(clients)))
    fleet = RecordingFleet(clients)
    fleet.round = 1
    return fleet, clients, server, batches, options


def label_of(x: torch.Tensor, private: ImageSet, info: DatasetInfo) -> torch.Tensor:
    """The labels of captured (normalised) images, by exact match in the client's private set."""
    bank = to_float(private.x, info).flatten(1)
    distance = torch.cdist(x.flatten(1), bank)
    return private.y[distance.argmin(1)]


def private_sets(setup: Setup, sizes: list[int], offset: int) -> tuple[list[ImageSet], int]:
    """Consecutive slices of a seeded permutation of the training split, so no two settings share images."""
    order = torch.randperm(len(setup.train), generator=torch.Generator().manual_seed(setup.args.seed + 17))
    sets = []
    for size in sizes:
        sets.append(setup.train.subset(order[offset : offset + size]))
        offset += size
    return sets, offset


def attacker_model(config: RunConfig, info: DatasetInfo, *, known: bool) -> nn.Module:
    """The run's model from the seed (``known``: what every site started from) or an independent draw."""
    if known:
        return new_model(config, info)
    return seeded(config.seed, lambda: build_model(config.model, info, norm=config.norm), "attacker-guess")


# --- settings ---------------------------------------------------------------------------------------------


def fedavg_setting(
    setup: Setup, steps: int, clients: int, offset: int
) -> tuple[dict[str, list[dict[str, Score]]], int]:
    """FedAvg: whole-model updates, ``steps`` steps of batch 1 per client (each holds max(2, steps) images)."""
    size = max(2, steps)
    private, offset = private_sets(setup, [size] * clients, offset)
    changes = {"local_steps": steps} if steps == 1 else {"local_steps": 0, "local_epochs": 1}
    config = make_config(setup, "fedavg", clients, **changes)
    fleet, _, server, batches, _ = run_round(setup, "fedavg", private, config)
    server.run_round(fleet, 1)
    results = []
    for k in range(clients):
        request, reply = fleet.exchange("train", k)
        model = attacker_model(config, setup.info, known=True)
        model.load_state_dict(request.tensors("parameters"))
        observed = observed_gradient(request.tensors("parameters"), reply.tensors("parameters"), steps, model)
        truth = torch.cat(batches[k])
        labels = label_of(truth, private[k], setup.info)
        # one step: ~0 proves the interception exact; several: the error of the one-batch approximation
        check = gradient_check(model, observed, truth, labels)
        scores = attack_gradient(
            model, observed, truth, labels, setup.info, iterations=setup.args.iterations, seed=k
        )
        results.append(
            {"scores": scores, "truth": truth, "gradient_check": check, "kinds": sorted(reply.arrays)}
        )
    return {"": results}, offset


def partial_setting(
    setup: Setup, algorithm: str, clients: int, batch: int, offset: int
) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """FedPer, LG-FedAvg or FedMD-CG: one step of batch ``batch`` (each client holds max(2, batch) images);
    attack the shared part's update with the private part rebuilt from the seed (known) or drawn
    independently (unknown)."""
    private, offset = private_sets(setup, [max(2, batch)] * clients, offset)
    changes: dict[str, Any] = {"batch_size": batch}
    if algorithm == "fedmdcg":  # the server's crossed distillation runs after the replies: keep it short
        changes["fedmdcg"] = {"server_steps": 1}
    config = make_config(setup, algorithm, clients, **changes)
    fleet, _, server, batches, _ = run_round(setup, algorithm, private, config)
    if algorithm == "fedmdcg":
        # round 1 sends no parameters; the server knows its own seeded classifier, the clients' start
        shared_old = {
            "classifier." + k: v.detach().clone() for k, v in server.classifier.state_dict().items()
        }
    server.run_round(fleet, 1)
    shared_prefix = "extractor." if algorithm == "fedper" else "classifier."
    out: dict[str, list[dict[str, Any]]] = {"known": [], "unknown": []}
    for k in range(clients):
        request, reply = fleet.exchange("train", k)
        if algorithm != "fedmdcg":
            shared_old = request.tensors("parameters")
        sent = {n: v for n, v in reply.tensors("parameters").items() if n.startswith(shared_prefix)}
        truth = torch.cat(batches[k])
        labels = label_of(truth, private[k], setup.info)
        for knowledge in ("known", "unknown"):
            model = attacker_model(config, setup.info, known=knowledge == "known")
            model.load_state_dict({**model.state_dict(), **shared_old})
            observed = observed_gradient(shared_old, sent, 1, model)
            # the check needs the client's true model: only the known private part is it
            check = gradient_check(model, observed, truth, labels) if knowledge == "known" else None
            scores = attack_gradient(
                model, observed, truth, labels, setup.info, iterations=setup.args.iterations, seed=k
            )
            out[knowledge].append(
                {"scores": scores, "truth": truth, "gradient_check": check, "kinds": sorted(reply.arrays)}
            )
    return out, offset


# --- FedIOD -----------------------------------------------------------------------------------------------


def fediod_setting(setup: Setup, images: int, offset: int) -> tuple[dict[str, Any], int]:
    """One FedIOD client holding ``images`` private images; stage 1 and the first distillation step of the
    real server; then the white-box D-step inversion and the server-inputs comparison (module docstring)."""
    args = setup.args
    private, offset = private_sets(setup, [images], offset)
    fediod = {
        "preset": "paper",
        "synthetic_batch_size": images,  # the D-step's real batch is then the whole private set
        "teacher_epochs": 20,
        "iters_per_epoch": 1,
        "student_steps": 1,
        "selection": "last",
    }
    config = make_config(setup, "fediod", 1, local_steps=0, batch_size=min(images, 8), fediod=fediod)
    method = get_algorithm("fediod")
    options = options_for(config, "fediod", method.options)
    client = method.client(contexts(setup, config, options, private)[0])
    server = method.server(server_context(setup, config, options, 1))
    fleet = RecordingFleet({0: client})
    fleet.round = 1
    server.setup(fleet)
    server.distillation_step(fleet)
    generate_request, generate_reply = fleet.exchange("query.generate", 0)
    backprop_request, backprop_reply = fleet.exchange("query.backprop", 0)
    kinds = sorted(set(generate_reply.arrays) | set(backprop_reply.arrays))

    x = generate_request.tensor("synthetic-inputs", "x").clone()
    cfg = generate_request.scalars["config"]
    observed = {
        "ratio": generate_reply.tensor("discriminator-outputs", "ratio").clone(),
        "input_gradient": backprop_reply.tensor("input-gradients", "x").clone(),
    }
    output_gradient = backprop_request.tensor("output-gradients", "z").clone()
    # Rebuilt from the public config and seed, as the server could (the client's D_k before its first step):
    d0 = seeded(
        config.seed,
        lambda: build_discriminator(setup.info, width=network_widths(options, setup.info.image_size)[1]),
        "discriminator-init",
    )
    teacher = copy.deepcopy(client.teacher).eval()  # granted to the attacker: private in FedIOD
    replay = DStepReplay(d0, teacher, x, output_gradient, cfg)
    truth = to_float(private[0].x, setup.info)
    check = replay.error(truth, observed)
    # How much the reply depends on the private batch at all: the same replay from other real images
    (other,), offset = private_sets(setup, [images], offset)
    check["objective_true_batch"] = float(replay.objective(truth, observed, 0.0).detach())
    check["objective_other_batch"] = float(
        replay.objective(to_float(other.x, setup.info), observed, 0.0).detach()
    )

    start = time.perf_counter()
    rec, distance = replay.invert(
        observed, truth.shape, iterations=args.fediod_iterations, kappa=args.kappa, seed=0
    )
    truth01 = to_unit(truth, setup.info)
    rec01 = to_unit(rec, setup.info)
    psnrs, ssims, index = score(truth01, rec01)
    ordered = torch.empty_like(rec01)
    ordered[index] = rec01
    inversion = Score(psnrs, ssims, None, distance, time.perf_counter() - start, "", ordered)

    x01 = to_unit(x, setup.info)
    p2, s2, index2 = score(truth01, x01)
    ordered2 = torch.empty_like(x01)
    ordered2[index2] = x01
    inputs = Score(p2, s2, None, None, 0.0, "", ordered2)
    return {
        "dstep-inversion": {"score": inversion, "truth": truth, "replay_error": check, "kinds": kinds},
        "server-inputs": {"score": inputs, "truth": truth, "kinds": kinds},
    }, offset


class DStepReplay:
    """Replays a FedIOD client's answer to one G-step from a guess of its real batch.

    The client: one Adam step (fresh state, betas (0.5, 0.999)) of D_k on
    ``discriminator_loss(D(real), D(x))``; ``real_mean`` = mean patch score of D(real) before the step;
    ratio = patch scores of the stepped D on x / real_mean; input-gradient = d/dx of
    ``c_gan L_gan(D'(x)) + c_conf H(T(x)) + <output_gradient, T(x)>``.
    """

    def __init__(
        self,
        d0: nn.Module,
        teacher: nn.Module,
        x: torch.Tensor,
        output_gradient: torch.Tensor,
        cfg: Mapping[str, Any],
    ):
        self.d = d0.train()
        self.params = {n: p.detach().clone() for n, p in d0.named_parameters()}
        self.buffers = {n: b.detach().clone() for n, b in d0.named_buffers()}
        self.teacher = teacher
        for p in teacher.parameters():
            p.requires_grad_(False)
        self.x = x
        self.gz = output_gradient
        self.lr = float(cfg["lr_discriminator"])
        self.c_gan, self.c_conf = float(cfg["c_gan"]), float(cfg["c_conf"])
        self.tau, self.gan_loss = float(cfg["tau"]), str(cfg["gan_loss"])

    def _d(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        buffers = {n: b.clone() for n, b in self.buffers.items()}  # BatchNorm runs on batch statistics
        return functional_call(self.d, (dict(params), buffers), (x,))

    def simulate(self, real: torch.Tensor, kappa: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        p0 = {n: p.clone().requires_grad_(True) for n, p in self.params.items()}
        real_logits = self._d(p0, real)
        d_loss = FL.discriminator_loss(real_logits, self._d(p0, self.x))
        grads = torch.autograd.grad(d_loss, list(p0.values()), create_graph=True)
        p1 = {}
        for (name, p), g in zip(p0.items(), grads, strict=True):
            if kappa > 0:
                soft = kappa * g.detach().pow(2).mean().sqrt()
                step = g / (torch.sqrt(g * g + soft * soft) + 1e-8)
            else:  # Adam's first step, exactly: lr * m_hat / (sqrt(v_hat) + eps) = lr * g / (|g| + eps)
                step = g / (g.abs() + 1e-8)
            p1[name] = p - self.lr * step
        real_mean = FL.patch_scores(real_logits).mean()
        x = self.x.clone().requires_grad_(True)
        fake = self._d(p1, x)
        logits = self.teacher(x)
        local = (
            self.c_gan * FL.generator_gan_loss(fake, mode=self.gan_loss)
            + self.c_conf * FL.entropy(logits, self.tau).mean()
        )
        (gx,) = torch.autograd.grad(local + (logits * self.gz).sum(), x, create_graph=True)
        ratio = FL.density_ratio(FL.patch_scores(fake), real_mean)
        return gx, ratio

    def objective(
        self, real: torch.Tensor, observed: Mapping[str, torch.Tensor], kappa: float
    ) -> torch.Tensor:
        gx, ratio = self.simulate(real, kappa)
        g_obs, r_obs = observed["input_gradient"], observed["ratio"]
        return ((gx - g_obs) ** 2).sum() / (g_obs**2).sum() + ((ratio - r_obs) ** 2).sum() / (r_obs**2).sum()

    def error(self, real: torch.Tensor, observed: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Relative error of the exact replay from the true batch: ~0 proves the attacker's model is right."""
        gx, ratio = (t.detach() for t in self.simulate(real, 0.0))
        g_obs, r_obs = observed["input_gradient"], observed["ratio"]
        return {
            "input_gradient": float((gx - g_obs).norm() / g_obs.norm()),
            "ratio": float((ratio - r_obs).norm() / r_obs.norm()),
        }

    def invert(
        self,
        observed: Mapping[str, torch.Tensor],
        shape: torch.Size,
        *,
        iterations: int,
        kappa: float,
        seed: int,
    ) -> tuple[torch.Tensor, float]:
        """Adam on a dummy real batch against the relaxed replay; returns the iterate with the lowest exact
        (kappa = 0) objective among those checked, and that objective."""
        dummy = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed)).requires_grad_(True)
        optimizer = torch.optim.Adam([dummy], lr=0.05)
        best, best_value = dummy.detach().clone(), math.inf
        for it in range(iterations):
            if it % 10 == 0 or it == iterations - 1:
                value = float(self.objective(dummy, observed, 0.0).detach())
                if value < best_value:
                    best, best_value = dummy.detach().clone(), value
            loss = self.objective(dummy, observed, kappa)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        value = float(self.objective(dummy, observed, 0.0).detach())
        if value < best_value:
            best, best_value = dummy.detach().clone(), value
        return best, best_value


# --- the whole benchmark ----------------------------------------------------------------------------------

SETTINGS = [
    "fedavg-1step",
    "fedavg-multistep",
    "fedper/known-head",
    "fedper/unknown-head",
    "lgfedavg/known-extractor",
    "lgfedavg/unknown-extractor",
    "fedmdcg/known-extractor",
    "fedmdcg/unknown-extractor",
    "fediod/dstep-inversion",
    "fediod/server-inputs",
    "reference/mean-image",
]

OBSERVED = {
    "fedavg-1step": "whole-model update (1 step, batch 1)",
    "fedavg-multistep": "whole-model update (one epoch of batch-1 steps)",
    "fedper/known-head": "extractor update; head rebuilt from the seed",
    "fedper/unknown-head": "extractor update; head unknown",
    "lgfedavg/known-extractor": "classifier update; extractor rebuilt from the seed",
    "lgfedavg/unknown-extractor": "classifier update; extractor unknown",
    "fedmdcg/known-extractor": "classifier update (+ generator, counts), batch 2; extractor rebuilt from the seed",
    "fedmdcg/unknown-extractor": "classifier update (+ generator, counts), batch 2; extractor unknown",
    "fediod/dstep-inversion": "logits, density ratios, input-gradients; D_k init and T_k granted",
    "fediod/server-inputs": "the server's own synthetic inputs x",
    "reference/mean-image": "nothing: the training split's mean image",
}


def run_dataset_variant(setup: Setup) -> dict[str, Any]:
    args = setup.args
    n = args.images
    steps = max(1, min(args.multi_steps, n))
    wanted = set(args.methods.split(","))
    results: dict[str, Any] = {}
    offset = 0

    def keep(setting: str, entries: list[dict[str, Any]]) -> None:
        scores = {a: merge([e["scores"][a] for e in entries]) for a in ("dlg", "idlg")}
        checks = [e["gradient_check"] for e in entries if e.get("gradient_check") is not None]
        results[setting] = {
            "scores": scores,
            "truth": torch.cat([e["truth"] for e in entries]),
            "gradient_check_max": max(checks) if checks else None,
            "kinds": entries[0]["kinds"],
        }

    if "fedavg" in wanted:
        single, offset = fedavg_setting(setup, 1, n, offset)
        keep("fedavg-1step", single[""])
        multi, offset = fedavg_setting(setup, steps, max(1, n // steps), offset)
        keep("fedavg-multistep", multi[""])
    for algorithm, private_part in (("fedper", "head"), ("lgfedavg", "extractor"), ("fedmdcg", "extractor")):
        if algorithm in wanted:
            # FedMD-CG's generator has BatchNorm1d and trains on the cached real batches: batch >= 2
            batch = 2 if algorithm == "fedmdcg" and n >= 2 else 1
            if algorithm == "fedmdcg" and n < 2:
                continue
            out, offset = partial_setting(setup, algorithm, n // batch, batch, offset)
            for knowledge in ("known", "unknown"):
                keep(f"{algorithm}/{knowledge}-{private_part}", out[knowledge])
    if "fediod" in wanted:
        out, offset = fediod_setting(setup, max(2, n), offset)
        for name, entry in out.items():
            results[f"fediod/{name}"] = {
                "scores": {"attack": entry["score"]},
                "truth": entry["truth"],
                "replay_error": entry.get("replay_error"),
                "kinds": entry["kinds"],
            }
    # reference: the mean training image against every image attacked above
    truths = [r["truth"] for r in results.values()]
    if truths:
        mean01 = (setup.train.x.float() / 255.0).mean(0, keepdim=True)
        truth01 = to_unit(torch.cat(truths), setup.info)
        psnrs, ssims = [], []
        for t in truth01:
            p, s, _ = score(t[None], mean01)
            psnrs += p
            ssims += s
        results["reference/mean-image"] = {"scores": {"attack": Score(psnrs, ssims)}, "kinds": []}
    return results


def save_grids(setup: Setup, results: dict[str, Any], out_dir: Path) -> dict[str, str]:
    paths = {}
    for setting, entry in results.items():
        if "truth" not in entry:
            continue
        truth01 = to_unit(entry["truth"], setup.info)
        rows, titles = [truth01], ["client"] * len(truth01)
        for attack, sc in entry["scores"].items():
            if sc.reconstruction is not None and len(sc.reconstruction) == len(truth01):
                rows.append(sc.reconstruction)
                titles += (
                    [f"{attack} {p:.1f}dB" for p in sc.psnr]
                    if len(sc.psnr) == len(truth01)
                    else [attack] * len(truth01)
                )
        if len(rows) == 1:
            continue
        name = f"{setup.dataset}_{setup.variant}_{setting.replace('/', '_')}.png"
        path = save_image_grid(
            torch.cat(rows),
            out_dir / name,
            nrow=len(truth01),
            titles=titles,
            title=f"{setup.dataset}, {setup.variant}: {setting}",
        )
        paths[setting] = str(path.relative_to(HERE.parent)) if path.is_relative_to(HERE.parent) else str(path)
    return paths


def cell(summary: dict[str, Any] | None) -> str:
    if summary is None or summary.get("psnr_mean") is None:
        return "n/a"
    return f"{summary['psnr_mean']:.1f} / {summary['ssim_mean']:.2f}"


def write_report(data: dict[str, Any], path_md: Path) -> None:
    args = data["settings"]
    lines = [
        "# Gradient inversion against what clients send",
        "",
        "`benchmarks/privacy_attacks.py`; FedMD-CG's Table 2 (DLG PSNR) extended with FedIOD. "
        f"{args['images']} private images per dataset and setting; cells are **PSNR dB / SSIM** of the "
        "reconstruction against the client's actual batch (best one-to-one match, images in [0, 1]), mean over "
        "images. Higher = more leakage. Compare every cell with `reference/mean-image` (an attacker who knows only "
        "the data distribution): at or below it nothing was recovered.",
        "",
        f"Settings: {data['settings_line']}",
        "",
        "**Threat model.** An honest-but-curious server holding exactly what the client sent (what the ledger "
        "records), the requests it sent itself, and the public run configuration including the seed. "
        "`known-*` rows: the part a method keeps private is rebuilt from the run seed (exact in round 1 here, "
        "since every site starts from the seeded initialisation); `unknown-*`: the attacker must guess it (any "
        "later round, or private initialisation). The FedIOD inversion grants the attacker *more* than the "
        "threat model (the client's teacher and its discriminator's weights before the step).",
        "",
        "Model variants:",
        "",
    ]
    for name in args["variants"].split(","):
        lines.append(
            f"* `{name}`: {VARIANTS[name].label} (`{VARIANTS[name].model}`, norm `{VARIANTS[name].norm}`)"
        )
    lines.append("")
    for dataset, by_variant in data["results"].items():
        variants = list(by_variant)
        lines += [f"## {dataset}", ""]
        header = (
            "| setting | what the server observes | "
            + " | ".join(f"{v} DLG | {v} iDLG" for v in variants)
            + " | paper (Table 2, DLG PSNR) |"
        )
        lines += [header, "|" + "---|" * (2 + 2 * len(variants) + 1)]
        for setting in SETTINGS:
            if not any(setting in by_variant[v] for v in variants):
                continue
            cells = []
            for v in variants:
                entry = by_variant[v].get(setting)
                if entry is None:
                    cells += ["", ""]
                elif "attack" in entry["scores"]:
                    cells += [cell(entry["scores"]["attack"]), "—"]
                else:
                    cells += [cell(entry["scores"].get("dlg")), cell(entry["scores"].get("idlg"))]
            method = setting.split("/")[0].removesuffix("-1step").removesuffix("-multistep")
            paper = PAPER_TABLE2.get(dataset, {}).get(method)
            show_paper = paper is not None and (
                setting in ("fedavg-1step",)
                or setting.endswith("unknown-head")
                or setting.endswith("unknown-extractor")
            )
            lines.append(
                f"| `{setting}` | {OBSERVED[setting]} | "
                + " | ".join(cells)
                + f" | {paper if show_paper else ''} |"
            )
        lines.append("")
        lines.append(
            "Label accuracy of the attacks (DLG / iDLG) and checks. *Gradient error*: the relative distance "
            "between the gradient the server derives from the reply and the true gradient of the captured batch "
            "at the weights the client started from (largest over clients); ~1e-7 shows the interception is exact, "
            "for multi-step FedAvg it is the error of the one-batch approximation DLG has to make."
        )
        lines.append("")
        for v in variants:
            parts = []
            for setting, entry in by_variant[v].items():
                sc = entry["scores"]
                if "dlg" in sc:
                    acc = [sc[a].get("label_accuracy") for a in ("dlg", "idlg")]
                    acc_s = "/".join("n/a" if a is None else f"{a:.2f}" for a in acc)
                    check = entry.get("gradient_check_max")
                    extra = f", gradient error {check:.1e}" if check is not None else ""
                    parts.append(f"`{setting}` {acc_s}{extra}")
                if entry.get("replay_error"):
                    err = entry["replay_error"]
                    reached = sc["attack"].get("final_distance")
                    parts.append(
                        f"`{setting}` exact replay from the true batch reproduces the reply to "
                        f"{err['input_gradient']:.1e} (input-gradients) and {err['ratio']:.1e} (ratios), relative; "
                        f"matching objective (relative squared error): true batch {err['objective_true_batch']:.1e}, "
                        f"other real images {err['objective_other_batch']:.2g}, the inversion's result {reached:.2g}"
                    )
            lines.append(f"* `{v}`: " + "; ".join(parts))
        lines.append("")
    lines += [
        "## Reading the table",
        "",
        *data["notes"],
        "",
        f"Image grids (top row: the client's batch; then DLG; then iDLG): `benchmarks/results/privacy_attacks/`. "
        f"Total time {data['seconds']:.0f} s on {data['machine']}.",
        "",
    ]
    path_md.write_text("\n".join(lines))


NOTES = [
    "* The paper's Table 2 has no MNIST column; its Fashion-MNIST numbers are shown next to the rows that "
    "match its setting (FedAvg: whole updates; FedPer, LG-FedAvg, FedMD-CG: the private part unknown to the "
    "server). The paper does not state the attacked model, batch size, round or what its attacker knew of the "
    "private parts. DLG is usually run on a Sigmoid LeNet without pooling, which the `dlg` variant mirrors. "
    "Its FedPer number (19.66 dB, close to FedAvg's) fits an attacker that knows the private head: here "
    "FedPer leaks with a known head and not with an unknown one.",
    "* ReLU with max-pool (the project's model) defeats DLG and iDLG even for FedAvg's single-image "
    "gradient: L-BFGS stalls in a poor local minimum. Swapping in Sigmoid alone does not help while the "
    "max-pools stay: each pool passes the gradient of one pixel in four. Only the DLG-friendly `dlg` variant "
    "shows how much a whole-model gradient can leak.",
    "* iDLG reads the label from the sign of the last layer's gradient, which assumes non-negative inputs "
    "to that layer. lenet-fedmdcg's head (every variant, every method here) is fc1 -> fc2 with no "
    "activation in between, so that input can be negative and the inferred label can be wrong (see the "
    "label accuracies), and with a wrong label iDLG fails outright (Fashion-MNIST, `dlg`, FedAvg: DLG "
    "reconstructs exactly, iDLG not at all). DLG optimises the label instead. For FedPer the last layer is private, so iDLG has no label to read (n/a).",
    "* Multi-step FedAvg is attacked through the average-gradient approximation `(w_old - w_new) / (lr * steps)`, "
    "recovering the images as one batch. It fails here because at lr 0.05 one SGD step already changes these "
    "small models a lot (see the gradient errors above: the one-batch approximation is far off; with "
    "BatchNorm the attacker's batch statistics also differ from the client's per-step ones), not because "
    "the update hides the data: attacks on multi-step updates need smaller learning rates or an attack that "
    "simulates the local steps.",
    "* BatchNorm on a batch of one normalises each channel over its spatial positions, so the input is "
    "only determined up to an affine change of intensity: reconstructions can look right (high SSIM) at a "
    "modest PSNR.",
    "* FedIOD: no parameter or parameter-gradient leaves the client, so DLG and iDLG do not apply. The "
    "logits are T_k on the server's own x (inverting them returns x); the input-gradient is with respect to "
    "x, known to the server. The private batch enters the reply only through one Adam step of D_k and one "
    "scalar (the real batch's mean D-score). Even given T_k and D_k's exact weights before the step (the "
    "replay reproduces the reply to rounding), the inversion recovers nothing beyond the data prior: "
    "Adam's first step transmits about the sign of D's parameter gradient, and the B ratios and B "
    "input-gradients of x do not pin down B private images through it by gradient descent. The reply does "
    "depend on the batch, though: the checks above show the true batch reproducing it to rounding (<= 1e-13) while other "
    "real images of the same size (and the inversion's result) only reach ~1e-4 to 1e-1. So this white-box "
    "attacker, if it also held candidate images, could tell whether they were the batch used (a membership "
    "test); reconstruction is what fails. After the first G-step D_k's weights are private too, which "
    "weakens that test as well. What FedIOD's server does hold is its synthetic data; how close a *trained* "
    "generator's samples come to private data is the separate question of `fedistill.metrics.similarity` "
    "(FedIOD's Figure 4). Here `fediod/server-inputs` is the untrained generator of the first step, i.e. "
    "noise.",
    "* `known-*` rows measure a property of this library's initialisation: "
    "every site starts from the run seed's model, so in round 1 the part a method keeps private is known to "
    "the server. With the DLG-friendly model the shared part's gradient alone then reconstructs the image "
    "through it: for a batch of one, the head's weight gradient gives the extractor's feature vector exactly, "
    "and the untrained extractor is inverted (LG-FedAvg, FedMD-CG). Once the private part differs from "
    "anything the server can rebuild (`unknown-*`: later rounds, or a per-client initialisation), nothing is "
    "recovered.",
    "* One round, round 1, one local step: the attacker's best case for the parameter-sharing methods "
    "(freshly initialised models leak most). Real runs use larger batches and more local steps.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(HERE.parents[1] / "shared" / "data"))
    parser.add_argument("--datasets", default="mnist,fashion-mnist")
    parser.add_argument("--variants", default="relu,sigmoid,dlg")
    parser.add_argument("--methods", default="fedavg,fedper,lgfedavg,fedmdcg,fediod")
    parser.add_argument(
        "--images", type=int, default=8, help="private images attacked per dataset and setting"
    )
    parser.add_argument(
        "--multi-steps", type=int, default=4, help="local steps of the multi-step FedAvg update"
    )
    parser.add_argument("--iterations", type=int, default=100, help="L-BFGS steps of DLG/iDLG")
    parser.add_argument(
        "--fediod-iterations", type=int, default=150, help="Adam steps of the FedIOD inversion"
    )
    parser.add_argument(
        "--kappa", type=float, default=0.1, help="relaxation of Adam's sign-like step in the FedIOD inversion"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.images < 1:
        parser.error("--images must be >= 1")
    for v in args.variants.split(","):
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    register_variants()
    out = Path(args.out)
    grid_dir = out / "privacy_attacks"
    grid_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    grids: dict[str, Any] = {}
    for dataset in args.datasets.split(","):
        loaded = load_dataset(dataset, args.data_dir)
        results[dataset] = {}
        for variant in args.variants.split(","):
            t0 = time.perf_counter()
            setup = Setup(dataset, loaded.info, loaded.train, loaded.test, variant, args)
            raw = run_dataset_variant(setup)
            grids[f"{dataset}/{variant}"] = save_grids(setup, raw, grid_dir)
            results[dataset][variant] = {
                setting: {
                    "scores": {a: s.summary() for a, s in entry["scores"].items()},
                    "kinds_sent": entry.get("kinds", []),
                    **(
                        {"gradient_check_max": entry["gradient_check_max"]}
                        if entry.get("gradient_check_max") is not None
                        else {}
                    ),
                    **({"replay_error": entry["replay_error"]} if entry.get("replay_error") else {}),
                }
                for setting, entry in raw.items()
            }
            print(f"{dataset} {variant}: {time.perf_counter() - t0:.0f} s", flush=True)
            for setting, entry in results[dataset][variant].items():
                cells = ", ".join(f"{a} {cell(s)}" for a, s in entry["scores"].items())
                print(f"  {setting}: {cells}", flush=True)
    settings_line = (
        f"images={args.images}, multi-step FedAvg={max(1, min(args.multi_steps, args.images))} steps of batch 1, "
        f"DLG/iDLG {args.iterations} L-BFGS steps, FedIOD inversion {args.fediod_iterations} Adam steps "
        f"(kappa {args.kappa}), lr {LR}, seed {args.seed}, threads {args.threads}"
    )
    data = {
        "benchmark": "privacy_attacks",
        "settings": {k: v for k, v in vars(args).items() if k not in ("data_dir", "out")},
        "settings_line": settings_line,
        "paper_table2_psnr": PAPER_TABLE2,
        "variants": {k: vars(v) for k, v in VARIANTS.items()},
        "observed": OBSERVED,
        "results": results,
        "grids": grids,
        "notes": NOTES,
        "seconds": time.perf_counter() - started,
        "machine": f"{platform.machine()} CPU, {args.threads} thread(s), torch {torch.__version__}",
        "python": sys.version.split()[0],
    }
    (out / "privacy_attacks.json").write_text(json.dumps(data, indent=2))
    write_report(data, out / "privacy_attacks.md")
    print(f"wrote {out / 'privacy_attacks.md'} ({data['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    raise SystemExit(main())
