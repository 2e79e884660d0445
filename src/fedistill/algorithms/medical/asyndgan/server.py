"""AsynDGAN's server: the central G, its steps from the sites' input-gradients, the segmenter S trained on
G's pairs, model selection on the sites' validation splits, and checkpoints.

Everything random derives from (seed, purpose, step): the masks drawn, G's noise and dropout, S's batches.
With the state below in the checkpoint (G, S, their optimisers, the step, the uploaded masks) and each
site's (D_k, its optimiser, its upload order), a resumed run ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from fedistill import devices
from fedistill.algorithms.base import ServerContext, ServerLogic, clone_state
from fedistill.algorithms.medical.asyndgan.client import STEP_METRICS, condition_classes
from fedistill.algorithms.medical.asyndgan.options import AsynDGANOptions, lr_factor
from fedistill.algorithms.shared import site_shares as draws
from fedistill.algorithms.shared.mask_upload import collect_masks
from fedistill.algorithms.shared.schedules import set_lr
from fedistill.algorithms.shared.selection import (
    clients_validation_score,
    keep_if_best,
    nothing_selected,
    with_selected_score,
)
from fedistill.algorithms.shared.training import LocalTraining, check_finite, new_model, task_of, test_metrics
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import NUM_SAMPLES, ReplySpec
from fedistill.models.pix2pix import build_conditional_generator, one_hot_mask
from fedistill.plots import plot_image_grid
from fedistill.seeding import derive_seed, global_rng, seeded, torch_generator
from fedistill.tasks.per_pixel_batches import joint_flip_rotate

log = logging.getLogger(__name__)

SELECTION_LABELS = {"validation": "best on the clients' validation splits", "last": "last epoch"}


class AsynDGANServer(ServerLogic):
    """AsynDGAN's server: the central generator learns from the sites' discriminators, and a segmenter is
    trained on its pairs."""

    #: Why `recalibrate_norm` does not apply (engine/norm_statistics.py)
    not_recalibrated = "its segmenter learned from the generator's images"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, info = ctx.config, ctx.info
        self.options: AsynDGANOptions = ctx.options
        options = self.options
        options.check_run(config)
        self.task = task_of(config, info)
        self.classes = condition_classes(self.task, info)
        self.generator = seeded(
            config.seed,
            lambda: build_conditional_generator(
                info,
                self.classes,
                noise_channels=options.noise_channels,
                width=options.generator_width,
                blocks=options.generator_blocks,
                dropout=options.dropout,
            ),
            "generator-init",
        )
        self.segmenter = new_model(config, info)
        self.training = LocalTraining.from_config(config, info)  # S trains as a site's local model does
        self.g_optimizer = torch.optim.Adam(
            self.generator.parameters(), lr=options.lr_generator, betas=(options.beta1, 0.999)
        )
        self.s_optimizer = self.training.make_optimizer(self.segmenter.parameters())
        self.clients: list[int] = []
        self.sizes = torch.zeros(0)  # each site's training-set size (its pi_k)
        self.pools: list[torch.Tensor] = []  # each site's uploaded masks
        self.iters = 0
        self.step = 0
        self.best: dict[str, Any] = nothing_selected()

    # --- round 0: the masks, once ----------------------------------------------------------------
    def setup(self, fleet: Fleet) -> None:
        options, size = self.options, self.ctx.info.image_size
        self.clients = list(fleet.clients)
        if options.synthetic_batch_size < len(self.clients):
            raise ConfigError(
                f"asyndgan.synthetic_batch_size = {options.synthetic_batch_size} is below the number of "
                f"sites ({len(self.clients)}); every G-step draws at least one mask per site"
            )
        self.pools, replies = collect_masks(
            fleet,
            self.clients,
            size=size,
            limit=options.mask_pool,
            timeout=self.ctx.config.timeout or None,
            classes=self.classes,
            metrics=(NUM_SAMPLES,),
        )
        self.sizes = torch.tensor([float(replies[c].scalar("metrics", NUM_SAMPLES)) for c in self.clients])
        if float(self.sizes.sum()) <= 0:
            raise FederationError("every site reports 0 training samples; AsynDGAN cannot weight them")
        per_site = draws.shares(self._weights(), options.synthetic_batch_size)
        needed = [math.ceil(len(pool) / int(n)) for pool, n in zip(self.pools, per_site, strict=True)]
        if options.iters_per_epoch == "max":
            self.iters = max(needed)
        elif options.iters_per_epoch == "min":
            self.iters = min(needed)
        else:
            self.iters = int(options.iters_per_epoch)
        uploads = [len(pool) for pool in self.pools]
        log.info("AsynDGAN: sites uploaded %s masks; %d G-steps per round", uploads, self.iters)

    def _weights(self) -> torch.Tensor:
        """Each site's share of a batch: pi_k = n_k / n, or 1 / K (`site_shares`)."""
        if self.options.site_shares == "uniform":
            return torch.full((len(self.clients),), 1.0 / len(self.clients))
        return self.sizes / self.sizes.sum()

    # --- G ------------------------------------------------------------------------------------------
    def _generate(self, masks: torch.Tensor, rng: torch.Generator, *purpose: object) -> torch.Tensor:
        """G's images of `masks` (noise channels from `rng`; dropout from a stream seeded by `purpose`)."""
        condition = one_hot_mask(masks, self.classes)
        noise = self.generator.sample_noise(condition, rng) if self.generator.noise_channels else None
        with global_rng(derive_seed(self.ctx.config.seed, "asyndgan-dropout", *purpose)):  # CUDA's too
            return self.generator(condition, noise)

    def _sample(self, masks: torch.Tensor, rng: torch.Generator, *purpose: object) -> torch.Tensor:
        """G's images as `_generate` draws them (train mode, as pix2pix draws at test time), without a
        graph and without touching G's batch-norm statistics: only G-steps change G."""
        generator = self.generator
        state = (dict(generator.named_parameters()), {n: b.clone() for n, b in generator.named_buffers()})
        condition = one_hot_mask(masks, self.classes)
        noise = generator.sample_noise(condition, rng) if generator.noise_channels else None
        with torch.no_grad(), global_rng(derive_seed(self.ctx.config.seed, "asyndgan-dropout", *purpose)):
            return functional_call(generator, state, (condition, noise))

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        options = self.options
        factor = lr_factor(options.schedule, round, self.ctx.config.rounds)
        set_lr(self.g_optimizer, options.lr_generator * factor)
        values: dict[str, list[float]] = {}
        steps = tqdm(range(self.iters), desc=f"round {round} G-steps", leave=False,
                     disable=not self.ctx.progress, file=sys.stderr)  # fmt: skip
        for _ in steps:
            for key, value in self.generator_step(fleet, options.lr_discriminator * factor).items():
                values.setdefault(key, []).append(value)
        metrics = {key: float(np.mean(v)) for key, v in values.items()}
        metrics["lr_generator"] = options.lr_generator * factor
        if round >= options.segmenter_start:
            metrics["loss_segmenter"] = self.train_segmenter(round)
        self._samples(round)
        return metrics

    def generator_step(self, fleet: Fleet, lr_discriminator: float) -> dict[str, float]:
        """One G-step: draw masks per site, generate, send each site its own samples (`query.adversarial`),
        and step G on the input-gradients that come back, site k's (the gradient of its mean terms over its
        samples) weighted by pi_k renormalised over the sites that answered, so G descends
        sum_k pi_k E_k[GAN + w_l1 * L1 (+ perceptual)] whatever number of samples each site got (a batch
        gives every site at least one and rounds the rest)."""
        options, config, info = self.options, self.ctx.config, self.ctx.info
        batch = options.synthetic_batch_size
        rng = torch_generator(config.seed, "asyndgan-draw", self.step)
        owner = draws.owners(self._weights(), batch, torch_generator(config.seed, "site-shares", self.step))
        masks, pair = draws.from_uploads(self.pools, owner, rng)
        self.generator.train()
        x = self._generate(masks, rng, "g-step", self.step)
        settings = {"step": self.step, "lr_discriminator": lr_discriminator, "w_l1": options.w_l1}
        if options.w_perceptual:
            settings["w_perceptual"] = options.w_perceptual
        requests, expect = {}, {}
        for i, cid in enumerate(self.clients):
            rows = owner == i
            arrays = {
                "synthetic-inputs": {"x": x[rows].detach(), "pair": pair[rows]},
                "label-masks": {"m": masks[rows].to(torch.uint8)},
            }
            requests[cid] = Message.build("query.adversarial", arrays=arrays, scalars={"config": settings})
            shape = (int(rows.sum()), info.channels, info.image_size, info.image_size)
            expect[cid] = ReplySpec({"input-gradients": {"x": ArraySpec("float32", shape)}}, STEP_METRICS)
        replies = successful(
            fleet.send(requests, step=self.step, timeout=config.timeout or None, expect=expect),
            minimum=min(config.min_clients, len(self.clients)),
            what="input-gradients",
        )
        pi = self._weights()
        answered = float(sum(pi[i] for i, cid in enumerate(self.clients) if cid in replies))
        grad = torch.zeros_like(x)
        for i, cid in enumerate(self.clients):
            if cid in replies:
                grad[owner == i] = replies[cid].tensor("input-gradients", "x") * (float(pi[i]) / answered)
        self.g_optimizer.zero_grad(set_to_none=True)
        x.backward(grad)
        self.g_optimizer.step()
        self.step += 1

        def mean(name: str) -> float:
            return float(np.mean([float(r.scalar("metrics", name)) for r in replies.values()]))

        return {
            "loss_discriminator": mean("d_loss"),
            "loss_gan": mean("gan_loss"),
            "loss_l1": mean("l1_loss"),
        }

    # --- S ------------------------------------------------------------------------------------------
    def train_segmenter(self, round: int) -> float:
        """`segmenter_steps` steps of S on fresh pairs (G(m), m), with the run's augmentation of a pair
        (`augment`). Every uploaded mask is equally likely, as in the paper's synthetic set (G applied to
        the sites' masks), whatever `site_shares` G's batches follow."""
        batch = self.training.batch_size
        steps = self.options.segmenter_steps or math.ceil(sum(len(pool) for pool in self.pools) / batch)
        self.segmenter.train()
        losses = []
        for j in range(steps):
            rng = torch_generator(self.ctx.config.seed, "asyndgan-segmenter", round, j)
            masks = draws.uniform_over_uploads(self.pools, batch, rng)
            x = self._sample(masks, rng, "segmenter", round, j)
            if self.training.augment:  # flips and right-angle turns of the pair, as a site's batches
                x, masks = joint_flip_rotate(x, masks, rng)
            loss = self.task.loss(self.task.predict(self.segmenter, x), masks)
            check_finite(loss, "the segmenter on G's images", j)
            self.s_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.s_optimizer.step()
            losses.append(loss.item())
        return float(np.mean(losses))

    def _samples(self, round: int) -> None:
        """A grid of masks above G's images of them."""
        every = self.options.samples_every
        if not every or round % every or self.ctx.run_dir is None:
            return
        rng = torch_generator(self.ctx.config.seed, "asyndgan-samples")
        masks, _ = draws.from_uploads(self.pools, draws.owners(self._weights(), 8), rng)
        images = self._sample(masks, rng, "samples", round)
        unit = (images * self.generator.std + self.generator.mean).cpu().numpy()
        shown = (
            (masks.float() / max(self.classes - 1, 1))[:, None]
            .expand(-1, unit.shape[1], -1, -1)
            .cpu()
            .numpy()
        )
        plot_image_grid(
            np.concatenate([shown, unit]),
            self.ctx.run_dir / "plots" / f"synthetic_epoch_{round:04d}.png",
            labels=["mask"] * 8 + ["G(mask)"] * 8,
            title=f"G samples, round {round}",
        )

    # --- evaluation and model selection --------------------------------------------------------------
    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        metrics = test_metrics(self.ctx.evaluate(self.segmenter))
        if round < self.options.segmenter_start:
            return metrics  # S has not trained yet: nothing to select
        headline = self.task.headline
        score = float(round)
        if self.options.selection == "validation":
            score = clients_validation_score(
                fleet,
                "evaluate.segmenter",
                self.segmenter,
                f"val_{headline}",
                clients=self.clients,
                timeout=self.ctx.config.timeout or None,
            )
            metrics[f"val_{headline}"] = score
        self.best = keep_if_best(self.best, score, round, self.segmenter)
        return metrics

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        final = dict(last)
        if self.best["state"] is not None:
            self.segmenter.load_state_dict(self.best["state"])
            final |= test_metrics(self.ctx.evaluate(self.segmenter)) | {"selected_epoch": self.best["epoch"]}
            if self.options.selection == "validation":
                final = with_selected_score(final, self.best, f"val_{self.task.headline}")
        final["selection"] = SELECTION_LABELS[self.options.selection]  # type: ignore[assignment]
        return final

    def models(self) -> dict[str, nn.Module]:
        return {"segmenter": self.segmenter, "generator": self.generator}

    def state_dict(self) -> dict:
        return {
            "generator": clone_state(self.generator),
            "segmenter": clone_state(self.segmenter),
            "g_optimizer": self.g_optimizer.state_dict(),
            "s_optimizer": self.s_optimizer.state_dict(),
            "step": self.step,
            "iters": self.iters,
            "best": self.best,
            "clients": self.clients,
            "sizes": self.sizes,
            "pools": {str(i): pool for i, pool in enumerate(self.pools)},
        }

    def load_state_dict(self, state: dict) -> None:
        self.generator.load_state_dict(state["generator"])
        self.segmenter.load_state_dict(state["segmenter"])
        self.g_optimizer.load_state_dict(state["g_optimizer"])
        self.s_optimizer.load_state_dict(state["s_optimizer"])
        self.step, self.iters = int(state["step"]), int(state["iters"])
        self.best = state["best"]
        self.clients = [int(c) for c in state["clients"]]
        self.sizes = state["sizes"]
        # a checkpoint reads back on the CPU; the masks condition G, which is on the run's device
        self.pools = [devices.on_device(state["pools"][str(i)]) for i in range(len(state["pools"]))]
