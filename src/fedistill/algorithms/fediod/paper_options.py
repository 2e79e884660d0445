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

    def validate_paper_per_pixel(self) -> None:
        """Each key's value is one it accepts."""
        check_choices("fediod", self, {"reconstruction_condition": RECONSTRUCTION_CONDITIONS})


def check_paper_per_pixel(options: PaperPerPixelOptions, *, image_outputs: bool) -> None:
    """Refuse a choice on a task it does not apply to; `image_outputs`: the task is a reconstruction."""
    if options.reconstruction_condition != "mask" and not image_outputs:
        raise ConfigError(
            f"fediod.reconstruction_condition = {options.reconstruction_condition!r} outlines the brain's "
            "foreground that G draws a reconstruction's slice from; this task is not a reconstruction (a "
            "segmentation's G draws from its label mask, a classification's from noise): remove it"
        )
