"""Gradient-inversion threat models: what each method's client sends, intercepted and attacked.

The attacker is an honest-but-curious server. It runs the protocol as written and keeps everything it
receives: exactly what the ledger records for a client's reply (`RecordingFleet`). It also knows the
public run configuration (architecture, dataset shape, learning rate, local steps, the run seed) and,
being the server, every request it sent. It never sees a client's data, labels, optimiser state or any
part of a model the client keeps private.

Each setting builds clients from the real algorithm code (their `ClientLogic`) with a private set chosen
here, runs the real server logic for one round over a recording fleet (FedIOD: stage 1, then one
distillation step) and attacks the intercepted reply alone. Every client trains with SGD, lr 0.05, no
momentum or weight decay, no augmentation, round 1:

* `fedavg_setting`: FedAvg's whole-model update, one local step on a batch of 1 (DLG's own setting:
  the update is exactly lr x the gradient), or one epoch of several steps, attacked through
  `update_to_gradient` as one batch.
* `partial_setting`: FedPer (the extractor update), LG-FedAvg (the classifier update) and FedMD-CG (the
  classifier update; one step of batch 2, since its generator has BatchNorm1d and trains on the client's
  real batches; its generator's Adam step is not attacked). The attacker needs the private part to run a
  model at all: ``known`` rebuilds it from the run seed, exact in round 1 because this library
  initialises every site from the run seed; ``unknown`` draws it independently, the attacker's position
  once the private part has trained locally or when sites initialise privately.
* `fediod_setting`: no parameter gradient to match; the D-step inversion of `dstep_replay` on the
  client's only channel from its private batch, and the server's own synthetic inputs scored against
  the private set.

Model variants: ``relu`` is ``lenet-fedmdcg`` as the tables train it (ReLU, BatchNorm, max-pool);
``sigmoid`` swaps ReLU for Sigmoid; ``dlg`` is the network in the conditions of the DLG paper (Sigmoid,
no max-pool, no normalisation). All three are registered models, so the clients run them unchanged.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedistill.algorithms.base import ClientContext, ServerContext
from fedistill.algorithms.fediod import network_widths
from fedistill.algorithms.registry import get_algorithm
from fedistill.algorithms.shared.training import new_model
from fedistill.analysis.dstep_replay import DStepReplay
from fedistill.analysis.interception import RecordingFleet, Transport, capture_training_batches
from fedistill.analysis.inversion_scores import Score, attack_gradient, gradient_check, matched, to_unit
from fedistill.config import RunConfig, build_config, options_for
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.data.transforms import to_float
from fedistill.models import build_model
from fedistill.models.discriminator import build_discriminator
from fedistill.privacy.attacks import update_to_gradient
from fedistill.seeding import seeded

LR = 0.05


@dataclass(frozen=True)
class Variant:
    """A model the attacks run on, its norm, and what it is."""

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


def observed_gradient(
    old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], steps: int, model: nn.Module
) -> dict[str, torch.Tensor]:
    """The gradient estimate of the parameters present in both states (buffers left out)."""
    names = [n for n, _ in model.named_parameters() if n in new and n in old]
    return update_to_gradient(old, new, LR, steps, names=names)


@dataclass
class Setup:
    """One dataset and model variant to attack; ``args`` holds the seed, the data folder and the attacks'
    budgets (``iterations``, ``fediod_iterations``, ``kappa``); ``transport`` builds the fleet a round
    runs over."""

    dataset: str
    info: DatasetInfo
    train: ImageSet
    test: ImageSet
    variant: str
    args: argparse.Namespace
    transport: Transport


def make_config(setup: Setup, algorithm: str, clients: int, **changes: Any) -> RunConfig:
    """The run configuration of one setting: round 1 of SGD at lr 0.05 on the variant's model, no
    momentum, weight decay or augmentation, one local step of batch 1 unless `changes` say otherwise."""
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


def public_share(setup: Setup, size: int = 200) -> ImageSet:
    """The first `size` test images (all of a smaller test split): the public data a round lends its
    server and clients, none of them a client's private image."""
    return setup.test.subset(range(min(size, len(setup.test))))


def contexts(setup: Setup, config: RunConfig, options: Any, private: list[ImageSet]) -> list[ClientContext]:
    """Every client's context: its private set, nothing to validate or test on."""
    empty = ImageSet(setup.test.x[:0], setup.test.y[:0])
    held = public_share(setup)
    return [
        ClientContext(k, data, empty, empty, setup.info, config, options, held)
        for k, data in enumerate(private)
    ]


def server_context(setup: Setup, config: RunConfig, options: Any, clients: int) -> ServerContext:
    """The server's context (its evaluation a stub: the attacks read replies, not accuracies)."""
    held = public_share(setup)
    return ServerContext(
        setup.info, config, options, clients, lambda m: {"accuracy": 0.0, "loss": 0.0}, None, held.y
    )


def run_round(setup: Setup, algorithm: str, private: list[ImageSet], config: RunConfig):
    """Clients from the real client logic and the real server, at round 1; returns (fleet, clients, server,
    batches, options)."""
    method = get_algorithm(algorithm)
    options = options_for(config, algorithm, method.options)
    clients = {ctx.client_id: method.client(ctx) for ctx in contexts(setup, config, options, private)}
    batches = {k: capture_training_batches(c.model.extractor) for k, c in clients.items()}
    server = method.server(server_context(setup, config, options, len(clients)))
    fleet = RecordingFleet(setup.transport(clients))
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


def fedavg_setting(
    setup: Setup, steps: int, clients: int, offset: int
) -> tuple[dict[str, list[dict[str, Score]]], int]:
    """FedAvg: whole-model updates, ``steps`` steps of batch 1 per client (each holds max(2, steps)
    images)."""
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
        "wire": "float32",  # full-precision replies, the attacker's best case: compact's rounding only blurs
    }
    config = make_config(setup, "fediod", 1, local_steps=0, batch_size=min(images, 8), fediod=fediod)
    method = get_algorithm("fediod")
    options = options_for(config, "fediod", method.options)
    client = method.client(contexts(setup, config, options, private)[0])
    server = method.server(server_context(setup, config, options, 1))
    fleet = RecordingFleet(setup.transport({0: client}))
    fleet.round = 1
    server.setup(fleet)
    server.distillation_step(fleet)
    generate_request, generate_reply = fleet.exchange("query.generate", 0)
    backprop_request, backprop_reply = fleet.exchange("query.backprop", 0)
    kinds = fleet.kinds_sent(0)  # stage 1's class counts too: the labels of the whole private set here

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
    psnrs, ssims, ordered, _ = matched(truth01, rec01)
    inversion = Score(psnrs, ssims, None, distance, time.perf_counter() - start, "", ordered)

    p2, s2, ordered2, _ = matched(truth01, to_unit(x, setup.info))
    inputs = Score(p2, s2, None, None, 0.0, "", ordered2)
    return {
        "dstep-inversion": {"score": inversion, "truth": truth, "replay_error": check, "kinds": kinds},
        "server-inputs": {"score": inputs, "truth": truth, "kinds": kinds},
    }, offset
