"""FedIOD's server: stage 1's federation facts, the distillation epochs, and checkpoints. One G-step
is in generator_step.py, the S-steps and model selection in student.py.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field, fields
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
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.calibration import auto_mode, one_class_sites
from fedistill.algorithms.fediod.generator_step import GeneratorStep
from fedistill.algorithms.fediod.look_trials import LookTrials
from fedistill.algorithms.fediod.options import network_widths, resolve_for_task
from fedistill.algorithms.fediod.reference import teacher_report, upload_masks
from fedistill.algorithms.fediod.robustness import screened_counts
from fedistill.algorithms.fediod.student import StudentBatch, StudentSteps
from fedistill.algorithms.fediod.task_view import TaskView
from fedistill.algorithms.shared.selection import nothing_selected
from fedistill.algorithms.shared.stage1 import teachers_from_cache
from fedistill.algorithms.shared.synthetic_pool import SyntheticPool
from fedistill.algorithms.shared.training import new_model, task_of
from fedistill.algorithms.shared.weight_average import WeightAverage
from fedistill.errors import FederationError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import TRAIN_METRICS, ReplySpec
from fedistill.models.generator import build_generator, resolve_upsamples
from fedistill.models.pix2pix import build_conditional_generator
from fedistill.privacy.budget import epsilon_summary, warn_if_delta_too_large
from fedistill.seeding import seeded

log = logging.getLogger(__name__)


@dataclass
class Federation:
    """What the server learned in stage 1: client sizes and (if the weighting needs them) class counts."""

    clients: list[int]
    sizes: torch.Tensor  # (K,)
    counts: torch.Tensor | None  # (K, C)
    teacher_val: dict[int, float] = field(default_factory=dict)
    share_power: float = 1.0  # `fediod.share_power`: the counts' power in the class shares
    label_shares: str = "counts"  # `fediod.label_shares`: Eq. 8's label term from counts or frequencies

    def pi(self, clients: list[int]) -> torch.Tensor:
        """The weights of `clients` by their data sizes, summing to 1."""
        sizes = torch.stack([self.sizes[self.clients.index(c)] for c in clients])
        return sizes / sizes.sum()

    def share(self, clients: list[int], num_classes: int) -> torch.Tensor:
        """Each of `clients`' share of every class (Eq. 8's label term), from the counts (or, with
        `label_shares = "frequencies"`, each site's class frequencies) raised to `share_power`; uniform when
        the class counts were not collected."""
        if self.counts is None:
            return torch.full((len(clients), num_classes), 1.0 / len(clients), device=self.sizes.device)
        counts = torch.stack([self.counts[self.clients.index(c)] for c in clients]).float()
        if self.label_shares == "frequencies":
            counts = L.class_frequencies(counts)
        return L.class_share(counts if self.share_power == 1.0 else counts**self.share_power)


class FedIODServer(StudentSteps, GeneratorStep, ServerLogic):
    """FedIOD's server: after stage 1 (the sites train their teachers), each distillation epoch alternates
    generator steps and student steps."""

    #: Why `recalibrate_norm` does not apply (engine/norm_statistics.py)
    not_recalibrated = "its student learned from the generator's images"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, info = ctx.config, ctx.info
        self.options, self.view = resolve_for_task(
            config, ctx.options, TaskView(task_of(config, info), info, config.seed)
        )
        options = self.options
        keys = [key.name for key in fields(options) if key.name != "preset"]
        set_by_preset = [  # what the preset changed: the run's log says which settings the run took
            f"{key} = {getattr(options, key)!r}"
            for key in keys
            if getattr(options, key) != getattr(ctx.options, key)
        ]
        log.info(
            "FedIOD preset %r%s%s",
            options.preset,
            " (auto)" if ctx.options.preset == "auto" else "",
            f": {', '.join(set_by_preset)}" if set_by_preset else "",
        )
        options.check_run(config)
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
        self.student_average = (
            WeightAverage(self.student, options.student_ema) if options.student_ema else None
        )
        self.federation: Federation | None = None
        self.iters = 0
        self.look_trials: LookTrials | None = None  # look_trials.py, made at the first G-step
        self.step = 0
        self.best: dict[str, Any] = nothing_selected()
        self.reference: dict[str, float] = {}
        self.teacher_logits = options.teacher_logits  # "auto" is resolved once the label counts are in
        self.last_coverage: dict[str, Any] = {}
        self.carried: StudentBatch | None = None  # the last G-step's S-step inputs, merged mode
        self.epsilons: dict[int, float] = {}  # each client's latest reported epsilon (DP runs)
        self.pool = SyntheticPool(options.pool_size)
        self.collapsed_epochs = 0  # epochs in a row with a collapsed G (`collapse_patience`)
        self.mask_pools: list[
            torch.Tensor
        ] = []  # each site's uploaded masks (per-pixel tasks, mask_source clients)
        if options.dp_enabled:
            masks_up = self.view.conditional and options.mask_source == "clients"
            log.info(
                "FedIOD with DP: input-gradients clipped to %g, accounting %r at delta %g; logits, density "
                "ratios%s and stage 1 are not covered (see the fediod module docstring)",
                options.dp_clip_norm,
                options.dp_accounting,
                options.dp_delta,
                ", the sites' training label masks (mask_source = 'clients'; 'prior' keeps them)"
                if masks_up
                else "",
            )

    @property
    def _teacher_val_metric(self) -> str:
        return f"teacher_val_{self.view.task.headline}"

    def _build_generator(self) -> nn.Module:
        options, info = self.options, self.ctx.info
        width = network_widths(options, info.image_size)[0]
        mixture = options.generator_mixture == "per-client"
        if self.view.conditional:  # per-client: the mask's one-hot followed by its site's, as planes
            return build_conditional_generator(
                info,
                self.view.condition_classes + (self.ctx.num_clients if mixture else 0),
                noise_channels=options.noise_channels,
                width=width,
                blocks=options.generator_blocks,
                dropout=False,  # pix2pix's dropout noise would come from torch's global stream
                looks=self.ctx.num_clients if options.site_looks else 0,
            )
        return build_generator(
            info,
            latent_dim=options.latent_dim,
            width=width,
            condition_dim=self.ctx.num_clients if mixture else 0,
            upsamples=resolve_upsamples(options.generator_upsamples, info.image_size),
        )

    # --- stage 1 ---------------------------------------------------------------------------------
    def setup(self, fleet: Fleet) -> None:
        config, options = self.ctx.config, self.options
        # "auto" logits read the label counts on classification only (per-pixel tasks stay raw, send none)
        auto_logits = options.teacher_logits == "auto" and not self.view.per_pixel
        wants_counts = options.needs_label_counts or auto_logits
        request = Message.build("train", scalars={"config": {"send_label_counts": wants_counts}})
        counts_spec = {"class_counts": ArraySpec("int64", (self.view.outputs,))}
        expect = ReplySpec(
            {"label-statistics": counts_spec} if wants_counts else {},
            (*TRAIN_METRICS, self._teacher_val_metric),
            non_negative=frozenset({"label-statistics"}),
        )
        sent = fleet.broadcast(request, timeout=config.timeout or None, expect=expect)
        if wants_counts and not self.view.per_pixel:  # one label per sample: the counts must add up
            sent = screened_counts(options, fleet, sent)
        replies = successful(
            sent,
            minimum=min(config.min_clients, len(fleet.clients)),
            what="trained teachers",
        )
        clients = sorted(replies)
        sizes = torch.tensor(
            [float(replies[c].scalar("metrics", "num_samples")) for c in clients], device=devices.current()
        )
        if float(sizes.sum()) <= 0:
            raise FederationError("every teacher reports 0 training samples; FedIOD cannot weight them")
        if options.dp_enabled:  # the accounting protects one record of a site's training set
            n, smallest = min((int(n), c) for n, c in zip(sizes.tolist(), clients, strict=True))
            what = f"client {smallest}'s {n} training records (the smallest site)"
            warn_if_delta_too_large(options.dp_delta, n, what)
        counts = None
        if wants_counts:
            counts = torch.stack([replies[c].tensor("label-statistics", "class_counts") for c in clients])
        self.federation = Federation(
            clients,
            sizes,
            counts,
            {c: float(replies[c].scalar("metrics", self._teacher_val_metric)) for c in clients},
            options.share_power,
            options.label_shares,
        )
        logits_choice = self._resolve_teacher_logits()
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
        # how many teachers came from their site's stage-1 cache (shared/stage1.py) instead of training
        self.reference["teachers_from_cache"] = teachers_from_cache(replies)
        self.reference |= logits_choice  # which mode "auto" chose, and why
        log.info(
            "FedIOD stage 1 done: %d teachers, %d G-steps per epoch; %s",
            len(clients),
            self.iters,
            self.reference,
        )

    def _resolve_teacher_logits(self) -> dict[str, float]:
        """`teacher_logits = "auto"`: centred when a site saw a single class (calibration.py). Returns the
        summary fields that say what it chose and why (none unless "auto" read label counts)."""
        if self.options.teacher_logits != "auto":
            return {}
        assert self.federation is not None
        counts = self.federation.counts
        if self.view.per_pixel or counts is None:
            self.teacher_logits = "raw"
            return {}
        self.teacher_logits = auto_mode(counts)
        sites = one_class_sites(counts)
        if self.options.owner_queries and self.teacher_logits == "centred":
            # each site labels only its own share of G's batch: centring there is over that share, not the
            # batch, and a site owning one sample would send zeros
            log.warning(
                "teacher_logits 'auto': raw, not centred, for %d one-class sites: under owner_queries each "
                "site labels only its own share of G's batch",
                sites,
            )
            self.teacher_logits = "raw"
        log.info("teacher_logits 'auto': %s (%d one-class sites)", self.teacher_logits, sites)
        centred = float(self.teacher_logits == "centred")
        return {"one_class_sites": float(sites), "teacher_logits_centred": centred}

    # --- stage 2 ---------------------------------------------------------------------------------
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
            "student_average": (
                None if self.student_average is None else clone_state(self.student_average.model)
            ),
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
        if self.student_average is not None:
            self.student_average.model.load_state_dict(state["student_average"])
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
            self.options.share_power,
            self.options.label_shares,
        )
        self._resolve_teacher_logits()
