"""FedIOD's server: stage 1's federation facts, the distillation step (G's update from what the
clients return), model selection on the clients' validation splits, and checkpoints.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from fedistill import devices
from fedistill.algorithms.base import (
    ServerContext,
    ServerLogic,
    StopRun,
    clone_state,
)
from fedistill.algorithms.fediod import draws
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.calibration import calibrated
from fedistill.algorithms.fediod.options import (
    cosine_lr,
    network_widths,
    resolve_options,
    set_lr,
)
from fedistill.algorithms.fediod.reference import teacher_report, upload_masks
from fedistill.algorithms.fediod.student import StudentSteps
from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.algorithms.stage1 import teachers_from_cache
from fedistill.algorithms.synthetic_pool import SyntheticPool
from fedistill.algorithms.training import new_model, task_of
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import TRAIN_METRICS, ReplySpec
from fedistill.models.generator import build_generator
from fedistill.models.pix2pix import build_conditional_generator
from fedistill.privacy.budget import (
    epsilon_summary,
    epsilons_of,
    refusal_reason,
)
from fedistill.seeding import seeded, torch_generator

log = logging.getLogger(__name__)


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
            return torch.full((len(clients), num_classes), 1.0 / len(clients), device=self.sizes.device)
        return L.class_share(torch.stack([self.counts[self.clients.index(c)] for c in clients]).float())


class FedIODServer(StudentSteps, ServerLogic):
    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, info = ctx.config, ctx.info
        self.options = options = resolve_options(config, ctx.options)
        if options.selection == "validation" and config.val_fraction == 0:
            raise ConfigError(
                "fediod.selection = 'validation' needs validation splits: set val_fraction > 0 "
                "or fediod.selection = 'last'"
            )
        self.view = TaskView(task_of(config, info), info, config.seed)
        self.generator = seeded(config.seed, self._build_generator, "generator-init")
        self.student = new_model(config, info, options.student or config.model)
        if options.channels_last:
            self.generator.to(memory_format=torch.channels_last)
            self.student.to(memory_format=torch.channels_last)
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
        self.collapsed_epochs = 0  # epochs in a row with a collapsed G (`collapse_patience`)
        self.mask_pools: list[
            torch.Tensor
        ] = []  # each site's uploaded masks (dense tasks, mask_source clients)
        if options.dp_enabled:
            log.info(
                "FedIOD with DP: input-gradients clipped to %g, accounting %r at delta %g; logits, density "
                "ratios and stage 1 are not covered (see the fediod module docstring)",
                options.dp_clip_norm,
                options.dp_accounting,
                options.dp_delta,
            )

    @property
    def _teacher_val_metric(self) -> str:
        return f"teacher_val_{self.view.task.headline}"

    def _build_generator(self) -> nn.Module:
        options, info = self.options, self.ctx.info
        width = network_widths(options, info.image_size)[0]
        if self.view.conditional:
            return build_conditional_generator(
                info,
                self.view.condition_classes,
                noise_channels=options.noise_channels,
                width=width,
                blocks=options.generator_blocks,
                dropout=False,  # pix2pix's dropout noise would come from torch's global stream
            )
        mixture = options.generator_mixture == "per-client"
        return build_generator(
            info,
            latent_dim=options.latent_dim,
            width=width,
            condition_dim=self.ctx.num_clients if mixture else 0,
        )

    # --- stage 1 ---------------------------------------------------------------------------------
    def setup(self, fleet: Fleet) -> None:
        config, options = self.ctx.config, self.options
        request = Message.build(
            "train", scalars={"config": {"send_label_counts": options.needs_label_counts}}
        )
        counts_spec = {"class_counts": ArraySpec("int64", (self.view.outputs,))}
        expect = ReplySpec(
            {"label-statistics": counts_spec} if options.needs_label_counts else {},
            (*TRAIN_METRICS, self._teacher_val_metric),
        )
        replies = successful(
            fleet.broadcast(request, timeout=config.timeout or None, expect=expect),
            minimum=min(config.min_clients, len(fleet.clients)),
            what="trained teachers",
        )
        clients = sorted(replies)
        sizes = torch.tensor(
            [float(replies[c].scalar("metrics", "num_samples")) for c in clients], device=devices.current()
        )
        if float(sizes.sum()) <= 0:
            raise FederationError("every teacher reports 0 training samples; FedIOD cannot weight them")
        counts = None
        if options.needs_label_counts:
            counts = torch.stack([replies[c].tensor("label-statistics", "class_counts") for c in clients])
        self.federation = Federation(
            clients,
            sizes,
            counts,
            {c: float(replies[c].scalar("metrics", self._teacher_val_metric)) for c in clients},
        )
        per_client = [math.ceil(float(s) / options.synthetic_batch_size) for s in sizes]
        if options.iters_per_epoch == "max":
            self.iters = max(per_client)
        elif options.iters_per_epoch == "min":
            self.iters = min(per_client)
        else:
            self.iters = int(options.iters_per_epoch)
        self.reference = teacher_report(self, fleet)
        if self.view.conditional and options.mask_source == "clients":
            self.mask_pools = upload_masks(self, fleet)
        # how many teachers came from their site's stage-1 cache (algorithms/stage1.py) instead of training
        self.reference["teachers_from_cache"] = teachers_from_cache(replies)
        log.info(
            "FedIOD stage 1 done: %d teachers, %d G-steps per epoch; %s",
            len(clients),
            self.iters,
            self.reference,
        )

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

    def _draw(self, batch: int, rng: torch.Generator) -> draws.Draw:
        """What G draws `batch` samples from (see draws.py)."""
        assert self.federation is not None
        pi = self.federation.pi(self.federation.clients)
        if not self.view.conditional:
            z = self.generator.sample_latent(batch, rng)
            if self.options.generator_mixture != "per-client":
                return draws.Draw(z, None)
            owner = draws.owners(pi, batch)
            onehot = torch.nn.functional.one_hot(owner, self.generator.condition_dim).to(z)
            return draws.Draw(torch.cat([z, onehot], 1), owner)
        owner = draws.owners(pi, batch)
        if self.mask_pools:
            masks, pair = draws.from_uploads(self.mask_pools, owner, rng)
        else:
            masks = devices.on_device(draws.prior_masks(self.view, batch, rng))
            pair = torch.full((batch,), -1)
        return draws.Draw(self.view.one_hot(masks), owner, masks, pair)

    def _generate(self, draw: draws.Draw, rng: torch.Generator) -> torch.Tensor:
        """G's images for a draw (noise channels of conditional G from `rng`)."""
        if not self.view.conditional:
            return self.generator(draw.latent)
        noise = self.generator.sample_noise(draw.latent, rng) if self.generator.noise_channels else None
        return self.generator(draw.latent, noise)

    def _weights(self, logits: torch.Tensor, ratio: torch.Tensor | None, clients: list[int]) -> torch.Tensor:
        assert self.federation is not None
        k, b, c = logits.shape
        if self.options.ensemble_weighting == "uniform":
            return L.uniform_weights(k, b, c, device=logits.device)
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
                # the epoch's first G-step carries its S-steps to the next query: no student loss yet
                student = values.get("loss_student")
                steps.set_postfix(
                    mimic=f"{losses['loss_mimic']:.3f}", student=f"{student[-1]:.3f}" if student else "-",
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
        collapsed = self._collapse_check(round)
        if collapsed is not None:
            raise StopRun(collapsed, totals | coverage | self._privacy_metrics())
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
        draw = self._draw(options.synthetic_batch_size, latent_gen)
        x = self._generate(draw, latent_gen)
        carried = self.carried
        inputs = {"x": x.detach()} if carried is None else {"x": x.detach(), "student_x": carried.x}
        masks = {} if draw.masks is None else {"m": draw.masks.to(torch.uint8)}
        if carried is not None and carried.masks is not None:
            masks["student_m"] = carried.masks.to(torch.uint8)

        def own(i: int) -> dict[str, torch.Tensor]:  # which samples are site i's (mixture, masks)
            if draw.owner is None:
                return {}
            mine = {"own": (draw.owner == i).to(torch.float32)}
            if draw.pair is not None and self.mask_pools:  # the uploaded mask each own sample came from
                mine["pair"] = torch.where(draw.owner == i, draw.pair, torch.full_like(draw.pair, -1))
            return mine

        def arrays(i: int) -> dict[str, dict[str, torch.Tensor]]:
            return {"synthetic-inputs": inputs | own(i)} | ({"label-masks": masks} if masks else {})

        requests = {
            cid: Message.build(
                "query.generate",
                arrays=arrays(i),
                scalars={
                    "config": {
                        **({"want_ratio": self._want_ratio()} if carried is not None else {}),
                        **({"student_index": carried.index} if carried is not None else {}),
                        "index": self._mask_index(self.step, 0),
                        "step": self.step,
                        "lr_discriminator": lr_d,
                        "c_gan": options.w_gan * float(gan_weight[i]),
                        "c_conf": options.w_conf * float(pi_all[i]) if options.use_conf else 0.0,
                        "tau": options.tau,
                        "gan_loss": options.gan_loss,
                        **({"c_bn": options.w_bn * float(pi_all[i])} if options.w_bn else {}),
                        **(
                            {"c_perceptual": options.w_perceptual * float(pi_all[i])}
                            if options.w_perceptual and self.mask_pools
                            else {}
                        ),
                        **({"total_steps": self.total_steps} if options.dp_enabled else {}),
                    }
                },
            )
            for i, cid in enumerate(clients)
        }
        timeout = config.timeout or None
        b, view = options.synthetic_batch_size, self.view
        logits_spec = {"z": ArraySpec("float32", view.output_shape(b))}
        ratio_spec = {"ratio": ArraySpec("float32", view.ratio_shape(b))}
        if carried is not None:  # step t-1's S-step targets ride along
            logits_spec["student_z"] = ArraySpec("float32", view.output_shape(len(carried.x)))
            if self._want_ratio():
                ratio_spec["student_ratio"] = ArraySpec("float32", view.ratio_shape(len(carried.x)))
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
            set_lr(self.s_optimizer, carried.lr)
            s_losses.append(self._student_update(carried, replies, "student_z", "student_ratio"))
            set_lr(self.s_optimizer, lr_s)
            self.carried = None
        raw = torch.stack([replies[cid].tensor("logits", "z") for cid in answered]).requires_grad_(True)
        # the gradient still goes to what clients sent; dense outputs become one row per pixel
        logits = calibrated(view.stacked_rows(raw), options.teacher_logits)
        ratio = torch.stack([replies[cid].tensor("discriminator-outputs", "ratio") for cid in answered])
        ratio = ratio.reshape(len(answered), -1)
        x_server = x.detach().requires_grad_(True)
        weights = self._weights(logits.detach(), ratio, answered)
        self.student.train()
        ensemble = L.ensemble_logits(logits, weights)
        student_out = view.rows(self.student(view.model_input(x_server, self._mask_index(self.step, 0))))
        mimic = L.mimic_loss(student_out, ensemble, mode=options.mimic, tau=options.tau)
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
        grad_logits, grad_x = torch.autograd.grad(server_loss, [raw, x_server])
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
            self.carried = self._student_inputs(lr_s)
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

    def _mask_index(self, step: int, offset: int) -> int:
        """Where the undersampling masks of a batch start in the synthetic mask stream (reconstruction):
        G-step `step`'s batch at offset 0, its S-step inputs after it."""
        per_step = self.options.synthetic_batch_size * (1 + self.options.student_steps)
        return step * per_step + offset

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
            "collapsed_epochs": self.collapsed_epochs,
            "mask_pools": {str(i): pool for i, pool in enumerate(self.mask_pools)},
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
        self.collapsed_epochs = int(state.get("collapsed_epochs", 0))
        pools = state.get("mask_pools", {})
        self.mask_pools = [devices.on_device(pools[str(i)]) for i in range(len(pools))]
        f = state["federation"]
        counts = None if f["counts"] is None else devices.on_device(f["counts"])
        self.federation = Federation(
            list(f["clients"]),
            devices.on_device(f["sizes"]),
            counts,
            {int(k): v for k, v in f["teacher_val"].items()},
        )
