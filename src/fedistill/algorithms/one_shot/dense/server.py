"""DENSE's server: it receives every site's local model once, then distils their ensemble into the
student data-free, one epoch per round, without another message to a client (except model selection).

One epoch (DENSE's released code, `loop_df_fl.py` / `AdvSynthesizer`):

1. Synthesis. A batch of latents z is drawn with a label y_i for each, and G and z take `g_steps`
   Adam steps together on L_G (dense/losses.py). G is unconditional: each sample is tied to its label
   because its latent z_i stays paired with y_i through the epoch's steps (no conditioning, no argmax).
   The iterate with the lowest L_G joins the pool. The code re-initialises G before each synthesis
   (`reset_generator = true`); by default one G learns throughout, as the paper's Algorithm 1.
2. `_after_synthesis` (Co-Boosting re-weights the ensemble here; DENSE does nothing).
3. Distillation. One pass over the whole pool (every synthetic batch so far) in shuffled batches, the
   student on T^2 KL to the ensemble's logits, computed afresh (the teachers are frozen; Co-Boosting's
   weights move).

Differences from the code, all for a CPU and small images: the generator is FedIOD's
(models/generator.py, nearest upsampling: 4w, 2w, w channels against DENSE's 2w, 2w, w; the code's with
`generator_layout = "dense"`); the pool keeps
float tensors (the code writes 8-bit PNGs and reloads them); no augmentation of the synthetic images
(the code crops and flips, which digits do not allow). Everything random derives from (seed, epoch), and
the checkpoint holds the teachers, G, S, the optimisers, the pool and the ensemble weights, so a resumed
run ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from fedistill import devices
from fedistill.algorithms.base import ServerContext, ServerLogic, clone_state
from fedistill.algorithms.one_shot.dense import losses as L
from fedistill.algorithms.one_shot.dense.options import DenseOptions, teacher_of
from fedistill.algorithms.shared.bn_matching import batchnorm_statistics_loss
from fedistill.algorithms.shared.schedules import cosine_lr, set_lr
from fedistill.algorithms.shared.selection import (
    clients_validation_score,
    keep_if_best,
    nothing_selected,
    with_selected_score,
)
from fedistill.algorithms.shared.stage1 import collect_local_models, teachers_from_cache
from fedistill.algorithms.shared.synthetic_pool import SyntheticPool
from fedistill.algorithms.shared.training import evaluate_model, new_model
from fedistill.errors import ConfigError, FederationError
from fedistill.federation.fleet import Fleet
from fedistill.metrics.generation import class_coverage
from fedistill.models.generator import build_generator, resolve_upsamples
from fedistill.plots import plot_image_grid
from fedistill.seeding import derive_seed, global_rng, seeded, torch_generator

log = logging.getLogger(__name__)

SELECTION_LABELS = {
    "clients": "best on the clients' validation splits",
    "server": "best on the server's validation split",
    "last": "last epoch",
}


class DenseServer(ServerLogic):
    """DENSE at the server: the sites' models once, then synthesis and distillation each epoch."""

    hard_power = 0.0  # Co-Boosting's hard-sample weighting of the generator's CE (DENSE: none)

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        config, info = ctx.config, ctx.info
        options: DenseOptions = ctx.options
        self.options = options
        options.check_run(config)
        if options.selection == "server" and (ctx.validation is None or len(ctx.validation) == 0):
            raise ConfigError(f"{options.section}.selection = 'server' needs the server's validation split")
        self.generator = seeded(
            config.seed,
            lambda: build_generator(
                info,
                latent_dim=options.latent_dim,
                width=options.generator_width,
                upsample="nearest",
                upsamples=resolve_upsamples(options.generator_upsamples, info.image_size),
                layout=options.generator_layout,
            ),
            "generator-init",
        )
        self.g_optimizer = self._generator_optimizer()
        self.student = new_model(config, info, options.student or config.model)
        self.s_optimizer = torch.optim.SGD(
            self.student.parameters(),
            lr=options.lr_student,
            momentum=options.student_momentum,
            weight_decay=options.student_weight_decay,
        )
        self.clients: list[int] = []
        self.teachers: list[nn.Module] = []
        self.weights = torch.ones(
            0
        )  # the ensemble's weight of each teacher (uniform; Co-Boosting moves them)
        # labels ride as the pool's targets; without a limit it holds every epoch's batch
        self.pool = SyntheticPool(options.pool_size or config.rounds * options.synthetic_batch_size)
        self.best: dict[str, Any] = nothing_selected()
        self.reference: dict[str, float] = {}
        self.last_batch: torch.Tensor | None = None  # the epoch's synthetic batch, for the sample grid

    def _generator_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.generator.parameters(), lr=self.options.lr_generator, betas=(0.5, 0.999))

    # --- the one exchange: every site's local model --------------------------------------------------
    def setup(self, fleet: Fleet) -> None:
        """The one exchange: every site's local model, and the teachers' report."""
        config = self.ctx.config
        replies = collect_local_models(fleet, config, self._local_model)
        self.clients = sorted(replies)
        self._load_teachers({cid: replies[cid].tensors("parameters") for cid in self.clients})
        self.weights = torch.full((len(self.clients),), 1.0 / len(self.clients), device=devices.current())
        self.reference = self._teacher_report()
        self.reference["teachers_from_cache"] = teachers_from_cache(replies)
        log.info("%s: %d local models received; %s", self.options.section, len(self.clients), self.reference)

    def _local_model(self, client_id: int) -> nn.Module:
        return new_model(self.ctx.config, self.ctx.info, teacher_of(self.options, self.ctx.config, client_id))

    def _load_teachers(self, states: dict[int, dict[str, torch.Tensor]]) -> None:
        self.teachers = []
        for cid in self.clients:
            model = self._local_model(cid)
            model.load_state_dict(states[cid])
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
            self.teachers.append(model)
        if self.options.w_bn and not any(
            isinstance(m, nn.BatchNorm2d) for t in self.teachers for m in t.modules()
        ):
            log.warning(
                "%s.w_bn > 0 but no local model has BatchNorm layers: the term is 0", self.options.section
            )

    def _teacher_report(self) -> dict[str, float]:
        """The local models' test accuracies (the mean standalone client) and their ensemble's (the
        one-shot ceiling), through the evaluation harness, as FedIOD reports them."""
        acc = torch.tensor([self.ctx.evaluate(t)["accuracy"] for t in self.teachers], dtype=torch.float32)
        ensemble = self.ctx.evaluate(L.Ensemble(self.teachers, self.weights))["accuracy"]
        return {
            "teacher_mean_accuracy": float(acc.mean()),
            "teacher_std_accuracy": float(acc.std(unbiased=False)),
            "ensemble_accuracy": float(ensemble),
        }

    # --- one epoch -----------------------------------------------------------------------------------
    def teacher_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(K, B, C): every local model's logits on `x`."""
        return torch.stack([t(x) for t in self.teachers])

    def ensemble(self, x: torch.Tensor) -> torch.Tensor:
        """The weighted ensemble's logits on `x`."""
        return L.weighted_logits(self.teacher_logits(x), self.weights)

    def run_round(self, fleet: Fleet, round: int) -> dict[str, float]:
        """One epoch: synthesise a batch with G, then train the student on the pool."""
        epoch = round - 1  # the codes' 0-based epoch
        o = self.options
        set_lr(self.s_optimizer, cosine_lr(o.lr_student, epoch, self.ctx.config.rounds, o.schedule))
        metrics = self._synthesize(epoch)
        metrics |= self._after_synthesis(epoch)
        metrics |= self._distil(epoch)
        self._samples(round)
        return metrics

    def _synthesize(self, epoch: int) -> dict[str, float]:
        """`g_steps` Adam steps on G and the latents; the best iterate joins the pool with its labels."""
        o, info = self.options, self.ctx.info
        rng = torch_generator(self.ctx.config.seed, "dense-synthesis", epoch)
        if o.reset_generator:
            seeded(self.ctx.config.seed, lambda: L.reset_generator(self.generator), "generator-reset", epoch)
            self.g_optimizer = self._generator_optimizer()
        z = devices.on_device(
            torch.randn(o.synthetic_batch_size, o.latent_dim, generator=rng)
        ).requires_grad_(True)
        labels = devices.on_device(torch.randint(info.num_classes, (o.synthetic_batch_size,), generator=rng))
        z_optimizer = torch.optim.Adam([z], lr=o.lr_generator, betas=(0.5, 0.999))
        self.generator.train()
        self.student.eval()
        best_loss, best_x, sums = float("inf"), None, {"ce": 0.0, "bn": 0.0, "adv": 0.0}
        for step in range(o.g_steps):
            x = self.generator(z)
            terms = self.generator_terms(x, labels)
            loss = terms["total"]
            if not torch.isfinite(loss):
                raise FederationError(
                    f"the generator's loss is {float(loss)} at epoch {epoch + 1}, step {step}; "
                    f"lower {o.section}.lr_generator"
                )
            if loss.item() < best_loss:  # the codes keep the best iterate, scored before its update
                best_loss, best_x = loss.item(), x.detach().clone()
            for key in sums:
                sums[key] += terms[key].item() / o.g_steps
            self.g_optimizer.zero_grad(set_to_none=True)
            z_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if o.generator_clip:
                nn.utils.clip_grad_norm_(self.generator.parameters(), o.generator_clip)
            self.g_optimizer.step()
            z_optimizer.step()
        assert best_x is not None
        self.pool.add(best_x, labels)
        self.last_batch = best_x
        with torch.no_grad():
            predicted = self.ensemble(best_x)
        coverage = class_coverage(predicted)
        return {
            "loss_generator": best_loss,
            **{f"loss_{key}": value for key, value in sums.items()},
            "label_agreement": float((predicted.argmax(1) == labels).float().mean()),
            "coverage_classes_covered": float(coverage["classes_covered"]),
            "coverage_max_share": float(coverage["max_share"]),
            "pool_size": float(len(self.pool)),
        }

    def generator_terms(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """L_G's terms on a synthetic batch (dense/losses.py); the batch-norm term sums over every
        BatchNorm layer of every teacher, as DENSE's paper and README describe. (Its released code hooks
        `net.modules()` of an ensemble that keeps its models in a plain list, which reaches no BatchNorm
        layer, so there the term is zero whatever its weight.)"""
        o = self.options
        with contextlib.ExitStack() as stack:
            hooks = (
                [stack.enter_context(batchnorm_statistics_loss(t)) for t in self.teachers] if o.w_bn else []
            )
            ensemble = self.ensemble(x)
        bn_terms = [term for terms in hooks for term in terms]
        return L.generator_losses(
            ensemble,
            self.student(x),
            labels,
            torch.stack(bn_terms).sum() if bn_terms else torch.zeros(()),
            w_ce=o.w_ce,
            w_bn=o.w_bn,
            w_adv=o.w_adv,
            temperature=o.adv_temperature,
            mask=o.adv_mask,
            hard_power=self.hard_power,
        )

    def _after_synthesis(self, epoch: int) -> dict[str, float]:
        """Between synthesis and distillation: nothing in DENSE (Co-Boosting re-weights the ensemble)."""
        return {}

    def _kd_inputs(self, x: torch.Tensor, labels: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        """The inputs the student distils on: the pool's own (Co-Boosting perturbs them)."""
        return x

    def pool_batches(self, rng: torch.Generator) -> list[torch.Tensor]:
        """The student's index batches over the pool: one shuffled pass (`kd_steps` = 0, the code) or
        `kd_steps` random batches."""
        o, n = self.options, len(self.pool)
        if o.kd_steps:
            return [torch.randint(n, (o.kd_batch_size,), generator=rng) for _ in range(o.kd_steps)]
        return self.one_pass(rng)

    def one_pass(self, rng: torch.Generator) -> list[torch.Tensor]:
        """Index batches of one shuffled pass over the pool. A last batch of one sample is left out
        (BatchNorm needs two)."""
        batches = list(torch.randperm(len(self.pool), generator=rng).split(self.options.kd_batch_size))
        return [b for b in batches if len(b) > 1]

    def _distil(self, epoch: int) -> dict[str, float]:
        o = self.options
        rng = torch_generator(self.ctx.config.seed, "dense-distillation", epoch)
        losses = []
        for i, index in enumerate(self.pool_batches(rng)):
            x = self._kd_inputs(*self.pool.take(index), rng)
            with torch.no_grad():
                target = self.ensemble(x)
            self.student.train()
            # a student with dropout draws its masks from torch's global RNG: seeded by (seed, epoch,
            # batch), so a run (and a resumed one) draws the same masks whatever ran before it
            with global_rng(derive_seed(self.ctx.config.seed, "dense-dropout", epoch, i)):
                out = self.student(x)
            loss = L.distillation_loss(out, target, o.kd_temperature)
            if not torch.isfinite(loss):
                raise FederationError(
                    f"the student's loss is {float(loss)} at epoch {epoch + 1}; lower {o.section}.lr_student"
                )
            self.s_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if o.student_clip:
                nn.utils.clip_grad_norm_(self.student.parameters(), o.student_clip)
            self.s_optimizer.step()
            losses.append(loss.item())
        return {
            "loss_student": float(np.mean(losses)) if losses else float("nan"),
            "kd_steps": float(len(losses)),
        }

    def _samples(self, epoch: int) -> None:
        every = self.options.samples_every
        if not every or epoch % every or self.ctx.run_dir is None or self.last_batch is None:
            return
        images = self.last_batch[:32] * self.generator.std + self.generator.mean
        plot_image_grid(
            images.cpu().numpy(),
            self.ctx.run_dir / "plots" / f"synthetic_epoch_{epoch:04d}.png",
            title=f"synthetic batch, epoch {epoch}",
        )

    # --- evaluation and model selection (never the test set) -----------------------------------------
    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The student on the test set, and its validation score for model selection."""
        test = self.ctx.evaluate(self.student)
        metrics = {"test_accuracy": test["accuracy"], "test_loss": test["loss"]}
        selection = self.options.selection
        if selection == "clients":
            score = clients_validation_score(
                fleet,
                "evaluate.student",
                self.student,
                "val_accuracy",
                clients=self.clients,
                timeout=self.ctx.config.timeout or None,
            )
            metrics["val_accuracy"] = score
        elif selection == "server":
            assert self.ctx.validation is not None
            score = evaluate_model(self.student, self.ctx.validation, self.ctx.info)["accuracy"]
            metrics["val_accuracy"] = score
        else:
            score = float(round)
        self.best = keep_if_best(self.best, score, round, self.student)
        return metrics

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        """The selected student's test metrics, with the teachers' report."""
        final = dict(last)
        if self.best["state"] is not None:
            self.student.load_state_dict(self.best["state"])
            test = self.ctx.evaluate(self.student)
            final |= {
                "test_accuracy": test["accuracy"],
                "test_loss": test["loss"],
                "selected_epoch": self.best["epoch"],
            }
            if self.options.selection in ("clients", "server"):
                final = with_selected_score(final, self.best, "val_accuracy")
        final["selection"] = SELECTION_LABELS[self.options.selection]
        final |= self.reference
        if self.reference.get("ensemble_accuracy"):
            final["fraction_of_ensemble"] = final["test_accuracy"] / self.reference["ensemble_accuracy"]
        return final

    def models(self) -> dict[str, nn.Module]:
        """The student and the generator."""
        return {"student": self.student, "generator": self.generator}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs: teachers, G, S, optimisers, pool, selection."""
        return {
            "clients": list(self.clients),
            "teachers": {cid: clone_state(t) for cid, t in zip(self.clients, self.teachers, strict=True)},
            "weights": self.weights.clone(),
            "generator": clone_state(self.generator),
            "g_optimizer": self.g_optimizer.state_dict(),
            "student": clone_state(self.student),
            "s_optimizer": self.s_optimizer.state_dict(),
            "pool": self.pool.state_dict(),
            "best": self.best,
            "reference": self.reference,
            "last_batch": self.last_batch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned."""
        self.clients = [int(c) for c in state["clients"]]
        self._load_teachers({int(cid): s for cid, s in state["teachers"].items()})
        self.weights = devices.on_device(state["weights"]).clone()
        self.generator.load_state_dict(state["generator"])
        self.g_optimizer = self._generator_optimizer()
        self.g_optimizer.load_state_dict(state["g_optimizer"])
        self.student.load_state_dict(state["student"])
        self.s_optimizer.load_state_dict(state["s_optimizer"])
        self.pool.load_state_dict(state["pool"])
        self.best, self.reference = state["best"], dict(state["reference"])
        last = state.get("last_batch")
        self.last_batch = None if last is None else devices.on_device(last)
