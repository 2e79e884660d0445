"""FedMD-CG's client: stage 1 trains the local model under the received global pair, stage 2 the local
generator that imitates it; only C_i, G_i and the label counts leave (the round is in fedmdcg.py)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from fedistill import devices
from fedistill.algorithms.base import ClientContext, clone_state
from fedistill.algorithms.fedmdcg import losses as L
from fedistill.algorithms.fedmdcg.fedmdcg_options import finite_loss, frozen, new_generator, resolve_options
from fedistill.algorithms.fedmdcg.personalized import (
    class_counts,
    decoupled_model,
    load_pair,
    local_report,
    pair_state,
    private_start,
)
from fedistill.algorithms.shared.training import LocalTraining
from fedistill.data.transforms import augment, to_float
from fedistill.errors import FederationError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.models.base import CLASSIFIER_PREFIX
from fedistill.seeding import torch_generator


class FedMDCGClient(ClientLogic):
    """Owns F_i, C_i, G_i, their optimisers and the cache of real batches; shares only C_i, G_i, counts."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options = resolve_options(ctx.config, ctx.options)
        self.model = decoupled_model(ctx.config, ctx.info, "FedMD-CG")
        private_start(self.model, ctx, CLASSIFIER_PREFIX)  # F_i never leaves the client
        self.generator = new_generator(ctx.config, ctx.info, self.options, self.model)  # G_i
        self.received = frozen(new_generator(ctx.config, ctx.info, self.options, self.model))  # Ĝ
        self.training = LocalTraining.from_config(ctx.config, ctx.info)
        self.optimizer = self.training.make_optimizer(self.model.parameters())
        self.generator_optimizer = torch.optim.Adam(
            self.generator.parameters(),
            lr=self.options.generator_lr,
            weight_decay=self.options.generator_weight_decay,
        )
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []  # augmented uint8 images, labels
        self.cycle_position = 0  # batch_order "cycled": the next batch of the pass, kept across rounds
        self.specs = state_specs(pair_state(self.model.classifier, self.generator))

    @handles("train")
    def train(self, message: Message) -> Message:
        """Load the global classifier and generator when sent, train the local model, then the local
        generator; send both back with the class counts."""
        round = int(message.scalar("config", "round"))
        t, num_classes = round - 1, self.ctx.info.num_classes
        distribution = None
        if message.arrays.get("parameters"):
            expect_arrays(message, "parameters", self.specs)  # exactly C_g and G_g: no extractor
            expect_arrays(
                message, "label-statistics", {"label_distribution": ArraySpec("float32", (num_classes,))}
            )
            load_pair(message.tensors("parameters"), self.model.classifier, self.received)
            distribution = message.tensor("label-statistics", "label_distribution")
        elif L.distillation_active(t):
            raise FederationError(f"round {round}: FedMD-CG clients need the global classifier and generator")
        metrics = self._train_model(round, distribution)
        metrics |= self._train_generator(round)
        counts = self._label_counts(t)
        if self.options.clear_cache:
            self.cache = []
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            metrics |= local_report(self.ctx, self.model)
        return Message.build(
            "train",
            arrays={
                "parameters": pair_state(self.model.classifier, self.generator),
                "label-statistics": {"class_counts": counts},
            },
            scalars={"metrics": metrics},
        )

    # --- stage 1: the local model -----------------------------------------------------------------
    def _batches(self, round: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(augmented uint8 x, y) batches for this round's steps (or epochs), reshuffled every epoch."""
        data, spec = self.ctx.train, self.training
        if len(data) < 2:
            raise FederationError(f"a client needs at least 2 training samples, this one has {len(data)}")
        generator = torch_generator(self.ctx.config.seed, "fedmdcg-batches", self.ctx.client_id, round)
        if self.options.batch_order == "cycled":
            yield from self._cycled_batches(generator)
            return
        stop = len(data) - len(data) % spec.batch_size if len(data) > spec.batch_size else len(data)
        steps, epoch = 0, 0
        while True:
            order = torch.randperm(len(data), generator=generator)
            for start in range(0, stop, spec.batch_size):
                yield self._batch(order[start : start + spec.batch_size], generator)
                steps += 1
                if spec.steps > 0 and steps >= spec.steps:
                    return
            epoch += 1
            if spec.steps <= 0 and epoch >= spec.epochs:
                return

    def _cycled_batches(self, generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The code's persistent loader: the client's samples in one order drawn once, cut into batches
        as its DataLoader does (a short last batch kept, one of a single sample dropped), read on from
        `cycle_position` and never reshuffled."""
        data, spec = self.ctx.train, self.training
        order = torch.randperm(
            len(data), generator=torch_generator(self.ctx.config.seed, "fedmdcg-cycle", self.ctx.client_id)
        )
        size = min(spec.batch_size, len(data))
        stop = len(data) - 1 if len(data) % size == 1 else len(data)
        starts = range(0, stop, size)
        for _ in range(spec.steps if spec.steps > 0 else spec.epochs * len(starts)):
            start = starts[self.cycle_position % len(starts)]
            self.cycle_position = (self.cycle_position + 1) % len(starts)
            yield self._batch(order[start : start + size], generator)

    def _batch(self, idx: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples `idx` (augmented with `generator` when the run augments) on the run's device."""
        data = self.ctx.train
        x = augment(data.x[idx], self.ctx.info, generator) if self.training.augment else data.x[idx]
        return devices.on_device(x), devices.on_device(data.y[idx])

    def _remember(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Cache a real batch for stage 2; the code skips a batch whose label sum (or size) it has seen."""
        if self.options.dedup_label_sum and any(
            len(cy) != len(y) or int(cy.sum()) == int(y.sum()) for _, cy in self.cache
        ):
            return
        self.cache.append((x.clone(), y.clone()))

    def _train_model(self, round: int, distribution: torch.Tensor | None) -> dict[str, float]:
        options, model, t = self.options, self.model, round - 1
        lambdas = options.local_lambdas().at_round(
            t, self.ctx.config.rounds, options.ramp, options.ramp_power
        )
        distil = L.distillation_active(t) and distribution is not None
        noise = torch_generator(self.ctx.config.seed, "fedmdcg-local-noise", self.ctx.client_id, round)
        model.train()
        total, ce_sum, count = 0.0, 0.0, 0
        for x_raw, y in self._batches(round):
            self._remember(x_raw, y)
            x = to_float(x_raw, self.ctx.info)
            features = model.extractor(x)
            logits = model.classifier(features)
            ce = L.local_ce(logits, y)
            kl = ce_gen = mse = None
            if distil:
                assert distribution is not None
                with torch.no_grad():  # one draw of Ĝ(y, ε) is both targets (Eq. 2; the code's gen_result)
                    paired = self.received(y, generator=noise)
                    target = model.classifier(paired)
                    sampled = L.sample_labels(distribution, options.generated_batch_size, noise)
                    generated = self.received(sampled, generator=noise)
                kl = L.logit_kd_from_global(logits, target, options.client_temperature)
                ce_gen = L.generated_ce(model.classifier(generated), sampled)
                mse = L.feature_kd_to_global(features, paired)
            loss = L.local_model_objective(ce, kl, ce_gen, mse, lambdas)
            value = finite_loss(loss, "local model training")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            total += value * len(y)
            ce_sum += float(ce.detach()) * len(y)
            count += len(y)
        return {
            "train_loss": total / count,
            "train_ce": ce_sum / count,
            "ramp": L.ramp_factor(t, self.ctx.config.rounds, options.ramp, options.ramp_power),
        }

    # --- stage 2: the local generator -------------------------------------------------------------
    def _train_generator(self, round: int) -> dict[str, float]:
        options, model, generator = self.options, self.model, self.generator
        noise = torch_generator(self.ctx.config.seed, "fedmdcg-generator-noise", self.ctx.client_id, round)
        eps = [generator.sample_noise(len(y), noise) for _, y in self.cache]  # one ε per batch and round
        lambdas = options.generator_lambdas()
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        generator.train()
        losses, hits, seen = [], 0, 0
        try:
            per_batch = options.generator_grads == "per-batch"
            for _ in range(options.generator_passes):
                if not per_batch:  # the code's: one clearing per pass, so each step reads a running sum
                    self.generator_optimizer.zero_grad(set_to_none=True)
                for (x_raw, y), e in zip(self.cache, eps, strict=True):
                    with torch.no_grad():
                        real = model.extractor(to_float(x_raw, self.ctx.info))
                        real_logits = model.classifier(real)
                    fake = generator(y, e)
                    fake_logits = model.classifier(fake)
                    div = None
                    if options.diversity != "none":
                        div = L.diversity_loss(options.diversity, e, fake, generator.label_code(y))
                    loss = L.generator_objective(
                        L.generator_ce(fake_logits, y),
                        L.logit_kd_from_local(fake_logits, real_logits),
                        L.feature_kd_from_local(fake, real),
                        div,
                        lambdas,
                    )
                    losses.append(finite_loss(loss, "local generator training"))
                    hits += int((fake_logits.detach().argmax(1) == y).sum())
                    seen += len(y)
                    if per_batch:
                        self.generator_optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.generator_optimizer.step()
        finally:
            for p in model.parameters():
                p.requires_grad_(True)
        return {
            "generator_loss": float(np.mean(losses)) if losses else 0.0,
            "generator_accuracy": hits / seen if seen else 0.0,  # C_i(G_i(y)) = y during its steps
            "generator_steps": len(losses),
        }

    def _label_counts(self, t: int) -> torch.Tensor:
        """The training split's class counts, or the code's: a floor (0 in round 0, else 1) + the cache's."""
        c = self.ctx.info.num_classes
        if self.options.label_counts == "data":
            return class_counts(self.ctx.train, c)
        counts = torch.full((c,), 0 if t == 0 else 1, dtype=torch.int64)
        for _, y in self.cache:  # the cached labels sit on the run's device, the counts on the CPU
            counts += torch.bincount(y, minlength=c).cpu()
        return counts

    def state_dict(self) -> dict:
        """Everything private that must survive a restart (the received Ĝ comes again with each request)."""
        return {
            "model": clone_state(self.model),
            "generator": clone_state(self.generator),
            "optimizer": self.optimizer.state_dict(),
            "generator_optimizer": self.generator_optimizer.state_dict(),
            "cache_x": [x.clone() for x, _ in self.cache],
            "cache_y": [y.clone() for _, y in self.cache],
            "num_samples": len(self.ctx.train),
            "cycle_position": self.cycle_position,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.generator.load_state_dict(state["generator"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator_optimizer.load_state_dict(state["generator_optimizer"])
        self.cycle_position = int(state.get("cycle_position", 0))  # absent from older checkpoints
        # a checkpoint reads back on the CPU: the cached batches meet the model on the run's device
        self.cache = [
            (devices.on_device(x), devices.on_device(y))
            for x, y in zip(state["cache_x"], state["cache_y"], strict=True)
        ]
