"""AsynDGAN's site: it uploads its label masks once, keeps its own discriminator D_k, and for every
G-step judges the synthetic images drawn from its own masks and returns the input-gradient of its
terms of G's loss. Its D_k and every parameter stay here; its images do not stay secret: the L1 term's
gradient is w_l1 times a positive constant times sign(x - x_real) per pixel and outweighs the GAN term,
so a server that chooses x can bisect each real pixel (docs/methods/asyndgan.md, "What a site's
gradients reveal"). `w_l1 = 0` removes that term, and with it the method's paired supervision.
"""

from __future__ import annotations

import torch
from torch import nn

from fedistill import devices
from fedistill.algorithms.base import ClientContext, clone_state
from fedistill.algorithms.medical.asyndgan.options import AsynDGANOptions
from fedistill.algorithms.shared import gan_losses as L
from fedistill.algorithms.shared.decision_threshold import ThresholdCounts
from fedistill.algorithms.shared.mask_upload import site_masks
from fedistill.algorithms.shared.schedules import set_lr
from fedistill.algorithms.shared.training import evaluate_model, new_model, task_of
from fedistill.data.base import DatasetInfo
from fedistill.data.transforms import to_float
from fedistill.errors import FederationError
from fedistill.federation.client import ClientLogic, handles
from fedistill.federation.messages import ArraySpec, Message, expect_arrays, state_specs
from fedistill.federation.reply_spec import NUM_SAMPLES
from fedistill.models.perceptual import JOHNSON_LAYERS, PerceptualLoss, load_vgg16_features
from fedistill.models.pix2pix import build_conditional_discriminator, one_hot_mask
from fedistill.seeding import seeded
from fedistill.tasks import Task

#: What a site reports of a G-step (its loss on real pairs too: no DP here, as in the paper).
STEP_METRICS = ("d_loss", "gan_loss", "l1_loss")


def condition_classes(task: Task, info: DatasetInfo) -> int:
    """Channels of G's and D_k's condition: the classes S predicts per pixel (instance segmentation:
    background, inside, contour), so the masks that condition G are exactly S's targets."""
    return task.output_channels(info)


def to_unit_range(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """Images normalised with the dataset's mean and std -> [0, 1]."""
    mean = torch.tensor(info.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return x * std + mean


class AsynDGANClient(ClientLogic, ThresholdCounts):
    """One site: D_k on (mask, real image) pairs of its own data against G's (mask, G(mask)) pairs."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx
        self.options: AsynDGANOptions = ctx.options
        self.task = task_of(ctx.config, ctx.info)
        self.classes = condition_classes(self.task, ctx.info)
        self.discriminator = seeded(
            ctx.config.seed,
            lambda: build_conditional_discriminator(
                ctx.info,
                self.classes,
                width=self.options.discriminator_width,
                layers=self.options.discriminator_layers,
            ),
            "discriminator-init",
        )
        self.d_optimizer = torch.optim.Adam(
            self.discriminator.parameters(),
            lr=self.options.lr_discriminator,
            betas=(self.options.beta1, 0.999),
        )
        self.uploaded = torch.zeros(0, dtype=torch.int64)  # training indices of the masks sent
        self.sent = torch.zeros(0, dtype=torch.int64)  # those masks, to check what G's requests carry
        self.perceptual: nn.Module | None = None  # VGG-16 features, loaded on first use
        self.segmenter = new_model(ctx.config, ctx.info)  # only to score S on the validation split
        self.segmenter_specs = state_specs(self.segmenter.state_dict())

    def _condition(self, targets: torch.Tensor) -> torch.Tensor:
        return self.task.pixel_targets(targets)  # type: ignore[attr-defined]

    @handles("query.masks")
    def masks(self, message: Message) -> Message:
        """The masks of this site's training samples, once (FedIOD's upload, S's pixel classes)."""
        limit = int(message.scalar("config", "limit", 0))
        self.uploaded, masks = site_masks(self.ctx, limit, self._condition)
        self.sent = masks.to(torch.int64)
        return Message.build(
            "query.masks",
            arrays={"label-masks": {"masks": masks}},
            scalars={"metrics": {NUM_SAMPLES: len(self.ctx.train)}},
        )

    @handles("query.adversarial")
    def adversarial(self, message: Message) -> Message:
        """One G-step at this site: a D-step on (real pairs, G's pairs) of its own masks, then the
        gradient of its G terms, GAN + w_l1 * L1 (+ perceptual), with respect to G's images."""
        x, masks, pair = self._receive(message)
        real = devices.on_device(to_float(self.ctx.train.x[self.uploaded[pair.cpu()]], self.ctx.info))
        condition = one_hot_mask(masks, self.classes)
        set_lr(self.d_optimizer, float(message.scalar("config", "lr_discriminator")))
        self.discriminator.train()
        d_loss = L.discriminator_loss(self.discriminator(condition, real), self.discriminator(condition, x))
        self.d_optimizer.zero_grad(set_to_none=True)
        d_loss.backward()
        self.d_optimizer.step()
        x = x.clone().requires_grad_(True)
        gan, l1, perceptual = self.generator_terms(x, condition, real)
        w_l1 = float(message.scalar("config", "w_l1"))
        w_perceptual = float(message.scalar("config", "w_perceptual", 0.0))
        (grad,) = torch.autograd.grad(gan + w_l1 * l1 + w_perceptual * perceptual, x)
        metrics = {"d_loss": d_loss.item(), "gan_loss": gan.item(), "l1_loss": l1.item()}
        return Message.build(
            "query.adversarial", arrays={"input-gradients": {"x": grad}}, scalars={"metrics": metrics}
        )

    def generator_terms(
        self, x: torch.Tensor, condition: torch.Tensor, real: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """pix2pix's G terms on the current D_k: the GAN term (mean BCE of D_k's patch logits against
        "real"), the mean L1 distance to the real image of the same mask on images in [-1, 1] (pix2pix's
        range, which its lambda = 100 is set for), and the perceptual term when it is on."""
        info = self.ctx.info
        gan = L.generator_gan_loss(self.discriminator(condition, x))
        fake_unit, real_unit = to_unit_range(x, info), to_unit_range(real, info)
        l1 = (2 * fake_unit - 2 * real_unit).abs().mean()
        perceptual = torch.zeros(())
        if self.options.w_perceptual > 0:
            if self.perceptual is None:
                # loaded on the CPU; it computes where G's images and D_k are
                features = load_vgg16_features(self.options.vgg16_weights).to(devices.current())
                # the released code's mean over the four layers' MSEs
                self.perceptual = PerceptualLoss(features, [1 / len(JOHNSON_LAYERS)] * len(JOHNSON_LAYERS))
            perceptual = self.perceptual(fake_unit, real_unit)
        return gan, l1, perceptual

    def _receive(self, message: Message) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This site's samples of the step, checked: images, masks, and where each mask is in its upload
        (which must hold that very mask, so the real image paired with it is the right one)."""
        info = self.ctx.info
        x = message.arrays.get("synthetic-inputs", {}).get("x")
        n = int(x.shape[0]) if x is not None and x.ndim else 0
        size = info.image_size
        expect_arrays(
            message,
            "synthetic-inputs",
            {"x": ArraySpec("float32", (n, info.channels, size, size)), "pair": ArraySpec("int64", (n,))},
        )
        expect_arrays(message, "label-masks", {"m": ArraySpec("uint8", (n, size, size))})
        pair = message.tensor("synthetic-inputs", "pair")
        masks = message.tensor("label-masks", "m").to(torch.int64)
        if n == 0 or int(pair.min()) < 0 or int(pair.max()) >= len(self.uploaded):
            raise FederationError(
                f"query.adversarial: {n} samples with mask positions outside the {len(self.uploaded)} "
                "masks this site uploaded"
            )
        if not torch.equal(self.sent[pair.cpu()].to(masks.device), masks):
            raise FederationError(
                "query.adversarial: the masks sent are not this site's masks at those positions"
            )
        return message.tensor("synthetic-inputs", "x").clone(), masks, pair

    @handles("evaluate.segmenter", read_only=True)
    def evaluate_segmenter(self, message: Message) -> Message:
        """S's task headline on this site's validation split (model selection; S's parameters come down,
        only the score goes up)."""
        expect_arrays(message, "parameters", self.segmenter_specs)
        self.segmenter.load_state_dict(message.tensors("parameters"))
        headline = self.task.headline
        val = evaluate_model(self.segmenter, self.ctx.val, self.ctx.info, task=self.task)
        scores = {f"val_{headline}": val[headline] if val["count"] else 0.0, "val_count": val["count"]}
        return Message.build("evaluate.segmenter", scalars={"metrics": scores})

    def state_dict(self) -> dict:
        return {
            "discriminator": clone_state(self.discriminator),
            "d_optimizer": self.d_optimizer.state_dict(),
            "uploaded": self.uploaded,
        }

    def load_state_dict(self, state: dict) -> None:
        self.discriminator.load_state_dict(state["discriminator"])
        self.d_optimizer.load_state_dict(state["d_optimizer"])
        self.uploaded = state["uploaded"]
        self.sent = self._condition(self.ctx.train.y[self.uploaded]).to(torch.int64)
