"""FedCG's client: train the extractor towards the received generator, then the GAN; it sends the
classifier and its generator, never the extractor nor the discriminator (the round is in fedcg.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedistill.algorithms.base import ClientContext, clone_state
from fedistill.algorithms.fedmdcg.fedcg_gan import build_discriminator, train_gan
from fedistill.algorithms.fedmdcg.fedcg_options import FedCGOptions, generator_options
from fedistill.algorithms.fedmdcg.fedgen_options import build_generator
from fedistill.algorithms.fedmdcg.personalized import (
    class_counts,
    decoupled_model,
    load_pair,
    local_report,
    pair_state,
    private_start,
)
from fedistill.algorithms.shared.training import LocalTraining, check_finite, local_batches
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.messages import Message, expect_arrays, state_specs
from fedistill.models.base import CLASSIFIER_PREFIX, Classifier
from fedistill.models.feature_generator import FeatureGenerator
from fedistill.seeding import torch_generator


def train_toward_generator(
    model: Classifier,
    generator: FeatureGenerator,
    data: ImageSet,
    info: DatasetInfo,
    spec: LocalTraining,
    batch_rng: torch.Generator,
    noise_rng: torch.Generator,
    gamma: float,
) -> tuple[dict[str, float], list[tuple[torch.Tensor, torch.Tensor]]]:
    """CE + γ·MSE(F(x), Ĝ(y, ε)) on private data; returns metrics and the batches used (for the GAN)."""
    optimizer = spec.make_optimizer(model.parameters())
    model.train()
    generator.eval()
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    total, count, steps, mse_sum = 0.0, 0, 0, 0.0
    for x, y in local_batches(data, info, spec, batch_rng):
        features = model.extractor(x)
        ce = F.cross_entropy(model.classifier(features), y)
        loss = ce
        if gamma > 0:
            with torch.no_grad():
                target = generator(y, generator=noise_rng)
            mse = F.mse_loss(features, target)
            loss = ce + gamma * mse
            mse_sum += mse.item()
        check_finite(loss, "local training", steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        cache.append((x, y))
        total += ce.item() * len(y)
        count += len(y)
        steps += 1
    metrics = {"train_loss": total / count, "steps": steps}
    if gamma > 0:
        metrics["feature_mse"] = mse_sum / steps
    return metrics, cache


class FedCGClient(ClientLogic):
    """Keeps F_k, D_k and the optimiser states; shares C and G_k."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: FedCGOptions = ctx.options
        self.model = decoupled_model(ctx.config, ctx.info, "FedCG")
        private_start(self.model, ctx, CLASSIFIER_PREFIX)  # F_k never leaves the client
        self.generator = build_generator(
            ctx.config, ctx.info, self.model, **generator_options(self.options, ctx.info)
        )
        self.discriminator = build_discriminator(ctx, self.generator.feature_dim, self.options)
        betas = (self.options.gan_beta1, 0.999)
        self.g_optimizer = torch.optim.Adam(
            self.generator.parameters(),
            lr=self.options.generator_lr,
            betas=betas,
            weight_decay=self.options.gan_weight_decay,
        )
        self.d_optimizer = torch.optim.Adam(
            self.discriminator.parameters(),
            lr=self.options.discriminator_lr,
            betas=betas,
            weight_decay=self.options.gan_weight_decay,
        )
        self.specs = state_specs(self.shared_state())
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    def shared_state(self) -> dict[str, torch.Tensor]:
        """What leaves this client: the classifier and the generator, never the extractor."""
        return pair_state(self.model.classifier, self.generator)

    @handles("train")
    def train(self, message: Message) -> Message:
        """Train the local model toward the received generator, then the local GAN on its features; only
        the classifier and generator are sent back."""
        expect_arrays(message, "parameters", self.specs)  # exactly C and G: nothing private comes in
        load_pair(message.tensors("parameters"), self.model.classifier, self.generator)
        round = int(message.scalar("config", "round"))
        seed, cid = self.ctx.config.seed, self.ctx.client_id
        model = self.model
        metrics, cache = train_toward_generator(
            model,
            self.generator,
            self.ctx.train,
            self.ctx.info,
            self.training,
            torch_generator(seed, "local-training", cid, round),
            torch_generator(seed, "fedcg-target-noise", cid, round),
            float(message.scalar("config", "gamma", 0.0)),
        )
        metrics |= train_gan(
            model.extractor,
            self.generator,
            self.discriminator,
            self.g_optimizer,
            self.d_optimizer,
            cache,
            torch_generator(seed, "fedcg-gan-noise", cid, round),
            self.options.gan_passes,
        )
        self.model.train()
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            metrics |= local_report(self.ctx, self.model)
        arrays = {"parameters": self.shared_state()}
        if message.scalar("config", "send_label_counts", False):
            arrays["label-statistics"] = {
                "class_counts": class_counts(self.ctx.train, self.ctx.info.num_classes)
            }
        return Message.build("train", arrays=arrays, scalars={"metrics": metrics})

    def state_dict(self) -> dict:
        return {
            "model": clone_state(self.model),
            "generator": clone_state(self.generator),
            "discriminator": clone_state(self.discriminator),
            "g_optimizer": self.g_optimizer.state_dict(),
            "d_optimizer": self.d_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        self.g_optimizer.load_state_dict(state["g_optimizer"])
        self.d_optimizer.load_state_dict(state["d_optimizer"])
