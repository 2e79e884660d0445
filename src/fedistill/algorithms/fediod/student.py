"""The student's side of FedIOD's server: the S-steps on the clients' weighted ensemble, the replay
pool, the grids of G's samples, and model selection on the clients' validation splits. A mixin of
`FedIODServer`, kept apart so each file reads alone.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from fedistill.algorithms.base import (
    clone_state,
)
from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.calibration import calibrated
from fedistill.algorithms.fediod.options import (
    set_lr,
)
from fedistill.errors import FederationError
from fedistill.experiment.plots import plot_image_grid
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import ReplySpec
from fedistill.metrics.generation import adapted_inception_score, class_coverage
from fedistill.seeding import torch_generator

log = logging.getLogger(__name__)


class StudentSteps:
    """The S-steps of `FedIODServer` (the attributes they use are set up there)."""

    def _want_ratio(self) -> bool:
        return self.options.ensemble_weighting == "eq8"

    def _student_inputs(self) -> torch.Tensor:
        n, b = self.options.student_steps, self.options.synthetic_batch_size
        latent_gen = torch_generator(self.ctx.config.seed, "student-latent", self.step)
        with torch.no_grad():
            return self.generator(self._latent(n * b, latent_gen)[0])

    def _student_steps(self, fleet: Fleet, clients: list[int], xs: torch.Tensor | None = None) -> float:
        """One `query.student` exchange for the S-steps' targets, then the S-steps."""
        config = self.ctx.config
        xs = self._student_inputs() if xs is None else xs
        request = Message.build(
            "query.student",
            arrays={"synthetic-inputs": {"x": xs}},
            scalars={"config": {"want_ratio": self._want_ratio()}},
        )
        c = self.ctx.info.num_classes
        arrays = {"logits": {"z": ArraySpec("float32", (len(xs), c))}}
        if self._want_ratio():
            arrays["discriminator-outputs"] = {"ratio": ArraySpec("float32", (len(xs),))}
        replies = successful(
            fleet.broadcast(
                request, clients, step=self.step, timeout=config.timeout or None, expect=ReplySpec(arrays)
            ),
            minimum=min(config.min_clients, len(clients)),
            what="student targets",
        )
        return self._student_update(xs, replies, "z", "ratio")

    def _flush_student(self, fleet: Fleet) -> float:
        assert self.carried is not None and self.federation is not None
        xs, lr = self.carried
        self.carried = None
        set_lr(self.s_optimizer, lr)
        return self._student_steps(fleet, self.federation.clients, xs)

    def _student_update(
        self, xs: torch.Tensor, replies: dict[int, Message], z_name: str, ratio_name: str
    ) -> float:
        """The S-steps on L_mimic against the weighted ensemble of the clients' logits on `xs`."""
        options = self.options
        n, b = options.student_steps, options.synthetic_batch_size
        answered = sorted(replies)
        logits = calibrated(
            torch.stack([replies[cid].tensor("logits", z_name) for cid in answered]), options.teacher_logits
        )
        ratio = (
            torch.stack([replies[cid].tensor("discriminator-outputs", ratio_name) for cid in answered])
            if self._want_ratio()
            else None
        )
        targets = L.ensemble_logits(logits, self._weights(logits, ratio, answered))
        self.last_coverage = class_coverage(targets)
        self.last_coverage["adapted_is"] = adapted_inception_score(logits)
        self.student.train()
        losses = []
        for j in range(n):
            part = slice(j * b, (j + 1) * b)
            loss = L.mimic_loss(self.student(xs[part]), targets[part], mode=options.mimic, tau=options.tau)
            if not torch.isfinite(loss):
                raise FederationError(
                    f"the student's loss is {float(loss)} at step {self.step}; lower fediod.lr_student"
                )
            self.s_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.s_optimizer.step()
            losses.append(loss.item())
        if options.pool_size:
            self.pool.add(xs, targets)
            self._replay()
        return float(np.mean(losses))

    def _replay(self) -> None:
        """`pool_steps` S-steps on batches of earlier synthetic samples and their ensemble targets: the
        student keeps fitting what G has left behind while G moves on (no new query to any client)."""
        options = self.options
        rng = torch_generator(self.ctx.config.seed, "pool", self.step)
        for _ in range(options.pool_steps):
            x, target = self.pool.sample(options.synthetic_batch_size, rng)
            loss = L.mimic_loss(self.student(x), target, mode=options.mimic, tau=options.tau)
            self.s_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.s_optimizer.step()

    def _collapse_check(self, epoch: int) -> str | None:
        """Warn when one class takes more than `collapse_share` of G's samples; after
        `collapse_patience` such epochs in a row, the reason to stop (None: go on)."""
        share = self.last_coverage.get("max_share", 0.0)
        if share <= self.options.collapse_share:
            self.collapsed_epochs = 0
            return None
        self.collapsed_epochs += 1
        log.warning("epoch %d: generator collapse? one class takes %.0f%% of the samples", epoch, 100 * share)
        patience = self.options.collapse_patience
        if patience and self.collapsed_epochs >= patience:
            return (
                f"the generator stayed collapsed for {self.collapsed_epochs} epochs (one class over "
                f"{100 * self.options.collapse_share:.0f}% of its samples); "
                "stopped with the best validated student"
            )
        return None

    def _samples(self, epoch: int) -> None:
        every = self.options.samples_every
        if not every or epoch % every or self.ctx.run_dir is None:
            return
        with torch.no_grad():
            self.generator.eval()
            images = self.generator.forward_unit(
                self._latent(32, torch_generator(self.ctx.config.seed, "samples"))[0]
            )
            self.generator.train()
        plot_image_grid(
            images.numpy(),
            self.ctx.run_dir / "plots" / f"synthetic_epoch_{epoch:04d}.png",
            title=f"G samples, epoch {epoch}",
        )

    # --- evaluation and model selection ----------------------------------------------------------

    # --- evaluation and model selection ----------------------------------------------------------
    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        test = self.ctx.evaluate(self.student)
        metrics = {"test_accuracy": test["accuracy"], "test_loss": test["loss"]}
        selection = self.options.selection
        if selection == "validation":
            request = Message.build("evaluate.student", arrays={"parameters": self.student.state_dict()})
            expect = ReplySpec(metrics=("val_accuracy", "val_count"))
            replies = successful(
                fleet.broadcast(request, timeout=self.ctx.config.timeout or None, expect=expect),
                what="validation metrics",
            )
            counts = np.array([float(r.scalar("metrics", "val_count")) for r in replies.values()])
            accs = np.array([float(r.scalar("metrics", "val_accuracy")) for r in replies.values()])
            score = float(np.average(accs, weights=counts)) if counts.sum() > 0 else 0.0
            metrics["val_accuracy"] = score
        elif selection == "best-on-test":
            score = test["accuracy"]
        else:
            score = float(round)
        if score > self.best["score"]:
            self.best = {"score": score, "epoch": round, "state": clone_state(self.student)}
        return metrics

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        final = dict(last)
        if self.best["state"] is not None:
            self.student.load_state_dict(self.best["state"])
            test = self.ctx.evaluate(self.student)
            final |= {
                "test_accuracy": test["accuracy"],
                "test_loss": test["loss"],
                "selected_epoch": self.best["epoch"],
            }
        final["selection"] = {
            "validation": "best on the clients' validation splits",
            "last": "last epoch",
            "best-on-test": "best on the TEST set (official-code preset; not a valid protocol)",
        }[self.options.selection]
        final |= self.reference
        if self.options.dp_enabled:
            final |= self._privacy_metrics() | {"dp_accounting": self.options.dp_accounting}
        if self.reference.get("ensemble_accuracy"):
            final["fraction_of_ensemble"] = final["test_accuracy"] / self.reference["ensemble_accuracy"]
        return final
