"""What the methods that keep part of each client's model private have in common.

FedPer and LG-FedAvg (fedper.py, lgfedavg.py), FedGen (fedgen.py), FedCG (fedcg.py) and FedMD-CG
(fedmdcg.py) send named parts of a model, never necessarily the whole of it: the entries under a
prefix (``extractor.*``, ``classifier.*``, ``generator.*``). Here are the pieces they share:

- selecting and renaming those parts, and the checks that a model splits into them;
- where the private part starts (`private_start`): from the run seed like every other site, as in the
  papers' code, or (``private_init = "client"``) from a seed of the client's own, so that sites differ
  and a server that rebuilds only the run's model does not have it. That seed is derived from the run
  seed and the client id, so a server that knows the run seed can still rebuild it (and gradient
  inversion of the shared part's update can go through it); it is not a secret;
- the class counts a client reports (ledger kind ``label-statistics``);
- the round's request to the sampled clients;
- the personal models' metrics. ``local_accuracy`` is FedMD-CG's "local test accuracy": each client's
  own full model (shared part + private part, just after local training) on its own IID shard of the
  test set, sample-weighted over the reporting clients. ``personal_test_accuracy`` is the mean of
  those models on the whole test set (what Standalone reports as ``test_accuracy``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from fedistill.algorithms.base import ClientContext
from fedistill.algorithms.shared.sampling import sample_clients
from fedistill.algorithms.shared.training import evaluate_model, new_model
from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import Message
from fedistill.federation.reply_spec import LOCAL_METRICS, ReplySpec
from fedistill.models.base import CLASSIFIER_PREFIX, Classifier
from fedistill.seeding import derive_seed

#: Parameter names of a generator inside a "parameters" record, next to the model's own names.
GENERATOR_PREFIX = "generator."


# --- named parts of a model ------------------------------------------------------------------------
def part_of(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of a state dict whose names start with `prefix` (one side of the model split)."""
    return {name: value for name, value in state.items() if name.startswith(prefix)}


def prefixed(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """A submodule's own state dict under the names it has inside the whole (`prefix` + name)."""
    return {prefix + name: value for name, value in state.items()}


def unprefixed(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under `prefix`, with the prefix removed (a submodule's own state dict)."""
    return {name.removeprefix(prefix): value for name, value in state.items() if name.startswith(prefix)}


def pair_state(classifier: nn.Module, generator: nn.Module) -> dict[str, torch.Tensor]:
    """A classifier and a feature generator as one record: ``classifier.*`` and ``generator.*`` entries."""
    return prefixed(classifier.state_dict(), CLASSIFIER_PREFIX) | prefixed(
        generator.state_dict(), GENERATOR_PREFIX
    )


def load_pair(state: Mapping[str, torch.Tensor], classifier: nn.Module, generator: nn.Module) -> None:
    """The inverse of :func:`pair_state`: load each module from its entries of `state`."""
    classifier.load_state_dict(unprefixed(state, CLASSIFIER_PREFIX))
    generator.load_state_dict(unprefixed(state, GENERATOR_PREFIX))


def check_split(state: Mapping[str, torch.Tensor], prefix: str, model: str) -> None:
    """Both sides of the split must be non-empty, else the method degenerates to FedAvg or Standalone."""
    shared = part_of(state, prefix)
    if not shared or len(shared) == len(state):
        raise ConfigError(
            f"model {model!r} has {len(shared)} of {len(state)} state entries under {prefix!r}; "
            "partial sharing needs a model split into extractor.* and classifier.* parts"
        )


def private_start(model: nn.Module, ctx: ClientContext, shared_prefix: str) -> None:
    """With ``private_init = "client"``, re-draw every entry outside `shared_prefix` from a per-client seed.

    The model comes from `new_model` under a seed derived from the run seed *and* the client id, so
    the private part is as reproducible as before and differs between sites and from the run's model;
    a server that knows the run seed can derive it too.
    """
    if ctx.config.private_init != "client":
        return
    seed = derive_seed(ctx.config.seed, "private-init", ctx.client_id)
    fresh = new_model(dataclasses.replace(ctx.config, seed=seed), ctx.info).state_dict()
    state = model.state_dict()
    model.load_state_dict({k: v if k.startswith(shared_prefix) else fresh[k] for k, v in state.items()})


def decoupled_model(config: RunConfig, info: DatasetInfo, method: str) -> Classifier:
    """The run's model, which `method` needs split into ``extractor`` and ``classifier`` submodules."""
    model = new_model(config, info)
    if not isinstance(model, Classifier):
        raise ConfigError(
            f"{method} needs a model split into extractor and classifier; {config.model!r} is not"
        )
    check_split(model.state_dict(), CLASSIFIER_PREFIX, config.model)
    return model


# --- what a client reports -------------------------------------------------------------------------
def class_counts(data: ImageSet, num_classes: int) -> torch.Tensor:
    """The number of samples of each class in `data`: the label counts a client sends."""
    return torch.bincount(data.y, minlength=num_classes).to(torch.int64)


def local_report(ctx: ClientContext, model: nn.Module) -> dict[str, float]:
    """The personal model's accuracy on the client's IID test shard and on the whole test set."""
    local = evaluate_model(model, ctx.test, ctx.info)
    personal = evaluate_model(model, ctx.global_test, ctx.info)
    return {
        "local_accuracy": local["accuracy"],
        "local_count": local["count"],
        "personal_test_accuracy": personal["accuracy"],
    }


# --- the server's round ----------------------------------------------------------------------------
def evaluates_local(config: RunConfig, round: int) -> bool:
    """Whether the clients report their personal models' metrics this round (evaluation rounds, the last)."""
    return round % config.eval_every == 0 or round == config.rounds


#: What a personalised method's client adds to its local metrics in evaluation rounds.
PERSONAL_METRICS = (*LOCAL_METRICS, "personal_test_accuracy")


def ask_sampled(
    fleet: Fleet, request: Message, config: RunConfig, round: int, what: str, expect: ReplySpec
) -> list[Message]:
    """Send `request` to the round's sample of clients; the valid replies, at least ``min_clients``.

    In evaluation rounds a valid reply also carries the personal metrics `summarise_local` reads."""
    chosen = sample_clients(fleet.clients, config.fraction, config.seed, round)
    if evaluates_local(config, round):
        expect = expect | ReplySpec(metrics=PERSONAL_METRICS)
    return list(
        successful(
            fleet.broadcast(request, chosen, timeout=config.timeout or None, expect=expect),
            minimum=min(config.min_clients, len(chosen)),
            what=what,
        ).values()
    )


def summarise_local(replies: list[Message]) -> dict[str, float]:
    """Sample-weighted local accuracy and mean personal test accuracy over the reporting clients."""
    local = [float(r.scalar("metrics", "local_accuracy")) for r in replies]
    counts = [float(r.scalar("metrics", "local_count")) for r in replies]
    personal = [float(r.scalar("metrics", "personal_test_accuracy")) for r in replies]
    return {
        "local_accuracy": float(np.average(local, weights=counts)),
        "personal_test_accuracy": float(np.mean(personal)),
    }
