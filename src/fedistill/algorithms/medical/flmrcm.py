"""FL-MRCM (Guo et al., CVPR 2021): FedAvg of reconstruction U-Nets plus cross-site modelling, in which
each source site aligns the latent features of its inputs, adversarially, with those of a target site.

Round r, over messages:

1. ``query.latent_features`` to the target site with the global parameters. It answers with the latent
   vectors (kind ``latent-features``; the bottleneck pooled to 2×2, see `flmrcm_alignment`) of
   ``feature_batches`` mini-batches of its undersampled training slices, drawn by (seed, round) and
   computed by the global model in eval mode (the same as train mode for the reference's instance norm).
2. ``train`` to the target (the global parameters) and to the sampled sources (the global parameters and
   the target's vectors). The target trains on the reconstruction loss alone (the code's ``flag``: no
   adversarial term and no discriminator there). Each source trains on L_rec + ``adversarial_weight`` ·
   L_adv against its own domain discriminator, which learns alongside (one step before each net step,
   RMSprop at ten times the run's lr, as the code), keeps its weights and optimiser state across rounds
   and never leaves the site. Each returns its parameters.
3. FedAvg of every returned model (FedAvgM's momentum if set).

What crosses the boundary: parameters both ways, as FedAvg; and once a round the target's latent
vectors, up to the server and down to every sampled source, which hold them only for that round. Their
cost in privacy: with the global model (which the server and every site hold) they are the encoder's
summary of real, private slices of the target, 4·chans·2^pools numbers each (2048 for the reference net
against 65,536 pixels of a 256² slice), unperturbed; they expose the target's image distribution (their
purpose) and are a starting point for inverting the encoder. Nothing bounds that leakage (no DP here).

Options and where their defaults come from (the released code, ``main_fl_mrcm.py`` and ``recon_Update.py``):
``target_site`` -1, the last client (the code has no default: ``--test_dataset`` must name the site whose
test set is reported, its README using the first, B of BFHI); ``adversarial_weight`` 1 (the code adds
L_adv unweighted); ``discriminator_width`` 256 and ``discriminator_lr`` 0, meaning ten times ``lr`` (the
code's RMSprop at 10 × 1e-4); ``weighting`` uniform (the code's FedAvg, from the federated-learning code
it builds on, is a plain mean); ``feature_batches`` 16, this library's choice (0: every training slice of
the target each round); and FedAvg's ``server_momentum`` and ``server_lr``.

Where this differs from the code, which runs every site in one process:

- there each source step pairs its batch with a fresh target batch, encoded by the source's own live
  net; here the target encodes a sample once a round with the global model and the sources cycle through
  it in seeded random order, so L_adv's target term is a constant at a source (no gradient through it);
- the reconstruction net trains with the run's ``optimizer`` and ``lr``, a fresh optimiser each round as
  in this library's FedAvg, where the code keeps one RMSprop (lr 1e-4, ×0.1 from round 40 on) per site;
- ``fraction`` samples the sources; the target takes part every round;
- the target is always a training site (the code may also align to a site that only lends features);
- FedProx's ``mu`` and differential privacy are refused (the vectors would leave unsanitised).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch import nn

from fedistill.algorithms.base import Algorithm, ClientContext, ServerContext, clone_state, register
from fedistill.algorithms.classic import FedAvgClient, FedAvgOptions, FedAvgServer
from fedistill.algorithms.medical.flmrcm_alignment import (
    FeatureDiscriminator,
    RowStream,
    latent_size,
    target_vectors,
    train_aligned,
)
from fedistill.algorithms.shared.option_checks import check_nonnegative, check_refused
from fedistill.algorithms.shared.sampling import sample_clients
from fedistill.algorithms.shared.training import local_batches
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.client import handles
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message, expect_arrays
from fedistill.federation.reply_spec import ReplySpec
from fedistill.privacy.budget import DP_KEYS
from fedistill.seeding import seeded, torch_generator

if TYPE_CHECKING:
    from fedistill.config import RunConfig

LATENT = "latent-features"
QUERY = "query.latent_features"


@dataclass(frozen=True)
class FLMRCMOptions(FedAvgOptions):
    """FedAvg's options with FL-MRCM's alignment: the target site, the adversarial weight and the
    discriminators."""

    section: ClassVar[str] = "flmrcm"
    weighting: str = "uniform"  # samples | uniform (the code averages the site models plainly)
    target_site: int = -1  # the client whose features the sources align to; -1: the last
    adversarial_weight: float = 1.0  # weight of the alignment's adversarial term in a source site's loss
    discriminator_width: int = 256  # hidden width of each source site's domain discriminator
    discriminator_lr: float = 0.0  # 0: ten times the run's lr (the code)
    feature_batches: int = 16  # mini-batches of latent vectors the target shares a round; 0: all its slices
    #: FedAvg's keys it refuses when set away from their defaults (and `fedistill list --options` leaves out)
    refused_keys: ClassVar[dict[str, str]] = {
        "mu": "is FedProx's proximal weight, and flmrcm uses no proximal term (it aligns the sites' "
        "features instead); leave it at {default}",
        **dict.fromkeys(
            DP_KEYS,
            "is a differential-privacy key, but flmrcm does not offer differential privacy: the target's "
            "latent features would leave unsanitised; leave it at {default}",
        ),
    }

    def validate(self) -> None:
        check_refused("flmrcm", self)  # first: FedAvg's checks would suggest setting dp_enabled
        super().validate()
        if self.target_site < -1:
            raise ConfigError(
                f"flmrcm.target_site must be a client index or -1 (the last), got {self.target_site}"
            )
        check_nonnegative("flmrcm", self, "adversarial_weight discriminator_lr")
        if self.discriminator_width < 1:
            raise ConfigError(f"flmrcm.discriminator_width must be >= 1, got {self.discriminator_width}")
        if self.feature_batches < 0:
            raise ConfigError(f"flmrcm.feature_batches must be >= 0 (0: all), got {self.feature_batches}")

    def check_run(self, config: RunConfig) -> None:
        """FedAvg's checks with the run's common keys, and a target site among the run's clients."""
        super().check_run(config)
        target_of(self, config.clients)


def target_of(options: FLMRCMOptions, clients: int) -> int:
    """The target site's client index; a ConfigError when there is no source or no such client."""
    if clients < 2:
        raise ConfigError(
            f"flmrcm needs a target site and at least one source site: clients >= 2, got {clients}"
        )
    target = clients - 1 if options.target_site == -1 else options.target_site
    if not 0 <= target < clients:
        raise ConfigError(
            f"flmrcm.target_site = {options.target_site} names no client: there are {clients} "
            f"(0-{clients - 1}; -1 picks the last)"
        )
    return target


def check_model(model: nn.Module, name: str) -> None:
    """ConfigError unless the model exposes the bottleneck features the alignment needs (unet-fastmri)."""
    if not hasattr(model, "bottleneck_features"):
        raise ConfigError(f"flmrcm aligns the bottleneck of unet-fastmri; model {name!r} exposes none")


class FLMRCMClient(FedAvgClient):
    """A source site (aligns to the received target features) or the target site (shares them)."""

    def __init__(self, ctx: ClientContext) -> None:
        super().__init__(ctx)
        check_model(self.model, ctx.config.model)
        self.options: FLMRCMOptions = ctx.options
        self.is_target = ctx.client_id == target_of(self.options, ctx.config.clients)
        dim = latent_size(self.model, ctx.info)
        self.local.release()  # as FedAvg's: a site holds its model only while it works
        self.feature_spec = ArraySpec("float32", (None, dim))
        self.discriminator: FeatureDiscriminator | None = None
        if not self.is_target:
            width = self.options.discriminator_width
            self.discriminator = seeded(
                ctx.config.seed,
                lambda: FeatureDiscriminator(dim, width),
                "flmrcm-discriminator",
                ctx.client_id,
            )
            lr = self.options.discriminator_lr or 10 * ctx.config.lr
            self.d_optimizer = torch.optim.RMSprop(self.discriminator.parameters(), lr=lr)

    @handles(QUERY, read_only=True)
    def latent_features(self, message: Message) -> Message:
        """The target's latent vectors of a seeded sample of its training inputs, by the global model."""
        if not self.is_target:
            raise FederationError(
                f"client {self.ctx.client_id} is a source site: only the target shares features"
            )
        try:
            return self._latent_features(message)
        finally:
            self.local.release()

    def _latent_features(self, message: Message) -> Message:
        expect_arrays(message, "parameters", self.specs)
        self.model.load_state_dict(message.tensors("parameters"))
        round, count = int(message.scalar("config", "round")), int(message.scalar("config", "batches"))
        task = self.training.task
        if count == 0:
            size = self.training.batch_size
            batches = task.batches(
                self.ctx.train, self.ctx.info, size, shuffle=False, generator=None, augment=False
            )
        else:
            spec = replace(self.training, steps=count, augment=False)
            generator = torch_generator(
                self.ctx.config.seed, "flmrcm-target-sample", self.ctx.client_id, round
            )
            batches = local_batches(self.ctx.train, self.ctx.info, spec, generator)
        rows = target_vectors(self.model, task, batches)
        return Message.build(QUERY, arrays={LATENT: {"features": rows}})

    def local_update(self, message: Message, generator: torch.Generator) -> dict[str, float]:
        if self.discriminator is None:
            if LATENT in message.arrays:
                raise FederationError(
                    f"client {self.ctx.client_id} is the target site: it aligns to no features"
                )
            return super().local_update(message, generator)
        expect_arrays(message, LATENT, {"features": self.feature_spec})
        rows = message.tensor(LATENT, "features")
        if len(rows) == 0:
            raise FederationError(f"client {self.ctx.client_id} received no target features to align to")
        round = int(message.scalar("config", "round"))
        draws = torch_generator(self.ctx.config.seed, "flmrcm-target-draws", self.ctx.client_id, round)
        return train_aligned(
            self.model,
            self.discriminator,
            self.d_optimizer,
            self.ctx.train,
            self.ctx.info,
            self.training,
            generator,
            RowStream(rows, draws),
            self.options.adversarial_weight,
        )

    def state_dict(self) -> dict:
        if self.discriminator is None:
            return super().state_dict()
        return {
            "discriminator": clone_state(self.discriminator),
            "d_optimizer": self.d_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if self.discriminator is None:
            super().load_state_dict(state)
            return
        self.discriminator.load_state_dict(state["discriminator"])
        self.d_optimizer.load_state_dict(state["d_optimizer"])


class FLMRCMServer(FedAvgServer):
    """FedAvg's server; each round it first asks the target for its features and hands them to the sources."""

    reply_metrics = ("alignment_loss", "discriminator_loss")

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        check_model(self.model, ctx.config.model)
        self.options: FLMRCMOptions = ctx.options
        self.target = target_of(self.options, ctx.num_clients)
        self.feature_spec = ArraySpec("float32", (None, latent_size(self.model, ctx.info)))

    def participants(self, fleet: Fleet, round: int) -> list[int]:
        config = self.ctx.config
        sources = [c for c in fleet.clients if c != self.target]
        return sorted([self.target, *sample_clients(sources, config.fraction, config.seed, round)])

    def requests(self, fleet: Fleet, round: int, request: Message, chosen: list[int]) -> dict[int, Message]:
        features = self._target_features(fleet, round)
        aligned = Message.build(
            request.type, arrays={**request.arrays, LATENT: {"features": features}}, scalars=request.scalars
        )
        return {client: request if client == self.target else aligned for client in chosen}

    def _target_features(self, fleet: Fleet, round: int) -> np.ndarray:
        query = Message.build(
            QUERY,
            arrays={"parameters": self.model.state_dict()},
            scalars={"config": {"round": round, "batches": self.options.feature_batches}},
        )
        expect = ReplySpec({LATENT: {"features": self.feature_spec}})
        sent = fleet.send({self.target: query}, timeout=self.ctx.config.timeout or None, expect=expect)
        reply = successful(sent, what=f"latent features (target site {self.target})")[self.target]
        features = reply.array(LATENT, "features")
        if len(features) == 0:
            raise FederationError(f"round {round}: target site {self.target} sent no latent features")
        return features


register(
    Algorithm(
        "flmrcm",
        "FL-MRCM: FedAvg + adversarial alignment of source sites' latent features to a target site's",
        FLMRCMClient,
        FLMRCMServer,
        FLMRCMOptions,
        tasks=("reconstruction",),
    )
)
