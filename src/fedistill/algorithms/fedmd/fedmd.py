"""FedMD (Li and Wang 2019, "FedMD: Heterogenous Federated Learning via Model Distillation").

Every client owns a model of its own architecture (`fedmd.models`, a comma list cycled over the
clients; "" = the run's model) and never sends it. There is a labelled public set (`public`, see
`public_data.py`).

Set-up, transfer learning (`train.transfer`): the server sends the labelled public set; each client
trains on it for `transfer_epochs`, then on its private data for `private_epochs`. Round t:

1. Communicate (`query.scores`): the server sends `alignment_size` public images drawn from the run
   seed and t (the paper: 5000); each client returns its class scores on them, the pre-softmax
   outputs (kind `logits`).
2. Aggregate: the consensus is the plain mean of the scores of the clients that answered.
3. Distribute and digest (`train`): the server sends the same images with the consensus; each client
   trains its model towards it for `digest_epochs` epochs (Adam, `digest_lr`, batches of
   `digest_batch_size`, a fresh optimiser each round) with `digest_loss`: `l1`, the mean absolute
   error between scores and consensus (the paper's choice), `mse`, or `kl`, KL(softmax(consensus) ||
   softmax(scores)).
4. Revisit: it then trains on its private data with the run's common local training (`local_epochs`
   or `local_steps`, `batch_size`, `optimizer`, `lr`), a fresh optimiser each round, and returns
   metrics only.

What crosses: public images and labels (down, once), public images (down, twice a round), scores
(up, `logits`), the consensus (down, `logits`) and metrics. Never parameters.

The server sends the round's public images themselves rather than their indices: a client then keeps
no copy of the public set between requests (its state is its model alone, which keeps checkpoints
and stateful transports small), and the ledger records exactly which public images each client saw.
The price is the images' bytes twice a round (8x8 digits: 64 bytes each; 5000 MNIST images: 3.9 MB).

Metrics. The clients evaluate their own models (`evaluate`) and send only numbers. `test_accuracy`
is the mean over the clients of each client's own model's accuracy on the whole test set (the paper
reports each party's test accuracy; Standalone reports the same mean), with `test_accuracy_std`,
`_min`, `_max` and, for mixed architectures, `test_accuracy_<model>`; `local_accuracy` is the
sample-weighted accuracy of each client's model on its own IID share of the test set. The final
metrics add `start_test_accuracy` and `start_local_accuracy`, the same after transfer learning and
before the first round: each party's model without collaboration, the paper's baseline. Each round
also reports `consensus_accuracy`, the consensus's accuracy on the round's public images (the server
knows their labels: they are public).
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

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
from fedistill.algorithms.shared.option_checks import check_choices, check_model_names, check_positive
from fedistill.algorithms.shared.sampling import sample_clients
from fedistill.algorithms.shared.training import (
    LocalTraining,
    check_finite,
    evaluate_model,
    has_dropout,
    new_model,
    train_local,
)
from fedistill.config import RunConfig
from fedistill.data.base import ImageSet
from fedistill.data.transforms import to_float
from fedistill.errors import ConfigError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message, expect_arrays
from fedistill.federation.plausibility import magnitude_faults, screen
from fedistill.federation.reply_spec import LOCAL_METRICS, NUM_SAMPLES, TRAIN_LOSS, ReplySpec
from fedistill.seeding import derive_seed, global_rng, torch_generator

DIGEST_LOSSES = ("l1", "mse", "kl")
#: What a client reports of its own model (evaluation only; `evaluate` and the set-up's reply).
EVAL_METRICS = ("test_accuracy", "test_loss", *LOCAL_METRICS)


@dataclass(frozen=True)
class FedMDOptions:
    """`[fedmd]` options. Revisiting uses the common local-training keys (local_epochs, lr, ...)."""

    models: str = ""  # comma list of model names cycled over the clients; "" = the run's model
    public: str = "holdout"  # holdout | dataset:<name> (labelled; see public_data.py)
    #: The options that name models (`check_model_names`; the run checks each serves its task)
    model_keys: ClassVar[str] = "models"
    public_size: int = 0  # a random subset of the public source; <= 0: all of it
    alignment_size: int = 5000  # public images per round (the paper's 5000); at most the public set
    transfer_epochs: int = 5  # set-up: epochs on the labelled public set
    private_epochs: int = 5  # set-up: then epochs on the private data
    digest_loss: str = "l1"  # l1 (the paper) | mse | kl
    digest_epochs: int = 1  # epochs of the digest (training towards the consensus) per round
    digest_batch_size: int = 128  # batch size of the digest
    digest_lr: float = 1e-3  # the digest's Adam learning rate
    # drop a site whose scores are far beyond the other sites' (federation/plausibility.py): the consensus
    # is a plain mean, so one site's scores scaled by 1e30 would be every site's digest target
    plausibility_checks: bool = True

    def check_run(self, config: RunConfig) -> None:
        """What the options rule out with the run's common keys, checked before the run writes anything."""
        check_public_run(self.public, "fedmd.public", config)

    def validate(self) -> None:
        """Check the digest loss, the labelled public data and the epochs, sizes and learning rate."""
        check_choices("fedmd", self, {"digest_loss": DIGEST_LOSSES})
        check_model_names("fedmd", self, self.model_keys)
        check_public(self.public, "fedmd.public", labelled=True, size=self.public_size)
        check_positive("fedmd", self, "alignment_size digest_epochs digest_batch_size digest_lr")
        for key in ("transfer_epochs", "private_epochs"):
            if getattr(self, key) < 0:
                raise ConfigError(f"fedmd.{key} must be >= 0, got {getattr(self, key)}")


def model_of(options: FedMDOptions, config: RunConfig, client_id: int) -> str:
    """The architecture of client `client_id`'s model: `fedmd.models` cycled over the clients."""
    names = model_cycle(options.models, config.model, key="fedmd.models")
    return names[client_id % len(names)]


# ------------------------------------------------------------------------------------------------
# The method's two defining steps
# ------------------------------------------------------------------------------------------------
def consensus(scores: list[torch.Tensor]) -> torch.Tensor:
    """The server's aggregate: the plain mean of the clients' scores (N, C) on the same images."""
    return torch.stack([s.float() for s in scores]).mean(0)


def digest_loss(scores: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """How far a client's scores (B, C) are from the consensus (B, C): l1 and mse average over every
    entry; kl is KL(softmax(target) || softmax(scores)), summed over classes, averaged over samples."""
    if kind == "l1":
        return (scores - target).abs().mean()
    if kind == "mse":
        return ((scores - target) ** 2).mean()
    if kind == "kl":
        return F.kl_div(F.log_softmax(scores, -1), F.softmax(target, -1), reduction="batchmean")
    raise ConfigError(f"unknown fedmd.digest_loss {kind!r}; choose one of {', '.join(DIGEST_LOSSES)}")


def alignment_indices(size: int, count: int, seed: int, round: int) -> torch.Tensor:
    """The round's public images: `count` of `size` drawn from (seed, round), sorted; all if count >= size."""
    if count >= size:
        return torch.arange(size)
    return (
        torch.randperm(size, generator=torch_generator(seed, "fedmd-alignment", round))[:count].sort().values
    )


# ------------------------------------------------------------------------------------------------
# Client
# ------------------------------------------------------------------------------------------------
class FedMDClient(ClientLogic):
    """Owns its model; answers with scores on public images and with metrics, never with parameters."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: FedMDOptions = ctx.options
        self.model = new_model(ctx.config, ctx.info, model_of(self.options, ctx.config, ctx.client_id))
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    def _generator(self, purpose: str, round: int = 0) -> torch.Generator:
        return torch_generator(self.ctx.config.seed, purpose, self.ctx.client_id, round)

    def _epochs(self, data: ImageSet, epochs: int, purpose: str) -> float:
        spec = dataclasses.replace(self.training, epochs=epochs, steps=0)
        return train_local(self.model, data, self.ctx.info, spec, self._generator(purpose))["train_loss"]

    @handles("train.transfer")
    def transfer(self, message: Message) -> Message:
        """Set-up: the labelled public set, then the private data."""
        images, labels = read_public(message, self.ctx.info, labelled=True)
        metrics: dict[str, float] = {NUM_SAMPLES: len(self.ctx.train)}
        if self.options.transfer_epochs:
            public = ImageSet(images.clone(), labels.clone())
            metrics["transfer_loss"] = self._epochs(public, self.options.transfer_epochs, "fedmd-transfer")
        if self.options.private_epochs:
            metrics[TRAIN_LOSS] = self._epochs(self.ctx.train, self.options.private_epochs, "fedmd-private")
        return Message.build("train.transfer", scalars={"metrics": metrics | self._report()})

    @handles("query.scores", read_only=True)
    def scores(self, message: Message) -> Message:
        """The model's class scores on the round's public images, for the server's consensus."""
        images, _ = read_public(message, self.ctx.info, labelled=False)
        scores = predict(self.model, images, self.ctx.info)
        return Message.build("query.scores", arrays={"logits": {"scores": scores}})

    @handles("train")
    def train(self, message: Message) -> Message:
        """Digest the consensus on the round's public images, then revisit the private data."""
        images, _ = read_public(message, self.ctx.info, labelled=False)
        expect_arrays(
            message, "logits", {"consensus": ArraySpec("float32", (len(images), self.ctx.info.num_classes))}
        )
        round = int(message.scalar("config", "round"))
        digest = self._digest(to_float(images, self.ctx.info), message.tensor("logits", "consensus"), round)
        revisit = train_local(
            self.model, self.ctx.train, self.ctx.info, self.training, self._generator("fedmd-revisit", round)
        )
        metrics = {NUM_SAMPLES: len(self.ctx.train), "digest_loss": digest, TRAIN_LOSS: revisit["train_loss"]}
        return Message.build("train", scalars={"metrics": metrics})

    def _digest(self, x: torch.Tensor, target: torch.Tensor, round: int) -> float:
        """`digest_epochs` epochs of Adam on the digest loss; returns the mean loss of the last epoch. Dropout
        masks come from torch's global RNG, seeded per step from the digest's own stream (as in
        `train_local`), so a resumed run draws what an uninterrupted one does."""
        options = self.options
        optimizer = torch.optim.Adam(self.model.parameters(), lr=options.digest_lr)
        generator = self._generator("fedmd-digest", round)
        dropout_seed = generator.initial_seed() if has_dropout(self.model) else None
        size = options.digest_batch_size
        drop_last = len(x) > size  # never a final batch of 1 under BatchNorm
        self.model.train()
        step, total, count = 0, 0.0, 0
        for _ in range(options.digest_epochs):
            order = torch.randperm(len(x), generator=generator)
            total, count = 0.0, 0
            for start in range(0, len(x), size):
                index = order[start : start + size]
                if drop_last and len(index) < size:
                    break
                dropout = (
                    global_rng(derive_seed(dropout_seed, "dropout", step))
                    if dropout_seed is not None
                    else nullcontext()
                )
                with dropout:
                    scores = self.model(x[index])
                loss = digest_loss(scores, target[index], options.digest_loss)
                check_finite(loss, "FedMD's digest", step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.item() * len(index)
                count += len(index)
                step += 1
        return total / max(count, 1)

    def _report(self) -> dict[str, float]:
        test = evaluate_model(self.model, self.ctx.global_test, self.ctx.info)
        local = evaluate_model(self.model, self.ctx.test, self.ctx.info)
        return {
            "test_accuracy": test["accuracy"],
            "test_loss": test["loss"],
            "local_accuracy": local["accuracy"] if local["count"] else 0.0,
            "local_count": local["count"],
        }

    @handles("evaluate", read_only=True)
    def evaluate(self, message: Message) -> Message:
        """Report the model's accuracies (global test set and local test shard)."""
        return Message.build("evaluate", scalars={"metrics": self._report()})

    def state_dict(self) -> dict[str, Any]:
        return {"model": clone_state(self.model)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])


# ------------------------------------------------------------------------------------------------
# Server
# ------------------------------------------------------------------------------------------------
class FedMDServer(ServerLogic):
    """Holds the public set and the consensus; never a client model."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.options: FedMDOptions = ctx.options
        self.public = build_public(
            self.options.public, ctx, size=self.options.public_size, key="fedmd.public", labelled=True
        )
        self.cycle = model_cycle(self.options.models, ctx.config.model, key="fedmd.models")
        self.start: dict[str, float] = {}  # the clients' models after transfer learning

    def _timeout(self) -> float | None:
        return self.ctx.config.timeout or None

    def _minimum(self, asked: int) -> int:
        return min(self.ctx.config.min_clients, asked)

    def setup(self, fleet: Fleet) -> None:
        request = Message.build(
            "train.transfer", arrays={PUBLIC: public_arrays(self.public.images, self.public.labels)}
        )
        expect = ReplySpec(metrics=(NUM_SAMPLES, *EVAL_METRICS))
        replies = successful(
            fleet.broadcast(request, timeout=self._timeout(), expect=expect),
            minimum=self._minimum(len(fleet.clients)),
            what="transfer-learning metrics",
        )
        self.start = {
            f"start_{k}": v for k, v in summarise(replies, self.cycle).items() if not k.endswith("loss")
        }

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        config, options, info = self.ctx.config, self.options, self.ctx.info
        chosen = sample_clients(fleet.clients, config.fraction, config.seed, round)
        index = alignment_indices(len(self.public), options.alignment_size, config.seed, round)
        images = self.public.images[index]
        settings = {"config": {"round": round}}
        ask = Message.build("query.scores", arrays={PUBLIC: public_arrays(images)}, scalars=settings)
        spec = ReplySpec({"logits": {"scores": ArraySpec("float32", (len(index), info.num_classes))}})
        sent = fleet.broadcast(ask, chosen, timeout=self._timeout(), expect=spec)
        scored = successful(
            screen(fleet, sent, magnitude_faults) if options.plausibility_checks else sent,
            minimum=self._minimum(len(chosen)),
            what="scores on the public images",
        )
        clients = sorted(scored)
        agreed = consensus([scored[c].tensor("logits", "scores") for c in clients])
        digest = Message.build(
            "train",
            arrays={PUBLIC: public_arrays(images), "logits": {"consensus": agreed}},
            scalars=settings,
        )
        expect = ReplySpec(metrics=(NUM_SAMPLES, "digest_loss", TRAIN_LOSS))
        done = successful(
            fleet.broadcast(digest, clients, timeout=self._timeout(), expect=expect),
            minimum=self._minimum(len(clients)),
            what="digest and revisit metrics",
        )
        counts = [float(r.scalar("metrics", NUM_SAMPLES)) for r in done.values()]
        metrics = {
            "clients": len(done),
            "digest_loss": float(np.mean([float(r.scalar("metrics", "digest_loss")) for r in done.values()])),
            TRAIN_LOSS: float(
                np.average([float(r.scalar("metrics", TRAIN_LOSS)) for r in done.values()], weights=counts)
            ),
            "alignment_size": len(index),
        }
        assert self.public.labels is not None  # a labelled source (FedMDOptions.validate)
        labels = self.public.labels[index].to(agreed.device)
        metrics["consensus_accuracy"] = float((agreed.argmax(1) == labels).float().mean())
        return metrics

    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        request = Message.build("evaluate", scalars={"config": {"round": round}})
        replies = successful(
            fleet.broadcast(request, timeout=self._timeout(), expect=ReplySpec(metrics=EVAL_METRICS)),
            what="the clients' test metrics",
        )
        return summarise(replies, self.cycle)

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        return dict(last) | self.start

    def state_dict(self) -> dict[str, Any]:
        return {"start": dict(self.start)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = {k: float(v) for k, v in state.get("start", {}).items()}


def summarise(replies: dict[int, Message], cycle: list[str]) -> dict[str, float]:
    """The clients' own models: mean (std, min, max) test accuracy, per architecture when mixed, and
    sample-weighted local accuracy."""
    clients = sorted(replies)
    value = lambda c, name: float(replies[c].scalar("metrics", name))  # noqa: E731
    accuracy = np.array([value(c, "test_accuracy") for c in clients])
    metrics = {
        "test_accuracy": float(accuracy.mean()),
        "test_loss": float(np.mean([value(c, "test_loss") for c in clients])),
        "test_accuracy_std": float(accuracy.std()),
        "test_accuracy_min": float(accuracy.min()),
        "test_accuracy_max": float(accuracy.max()),
    }
    if len(set(cycle)) > 1:
        for name in dict.fromkeys(cycle):
            mine = [value(c, "test_accuracy") for c in clients if cycle[c % len(cycle)] == name]
            if mine:
                metrics[f"test_accuracy_{name}"] = float(np.mean(mine))
    counts = np.array([value(c, "local_count") for c in clients])
    if counts.sum() > 0:
        local = np.array([value(c, "local_accuracy") for c in clients])
        metrics["local_accuracy"] = float(np.average(local, weights=counts))
    return metrics


register(
    Algorithm(
        "fedmd",
        "FedMD: transfer learning, then rounds of digesting the mean of the clients' public scores and "
        "revisiting private data; test_accuracy is the mean of the clients' own models on the test set",
        FedMDClient,
        FedMDServer,
        FedMDOptions,
    )
)
