"""FedIOD on every task: what its models see of a synthetic image and how their outputs line up.

Every FedIOD term (Eq. 3-10) is written for logits of shape (samples, classes). The per-pixel tasks reuse
them unchanged by treating each pixel as a sample:

- segmentation: T_k and S return per-pixel logits (B, C, H, W); their rows are the B·H·W pixels, so
  L_conf is the mean per-pixel entropy, L_unique the mean per-pixel JSD, and L_mimic the mean per-pixel
  (logit) error. **Eq. 8 per pixel**: pi_hat_k^c(x, p) = s_k^c · D_k(m, x)[p] / E[D_k(m', x')], where
  s_k^c = n_k^c / sum_j n_j^c counts *pixels* of class c at site k (the share of site k in what the
  federation knows of class c), and D_k(m, x)[p] is the sigmoid of D_k's patch logit whose patch
  covers pixel p (the patch map upsampled to the image, nearest), divided by its mean over site k's real
  pairs. Normalised over k for every pixel and class, Eq. 9's ensemble A(x)[p] = sum_k pi_k(x, p) ⊙
  z_k(x)[p] weighs, at every pixel, the sites that know that class and judge that region realistic.
- reconstruction: T_k and S return images (B, 1, H, W), one row per pixel with one "logit"; the share
  is the site's share of all training slices (there are no classes), so pi_k(x, p) ∝ pi_k · D_k ratio
  at p. Entropy and JSD are defined on probabilities, which an image output does not have: with one
  column both vanish, so L_conf and L_unique are 0 and G's signal is realism (D_k), the batch-norm term
  and L_mimic's hardness; for the same reason a KL L_mimic (`mimic = "kl"`, `"kl-official"`) and the
  median or trimmed mean of probabilities (`ensemble_combine`) would be 0 and are refused (options.py).
  T_k and S see the zero-filled image of an undersampled k-space of G's image; the masks are drawn from
  a seeded stream both sides know, so the server sends only G's image. With the
  task's residual (`task.residual`, the default) a net's output is a correction to that zero-filled
  image, in units of that image's std (`task.output_scale`), and FedIOD distils the corrections: every
  model sees the same input, Eq. 9's weights sum to 1 over k at every pixel, so the ensemble of the
  images is the input plus the ensemble of the corrections (times that std) and L_mimic (l2 or l1)
  compares the same differences. Scoring a teacher or the student goes through
  the task (`Task.outputs`), which adds the input back and applies data consistency.

The per-pixel tasks condition G on a label mask (segmentation) or the brain's foreground mask
(reconstruction; with `fediod.reconstruction_condition = "contour"` its outline, the paper's condition):
G(one-hot m [, noise]) draws the image, and D_k judges (m, x) pairs. Which site a
sample is for follows its mask: masks a site uploaded are its own; masks from a server prior are dealt
out in shares pi_k. Site k's L_gan, L_conf, batch-norm and perceptual terms cover its own samples only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from fedistill.data.base import DatasetInfo, ImageSet
from fedistill.errors import ConfigError, FederationError
from fedistill.seeding import derive_seed
from fedistill.tasks import Condition, Task
from fedistill.tasks.conditions import Contour, Foreground


@dataclass(frozen=True)
class TaskView:
    """The task as FedIOD sees it: the shapes of its synthetic inputs, outputs and ratios, and what its
    generator is conditioned on."""

    task: Task
    info: DatasetInfo
    seed: int
    ratio_resolution: str = "pixel"
    """Per-pixel tasks: whether sites send D_k's ratios per pixel or per patch (`fediod.ratio_resolution`)."""
    pixel_logits: str = "all"
    """Per-pixel tasks: every class's logits, or a segmentation's margins z_c - z_0 over the background
    (`fediod.pixel_logits`)."""
    contour: bool = False
    """Whether G and D_k see the outline of the task's foreground condition instead of the filled mask
    (`fediod.reconstruction_condition = "contour"`)."""

    def with_ratio_resolution(self, resolution: str) -> TaskView:
        """This view with the resolution sites send D_k's ratios at (`fediod.ratio_resolution`)."""
        return replace(self, ratio_resolution=resolution)

    def with_sent_outputs(self, ratio_resolution: str, pixel_logits: str) -> TaskView:
        """This view with what sites send of D_k's ratios and T_k's logits (`fediod.ratio_resolution`,
        `fediod.pixel_logits`); ConfigError for a margin on a task without classes per pixel."""
        if pixel_logits == "margin" and not self.class_pixels:
            raise ConfigError(
                "fediod.pixel_logits = 'margin' needs classes per pixel (a segmentation); "
                f"{self.task.name!r} on {self.info.name} has {self.outputs} output column(s) per "
                f"{'pixel' if self.per_pixel else 'sample'}: use 'all'"
            )
        return replace(self, ratio_resolution=ratio_resolution, pixel_logits=pixel_logits)

    def with_condition(self, form: str) -> TaskView:
        """This view with G conditioned on the filled foreground ("mask") or its outline ("contour",
        `fediod.reconstruction_condition`); ConfigError for an outline of a condition with no foreground."""
        if form == "contour" and not isinstance(self.task.condition, Foreground):
            raise ConfigError(
                f"fediod.reconstruction_condition = 'contour' outlines the brain's foreground of a "
                f"reconstruction; {self.task.name!r} conditions G on "
                f"{'noise alone' if self.task.condition is None else self.task.condition.description}"
            )
        return replace(self, contour=form == "contour")

    @property
    def image_outputs(self) -> bool:
        """The outputs are images (reconstruction), not classes."""
        return self.per_pixel and self.task.outputs_images

    @property
    def class_pixels(self) -> bool:
        """Classes per pixel (a segmentation): the margins z_c - z_0 carry each site's whole softmax."""
        return self.per_pixel and not self.image_outputs and self.task.output_channels(self.info) >= 2

    @property
    def two_class_pixels(self) -> bool:
        """A two-class per-pixel task: a site's margin z_1 - z_0 carries its whole softmax."""
        return self.per_pixel and self.task.output_channels(self.info) == 2 and self.outputs == 2

    def sent_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """What a site sends of T_k's outputs (B, C, ...): all of them, or the margins over the background
        z_c - z_0, c >= 1 (B, C - 1, H, W)."""
        if self.pixel_logits != "margin":
            return logits
        return logits[:, 1:] - logits[:, 0:1]

    def received_logits(self, sent: torch.Tensor) -> torch.Tensor:
        """Logits (..., C, H, W) from what sites sent (..., C or C - 1, H, W): margins d become (0, d), whose
        softmax is the teacher's; the gradient flows back to d."""
        if self.pixel_logits != "margin":
            return sent
        return torch.cat([torch.zeros_like(sent[..., :1, :, :]), sent], dim=-3)

    @property
    def per_pixel(self) -> bool:
        """Whether the task's outputs are per pixel."""
        return self.task.per_pixel

    @property
    def conditional(self) -> bool:
        """Whether G is conditioned on a mask (the per-pixel tasks) rather than drawn from noise alone."""
        return self.task.condition is not None

    @property
    def condition(self) -> Condition:
        """What G is conditioned on (`Task.condition`); ValueError for a task whose G draws from noise."""
        condition = self.task.condition
        if condition is None:
            raise ValueError(f"task {self.task.name!r}: G draws from noise alone, it has no condition")
        return Contour(condition) if self.contour and isinstance(condition, Foreground) else condition

    @property
    def condition_classes(self) -> int:
        """Channels of the one-hot condition: the mask's classes (instance maps: background, nucleus)."""
        return self.condition.classes(self.info)

    @property
    def outputs(self) -> int:
        """Columns of a row: classes (per image or per pixel), or 1 for an image output."""
        return self.task.distilled_columns(self.info)

    def condition_of(self, targets: torch.Tensor) -> torch.Tensor:
        """The mask G and D_k are conditioned on, from a site's stored targets (B, H, W): the class map,
        the nuclei's foreground (instance ids > 0) or the brain's foreground."""
        return self.condition.of(targets)

    @property
    def labelled_by_condition(self) -> bool:
        """Segmentation: the mask G draws an image from is that image's label (`truth_weight`)."""
        return self.per_pixel and not self.image_outputs and self.conditional

    @property
    def mask_shapes_images(self) -> bool:
        """Segmentation whose masks lay out most of G's image (`Condition.shapes_the_image`: nuclei)."""
        return self.labelled_by_condition and self.condition.shapes_the_image

    def truth_of(self, masks: torch.Tensor) -> torch.Tensor:
        """The per-pixel classes (B, H, W) a net learns for an image G drew from `masks` (segmentation):
        the label mask itself, or the inside and contours of the nuclei of a nuclei mask."""
        return self.task.pixel_targets(self.condition.target_of(masks))  # type: ignore[attr-defined]

    def one_hot(self, masks: torch.Tensor) -> torch.Tensor:
        """(B, H, W) int masks -> (B, classes, H, W) float."""
        return F.one_hot(masks.long(), self.condition_classes).permute(0, 3, 1, 2).to(torch.float32)

    def model_input(self, x: torch.Tensor, first_index: int) -> torch.Tensor:
        """What T_k and S see of G's images x (`Task.inputs_of`): x itself, or for reconstruction the
        zero-filled image of its undersampled k-space, with masks for samples first_index,
        first_index + 1, ... of a seeded stream both the server and the clients draw (under
        `task.mask_mode = "fixed"` the task's one mask, the data's)."""
        index = torch.arange(x.shape[0]) + first_index  # a stream of its own seed, apart from data sets
        return self.task.inputs_of(x, index, derive_seed(self.seed, "fediod-synthetic-masks") % (2**31))

    def rows(self, out: torch.Tensor) -> torch.Tensor:
        """Outputs -> rows (samples, columns): (B, C) stays; (B, C, H, W) -> (B·H·W, C) pixel rows."""
        if out.dim() == 2:
            return out
        return out.movedim(-3, -1).reshape(-1, out.shape[-3])

    def unrows(self, rows: torch.Tensor, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """The inverse of `rows` for outputs of `shape` (B, C) or (B, C, H, W)."""
        if len(shape) == 2:
            return rows
        b, c, h, w = shape
        return rows.reshape(b, h, w, c).movedim(-1, 1)

    def stacked_rows(self, out: torch.Tensor) -> torch.Tensor:
        """Teachers' outputs (K, B, ...) -> (K, rows, columns)."""
        return torch.stack([self.rows(o) for o in out])

    def pixel_rows(self, values: torch.Tensor) -> torch.Tensor:
        """A per-sample (B,) or per-pixel (B, H, W) quantity -> one value per row."""
        return values.reshape(-1)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        """The shape of T_k's outputs on a batch (what an evaluation reply carries)."""
        if not self.per_pixel:
            return (batch, self.outputs)
        s = self.info.image_size
        return (batch, self.task.output_channels(self.info), s, s)

    def sent_shape(self, batch: int) -> tuple[int, ...]:
        """The shape of the logits a site sends in stage 2 (`sent_logits`): margins, one fewer a pixel."""
        shape = self.output_shape(batch)
        return (batch, shape[1] - 1, *shape[2:]) if self.pixel_logits == "margin" else shape

    def ratio_shape(self, batch: int) -> tuple[int, ...]:
        """The shape of a batch's ensemble ratios as sites send them: one per sample, one per pixel, or
        one per patch of D_k's map (its side is the site's architecture's; `ratio_rows` checks it)."""
        if not self.per_pixel:
            return (batch,)
        if self.ratio_resolution == "patch":
            return (batch, None, None)
        return (batch, self.info.image_size, self.info.image_size)

    def label_counts(self, data: ImageSet) -> torch.Tensor:
        """What Eq. 8's share counts at a site (`Task.column_counts`): images per class, pixels per class
        (segmentation; nuclei by the task's pixel classes), or the number of slices (reconstruction: one
        column)."""
        return self.task.column_counts(data, self.info)

    def pixel_ratio(self, patch_logits: torch.Tensor, real_mean: float) -> torch.Tensor:
        """Eq. 8's D_k ratio per pixel: sigmoid of each patch logit, upsampled (nearest) to the image,
        over the mean score of the site's real pairs, floored as classification's (`DENSITY_RATIO_FLOOR`);
        (B,) for classification's per-sample ratio."""
        from fedistill.algorithms.fediod.losses import DENSITY_RATIO_FLOOR, density_ratio, patch_scores

        if not self.per_pixel:
            return density_ratio(patch_scores(patch_logits), real_mean)
        scores = torch.sigmoid(patch_logits.detach().float())
        denominator = max(float(real_mean), DENSITY_RATIO_FLOOR)
        if self.ratio_resolution == "patch":  # the server upsamples it (`ratio_rows`): the same values
            return scores[:, 0].contiguous() / denominator
        return self.upsampled(scores)[:, 0] / denominator

    def upsampled(self, maps: torch.Tensor) -> torch.Tensor:
        """(B, 1, h, w) patch maps -> (B, 1, H, W) at the image's size, each patch's value copied to the
        pixels it covers (nearest): a copy, so dividing before or after it gives the same bits."""
        size = self.info.image_size
        return F.interpolate(maps, size=(size, size), mode="nearest")

    def ratio_rows(self, ratio: torch.Tensor, rows: int) -> torch.Tensor:
        """The sites' ratios (K, values per batch) -> one per row (K, rows): per-patch ratios
        (`ratio_resolution = "patch"`) are upsampled here as the sites would have; others stay."""
        if ratio.shape[1] == rows or not self.per_pixel:
            return ratio
        size = self.info.image_size
        batch = rows // (size * size)
        side = math.isqrt(ratio.shape[1] // max(batch, 1))
        if batch * size * size != rows or side * side * batch != ratio.shape[1] or not 0 < side <= size:
            raise FederationError(
                f"density ratios of {ratio.shape[1]} values are not one square patch map of at most "
                f"{size}x{size} per image for {batch} images"
            )
        maps = ratio.reshape(-1, 1, side, side)
        return self.upsampled(maps).reshape(ratio.shape[0], -1)
