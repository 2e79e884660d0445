"""FedGen's client: local training regularised through the head by the received generator; it sends the
shared parameters and its label counts (the round is in fedgen.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedistill import devices
from fedistill.algorithms.base import ClientContext, clone_state
from fedistill.algorithms.fedmdcg.fedgen_options import (
    FedGenOptions,
    build_generator,
    generator_options,
    shared_prefix,
)
from fedistill.algorithms.fedmdcg.label_statistics import label_distribution
from fedistill.algorithms.fedmdcg.personalized import (
    GENERATOR_PREFIX,
    class_counts,
    decoupled_model,
    local_report,
    part_of,
    prefixed,
    private_start,
    unprefixed,
)
from fedistill.algorithms.shared.training import LocalTraining, check_finite, local_batches
from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.models.base import Classifier
from fedistill.models.feature_generator import FeatureGenerator
from fedistill.seeding import torch_generator


def train_regularized(
    model: Classifier,
    generator: FeatureGenerator | None,
    data: ImageSet,
    info: DatasetInfo,
    spec: LocalTraining,
    batch_rng: torch.Generator,
    sample_rng: torch.Generator,
    *,
    alpha: float = 0.0,
    beta: float = 0.0,
    label_probs: torch.Tensor | None = None,
    generator_batch_size: int = 32,
) -> dict[str, float]:
    """Local training: CE, plus FedGen's two generator terms through the head when `generator` is given."""
    optimizer = spec.make_optimizer(model.parameters())
    model.train()
    if generator is not None:
        generator.eval()
        if label_probs is None:
            raise ValueError("FedGen's regulariser needs the label distribution to draw ŷ from")
    ratio = generator_batch_size / spec.batch_size
    total, count, steps = 0.0, 0, 0
    teacher_sum, latent_sum = 0.0, 0.0
    for x, y in local_batches(data, info, spec, batch_rng):
        logits = model(x)
        ce = F.cross_entropy(logits, y)
        loss = ce
        if generator is not None:
            assert label_probs is not None
            with torch.no_grad():
                target = F.softmax(model.classifier(generator(y, generator=sample_rng)), dim=1)
                sampled = torch.multinomial(
                    label_probs.cpu(), generator_batch_size, True, generator=sample_rng
                )
                sampled = sampled.to(label_probs.device)
                generated = generator(sampled, generator=sample_rng)
            latent = F.kl_div(F.log_softmax(logits, dim=1), target, reduction="batchmean")
            teacher = F.cross_entropy(model.classifier(generated), sampled)
            loss = ce + ratio * alpha * teacher + beta * latent
            teacher_sum += teacher.item()
            latent_sum += latent.item()
        check_finite(loss, "local training", steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += ce.item() * len(y)
        count += len(y)
        steps += 1
    metrics = {"train_loss": total / count, "steps": steps}
    if generator is not None:
        metrics |= {"teacher_loss": teacher_sum / steps, "latent_loss": latent_sum / steps}
    return metrics


class FedGenClient(ClientLogic):
    """Trains the received model (or its own extractor under the received head) with G's regulariser."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: FedGenOptions = ctx.options
        self.model = decoupled_model(ctx.config, ctx.info, "FedGen")
        self.prefix = shared_prefix(self.options)
        private_start(self.model, ctx, self.prefix)  # `share = "classifier"`: the extractor stays private
        self.generator = build_generator(ctx.config, ctx.info, self.model, **generator_options(self.options))
        self.specs = state_specs(part_of(self.model.state_dict(), self.prefix))
        self.generator_specs = state_specs(prefixed(self.generator.state_dict(), GENERATOR_PREFIX))
        self.training = LocalTraining.from_config(ctx.config, ctx.info)

    @handles("train")
    def train(self, message: Message) -> Message:
        """Load the shared parameters and train locally, regularised by the received generator once the
        server asks for it."""
        regularize = bool(message.scalar("config", "regularize", False))
        expect_arrays(message, "parameters", self.specs | (self.generator_specs if regularize else {}))
        received = message.tensors("parameters")
        shared = {k: v for k, v in received.items() if not k.startswith(GENERATOR_PREFIX)}
        self.model.load_state_dict({**self.model.state_dict(), **shared})
        label_probs = None
        if regularize:
            self.generator.load_state_dict(unprefixed(received, GENERATOR_PREFIX))
            num_classes = self.ctx.info.num_classes
            if self.options.label_sampling == "counts":
                spec = {"global_counts": ArraySpec("int64", (num_classes,))}
                expect_arrays(message, "label-statistics", spec)
                label_probs = label_distribution(message.tensor("label-statistics", "global_counts"))
            else:
                label_probs = torch.full((num_classes,), 1.0 / num_classes, device=devices.current())
        round = int(message.scalar("config", "round"))
        seed, cid = self.ctx.config.seed, self.ctx.client_id
        metrics = train_regularized(
            self.model,
            self.generator if regularize else None,
            self.ctx.train,
            self.ctx.info,
            self.training,
            torch_generator(seed, "local-training", cid, round),
            torch_generator(seed, "fedgen-client-sampling", cid, round),
            alpha=float(message.scalar("config", "generative_alpha", 0.0)),
            beta=float(message.scalar("config", "generative_beta", 0.0)),
            label_probs=label_probs,
            generator_batch_size=self.options.generator_batch_size,
        )
        metrics["num_samples"] = len(self.ctx.train)
        if message.scalar("config", "evaluate_local", False):
            metrics |= local_report(self.ctx, self.model)
        arrays = {
            "parameters": part_of(self.model.state_dict(), self.prefix),
            "label-statistics": {"class_counts": class_counts(self.ctx.train, self.ctx.info.num_classes)},
        }
        return Message.build("train", arrays=arrays, scalars={"metrics": metrics})

    def state_dict(self) -> dict:
        """The whole model (its private extractor when only the head is shared); G is resent each round."""
        return {"model": clone_state(self.model)}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
