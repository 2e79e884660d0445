"""Choices of the paper's per-pixel experiments that the defaults leave out, offered as options. Each
defaults to the behaviour the recorded benchmarks were measured with: none has been measured at this
library's scale (docs/methods/fediod/per-pixel.md, "The paper's choices as options")."""

from __future__ import annotations

from dataclasses import dataclass

from fedistill.algorithms.shared.option_checks import check_choices
from fedistill.errors import ConfigError

RECONSTRUCTION_CONDITIONS = ("mask", "contour")
"""The values of `reconstruction_condition`."""


@dataclass(frozen=True)
class PaperPerPixelOptions:
    """The paper's per-pixel choices the defaults leave out, each off by default."""

    reconstruction_condition: str = "mask"
    """What G and every D_k are conditioned on in a reconstruction: mask (default: the brain's filled
    foreground) | contour (its outline, the paper's "contour of the foreground of the brain": the foreground
    pixels with a background pixel among their eight neighbours, the image's edge counting as background).
    The masks the sites upload, the masks each D_k pairs with its real slices and the server's prior masks
    all become outlines. Why the default stays: every recorded reconstruction run used the filled mask,
    and the outline is unmeasured at this scale. Reconstruction only."""

    distill_augment: bool = False
    """Segmentation: the student's distillation batches (S-steps and replay) are augmented as the paper's
    were ("randomly crop the generated image x to 224 x 224 and randomly rotate and flip"): each image
    cropped at a random position to 224/240 of its side and resized back to its size, then flipped and
    turned by right angles, its per-pixel targets (the ensemble's logits, the mask's classes) moved with it
    (distill_augment.py), drawn from the run's seed; the sites label G's images as drawn and the pool keeps
    them so, so no message changes. Default false. Why: every recorded segmentation run trained the
    student on G's images as drawn, and the augmentation is unmeasured at this scale."""

    def validate_paper_per_pixel(self) -> None:
        """Each key's value is one it accepts."""
        check_choices("fediod", self, {"reconstruction_condition": RECONSTRUCTION_CONDITIONS})


def check_paper_per_pixel(options: PaperPerPixelOptions, *, per_pixel: bool, image_outputs: bool) -> None:
    """Refuse a choice on a task it does not apply to; `image_outputs`: the task is a reconstruction."""
    if options.reconstruction_condition != "mask" and not image_outputs:
        raise ConfigError(
            f"fediod.reconstruction_condition = {options.reconstruction_condition!r} outlines the brain's "
            "foreground that G draws a reconstruction's slice from; this task is not a reconstruction (a "
            "segmentation's G draws from its label mask, a classification's from noise): remove it"
        )
    if options.distill_augment and (not per_pixel or image_outputs):
        raise ConfigError(
            "fediod.distill_augment crops, turns and flips the student's images with their per-pixel "
            "targets; it is for segmentation (a classification's targets have no pixels to move, and a "
            "reconstruction's input is the zero-filled image of an undersampled k-space, whose aliasing "
            "runs along one axis and which a quarter turn or a resize would change): remove it"
        )
