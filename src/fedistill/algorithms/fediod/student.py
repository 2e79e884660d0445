"""The student's side of FedIOD's server: the S-steps on the clients' weighted ensemble, the replay
pool, the grids of G's samples, and model selection on the clients' validation splits. A mixin of
`FedIODServer`, kept apart so each file reads alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from fedistill.algorithms.fediod import losses as L
from fedistill.algorithms.fediod.calibration import calibrated
from fedistill.algorithms.fediod.distill_augment import augment_batch
from fedistill.algorithms.fediod.options import (
    set_lr,
)
from fedistill.algorithms.fediod.robustness import combined_ensemble, screened_logits
from fedistill.algorithms.fediod.wire import evaluation_encodings, wire_encodings
from fedistill.algorithms.shared.selection import clients_validation_score, keep_if_best, with_selected_score
from fedistill.algorithms.shared.training import has_dropout, test_metrics
from fedistill.data.transforms import random_recolour, random_shift
from fedistill.errors import FederationError
from fedistill.federation.fleet import Fleet, successful
from fedistill.federation.messages import ArraySpec, Message
from fedistill.federation.reply_spec import ReplySpec
from fedistill.metrics.generation import adapted_inception_score, class_coverage
from fedistill.plots import plot_image_grid
from fedistill.seeding import derive_seed, global_rng, numpy_generator, torch_generator

log = logging.getLogger(__name__)


@dataclass
class StudentBatch:
    """The inputs of one G-step's S-steps: G's images, their masks (per-pixel tasks), the learning rate they
    are taken at, where their undersampling masks start (reconstruction) and the G-step that drew them."""

    x: torch.Tensor
    masks: torch.Tensor | None
    lr: float
    index: int
    step: int
    owner: torch.Tensor | None = None  # each sample's site position (the per-client G), else None


class StudentSteps:
    """The S-steps of `FedIODServer` (the attributes they use are set up there)."""

    def _want_ratio(self) -> bool:
        """Whether the ensemble's weights use Eq. 8's density ratios: only then does a site send them (the
        `want_ratio` of every `query.generate` and `query.student`)."""
        return self.options.ensemble_weighting == "eq8"

    def _student_inputs(self, lr: float) -> StudentBatch:
        n, b = self.options.student_steps, self.options.synthetic_batch_size
        latent_gen = torch_generator(self.ctx.config.seed, "student-latent", self.step)
        with torch.no_grad():
            shares_gen = torch_generator(self.ctx.config.seed, "student-site-shares", self.step)
            draw = self._draw(n * b, latent_gen, shares_rng=shares_gen)
            x = self._generate(draw, latent_gen)
            x = self._shifted_and_mixed(x)
            if self.options.student_noise:
                noise_gen = torch_generator(self.ctx.config.seed, "student-noise", self.step)
                x = x + self.options.student_noise * torch.randn(x.shape, generator=noise_gen).to(x.device)
        return StudentBatch(x, draw.masks, lr, self._mask_index(self.step, b), self.step, draw.owner)

    def _with_truth(
        self, x: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor, masks: torch.Tensor | None
    ) -> torch.Tensor:
        """The student's target rows with what the server knows of G's images (`truth_weight`).

        Reconstruction: `truth_weight` of G's own image mixed in, as the net output that returns x from
        its zero-filled image `inputs`. Segmentation: one more column, the class of each pixel in the
        mask G drew the image from, which `_target_loss` scores with the task's own loss."""
        weight = self.options.truth_weight
        if not weight:
            return targets
        view = self.view
        if view.labelled_by_condition:
            assert masks is not None, "a conditional G's samples carry their masks"
            classes = view.truth_of(masks).reshape(-1, 1).to(targets)
            return torch.cat([targets, classes], dim=-1)
        truth = view.rows(view.task.net_output_for(inputs.detach(), x.detach()))
        return (1.0 - weight) * targets + weight * truth.to(targets)

    def _target_loss(self, out: torch.Tensor, target_rows: torch.Tensor) -> torch.Tensor:
        """The student's loss on its outputs `out` against target rows from `_with_truth`: L_mimic, or on
        segmentation with `truth_weight` w, (1 - w) L_mimic + w times the task's own loss against the
        masks' classes (AsynDGAN's loss on G's (mask, image) pairs)."""
        options, view = self.options, self.view
        rows = view.rows(out)
        columns = rows.shape[-1]
        mimic = L.mimic_loss(rows, target_rows[:, :columns], mode=options.mimic, tau=options.tau)
        if target_rows.shape[-1] == columns:
            return mimic
        classes = view.unrows(target_rows[:, columns:], (out.shape[0], 1, *out.shape[2:]))[:, 0]
        weight = options.truth_weight
        return (1.0 - weight) * mimic + weight * view.task.loss(out, classes.long())

    def _shifted_and_mixed(self, x: torch.Tensor) -> torch.Tensor:
        """G's samples moved by `student_shift` pixels at most, then mixed in pairs (`student_mixup`), with
        draws seeded by the G-step: the clients label exactly what the student then trains on."""
        options, seed = self.options, self.ctx.config.seed
        if options.student_shift:
            x = random_shift(x, options.student_shift, torch_generator(seed, "student-shift", self.step))
        if options.student_mixup:
            a = options.student_mixup
            weight = numpy_generator(seed, "student-mixup", self.step).beta(a, a, size=len(x))
            lam = torch.from_numpy(weight).to(x)[:, None, None, None]
            partner = torch.randperm(len(x), generator=torch_generator(seed, "student-mixup", self.step))
            x = lam * x + (1.0 - lam) * x[partner.to(x.device)]
        return x

    def _student_steps(self, fleet: Fleet, clients: list[int], batch: StudentBatch | None = None) -> float:
        """One `query.student` exchange for the S-steps' targets, then the S-steps."""
        config = self.ctx.config
        batch = self._student_inputs(self.s_optimizer.param_groups[0]["lr"]) if batch is None else batch
        xs = batch.x
        arrays_down = {"synthetic-inputs": {"x": xs}}
        if batch.masks is not None:
            arrays_down["label-masks"] = {"m": batch.masks.to(torch.uint8)}
        request = Message.build(
            "query.student",
            arrays=arrays_down,
            scalars={"config": {"want_ratio": self._want_ratio(), "index": batch.index}},
            encodings=wire_encodings(self.options.wire),
        )
        arrays = {"logits": {"z": ArraySpec("float32", self.view.sent_shape(len(xs)))}}
        if self._want_ratio():
            arrays["discriminator-outputs"] = {"ratio": ArraySpec("float32", self.view.ratio_shape(len(xs)))}
        expect = ReplySpec(arrays, non_negative=frozenset({"discriminator-outputs"}))  # Eq. 8's ratios
        timeout = config.timeout or None
        sent = fleet.broadcast(request, clients, step=self.step, timeout=timeout, expect=expect)
        replies = successful(
            screened_logits(self.options, fleet, sent, self.step),
            minimum=min(config.min_clients, len(clients)),
            what="student targets",
        )
        return self._student_update(batch, replies, "z", "ratio")

    def _flush_student(self, fleet: Fleet) -> float:
        assert self.carried is not None and self.federation is not None
        batch = self.carried
        self.carried = None
        set_lr(self.s_optimizer, batch.lr)
        # merged queries: the sites of the step that would have carried the batch (every site by default)
        return self._student_steps(fleet, self.step_sites(self.step), batch)

    def _student_update(
        self, batch: StudentBatch, replies: dict[int, Message], z_name: str, ratio_name: str
    ) -> float:
        """The S-steps on L_mimic against the weighted ensemble of the clients' outputs on the batch."""
        options, view = self.options, self.view
        n, b = options.student_steps, options.synthetic_batch_size
        answered = sorted(replies)
        raw = torch.stack([replies[cid].tensor("logits", z_name) for cid in answered])
        logits = calibrated(view.stacked_rows(view.received_logits(raw)), self.teacher_logits)
        ratio = (
            torch.stack([replies[cid].tensor("discriminator-outputs", ratio_name) for cid in answered])
            if self._want_ratio()
            else None
        )
        if ratio is not None:
            ratio = ratio.reshape(len(answered), -1)
        targets = combined_ensemble(options, logits, self._weights(logits, ratio, answered, batch.owner))
        if not view.per_pixel:
            self.last_coverage = class_coverage(targets)
            # Table 7's score is each T_k's own: its softmax before `teacher_logits` calibrates it
            self.last_coverage["adapted_is"] = adapted_inception_score(view.stacked_rows(raw))
        inputs = view.model_input(batch.x, batch.index)
        targets = self._with_truth(batch.x, inputs, targets, batch.masks)
        per_sample = targets.reshape(len(batch.x), -1, targets.shape[-1])  # (B, rows per sample, C)
        self.student.train()
        losses = []
        shown = self._recoloured(inputs, "student-recolour", batch.step)
        for j in range(n):
            part = slice(j * b, (j + 1) * b)
            x, target = self._augmented(shown[part], per_sample[part], "student-augment", batch.step, j)
            loss = self._target_loss(
                self._student_forward(x, "s-step", batch.step, j), target.reshape(-1, targets.shape[-1])
            )
            if not torch.isfinite(loss):
                raise FederationError(
                    f"the student's loss is {float(loss)} at step {self.step}; lower fediod.lr_student"
                )
            self._student_optimizer_step(loss)
            losses.append(loss.item())
        if options.pool_size:
            self.pool.add(inputs, targets if not view.per_pixel else per_sample)
            self._replay(batch.step)
        return float(np.mean(losses))

    def _replay(self, drawn_at: int) -> None:
        """`pool_steps` S-steps on batches of earlier synthetic samples and their ensemble targets: the
        student keeps fitting what G has left behind while G moves on (no new query to any client).

        The draws are seeded by the step after the one that drew the S-step inputs (when merged queries
        take them), so merged and separate queries replay the same samples."""
        options = self.options
        rng = torch_generator(self.ctx.config.seed, "pool", drawn_at + 1)
        batch = options.pool_batch_size or options.synthetic_batch_size
        for i in range(options.pool_steps):
            x, target = self.pool.sample(batch, rng)
            x = self._recoloured(x, "pool-recolour", drawn_at + 1, i)
            x, target = self._augmented(x, target, "pool-augment", drawn_at + 1, i)
            out = self._student_forward(x, "replay", drawn_at + 1, i)
            loss = self._target_loss(out, target.reshape(-1, target.shape[-1]))
            self._student_optimizer_step(loss)

    def _recoloured(self, x: torch.Tensor, *draw: object) -> torch.Tensor:
        """`x` as the student trains on it: with `student_recolour`, a share of the images in a random new
        look drawn from (seed, *`draw`), so a resumed run recolours the same; else `x` itself.
        The pool keeps the images as G drew them."""
        share = self.options.student_recolour
        if not share:
            return x
        return random_recolour(x, self.view.info, share, torch_generator(self.ctx.config.seed, *draw))

    def _augmented(
        self, x: torch.Tensor, targets: torch.Tensor, *draw: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` and its per-pixel target rows (B, pixels, columns) as the student trains on them: with
        `distill_augment`, cropped, resized back, flipped and turned alike (distill_augment.py), drawn from
        (seed, *`draw`), so a resumed run draws the same; else as they are. A truth column (the mask's
        classes, `truth_weight`) is resized as classes, the logits as values."""
        if not self.options.distill_augment:
            return x, targets
        b, h, w = len(x), x.shape[-2], x.shape[-1]
        maps = targets.reshape(b, h, w, -1).movedim(-1, 1)
        hard = int(self.view.labelled_by_condition and bool(self.options.truth_weight))
        x, maps = augment_batch(x, maps, torch_generator(self.ctx.config.seed, *draw), hard_columns=hard)
        return x, maps.movedim(1, -1).reshape(b, h * w, -1)

    def _student_forward(self, x: torch.Tensor, *draw: object) -> torch.Tensor:
        """The student's outputs on `x` in training mode. A student with dropout draws its masks from
        torch's global RNG: seeded here by (seed, *`draw`), so a run, and a resumed one, draws the same
        masks whatever ran before it in the process."""
        if not has_dropout(self.student):
            return self.student(x)
        with global_rng(derive_seed(self.ctx.config.seed, "student-dropout", *draw)):
            return self.student(x)

    def _student_optimizer_step(self, loss: torch.Tensor) -> None:
        self.s_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.s_optimizer.step()
        if self.student_average is not None:
            self.student_average.update(self.student)

    def _handed_over(self) -> torch.nn.Module:
        """The student that is validated, selected and handed over: the trained one, or with
        `student_ema` the moving average of its weights."""
        return self.student if self.student_average is None else self.student_average.model

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
        """A grid of G's samples; for a conditional G each sample under its conditioning mask (Figure 6)."""
        every = self.options.samples_every
        if not every or epoch % every or self.ctx.run_dir is None:
            return
        rng = torch_generator(self.ctx.config.seed, "samples")
        count = 8 if self.view.conditional else 32
        with torch.no_grad():
            self.generator.eval()
            draw = self._draw(count, rng)
            if self.view.conditional:
                noise = (
                    self.generator.sample_noise(draw.latent, rng) if self.generator.noise_channels else None
                )
                images = self.generator.forward_unit(draw.latent, noise)
            else:
                images = self.generator.forward_unit(draw.latent)
            self.generator.train()
        grid, labels = images.cpu().numpy(), None
        if draw.masks is not None:  # masks above their images
            masks = (draw.masks > 0).float()[:, None].expand(-1, images.shape[1], -1, -1).cpu().numpy()
            grid = np.concatenate([masks, grid])
            labels = ["mask"] * count + ["G(mask)"] * count
        plot_image_grid(
            grid,
            self.ctx.run_dir / "plots" / f"synthetic_epoch_{epoch:04d}.png",
            labels=labels,
            columns=count if self.view.conditional else 8,
            title=f"G samples, epoch {epoch}",
        )

    # --- evaluation and model selection ----------------------------------------------------------
    def evaluate(self, fleet: Fleet, round: int) -> dict[str, float]:
        """The student's test metrics, and the score that keeps the best student by the chosen selection."""
        handed_over = self._handed_over()
        test = test_metrics(self.ctx.evaluate(handed_over))
        headline = self.view.task.headline
        metrics = {f"test_{headline}": test[f"test_{headline}"], "test_loss": test["test_loss"]}
        if self.view.per_pixel:
            metrics = test
        selection = self.options.selection
        if selection == "validation":
            score = clients_validation_score(
                fleet,
                "evaluate.student",
                handed_over,
                f"val_{headline}",
                timeout=self.ctx.config.timeout or None,
                encodings=evaluation_encodings(self.options.wire),
            )
            metrics[f"val_{headline}"] = score
        elif selection == "best-on-test":
            score = metrics[f"test_{headline}"]
        else:
            score = float(round)
        self.best = keep_if_best(self.best, score, round, handed_over)
        return metrics

    def final_evaluate(self, fleet: Fleet, last: dict[str, float]) -> dict[str, float]:
        """The last round's metrics, with the selected student's test metrics in place of the last one's."""
        final = dict(last)
        headline = self.view.task.headline
        if self.best["state"] is not None:
            self.student.load_state_dict(self.best["state"])
            test = test_metrics(self.ctx.evaluate(self.student))
            if not self.view.per_pixel:
                test = {key: test[key] for key in (f"test_{headline}", "test_loss")}
            final |= test | {"selected_epoch": self.best["epoch"]}
            if self.options.selection == "validation":
                final = with_selected_score(final, self.best, f"val_{headline}")
        final["selection"] = {
            "validation": "best on the clients' validation splits",
            "last": "last epoch",
            "best-on-test": "best on the TEST set (official-code preset; not a valid protocol)",
        }[self.options.selection]
        final |= self.reference
        if self.options.dp_enabled:
            final |= self._privacy_metrics() | {"dp_accounting": self.options.dp_accounting}
        if self.reference.get(f"ensemble_{headline}"):
            final["fraction_of_ensemble"] = final[f"test_{headline}"] / self.reference[f"ensemble_{headline}"]
        return final
