"""What a conditional generator draws a task's image from: a mask made from the task's targets.

FedIOD's generator on the per-pixel tasks is conditioned on a mask (`Task.condition`): the label mask
itself (semantic segmentation), or the foreground of the targets (the nuclei of an instance map, the
brain of a reconstruction slice). A condition says how many one-hot channels its masks have, how a
stored target becomes one, and how to draw one from a prior that knows no site's labels: smooth random
shapes made of thresholded smoothed noise, as a tumour, a field of nuclei or a brain looks. `Contour`
turns a foreground condition into its outline (the paper conditions its reconstruction G on the contour of
the brain's foreground). Classification has no condition: its generator draws from noise alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from fedistill.data.base import DatasetInfo
from fedistill.metrics.instances import instances_from_semantic


class Condition(ABC):
    """What FedIOD's generator is conditioned on for a per-pixel task, and the server's prior of it."""

    description: ClassVar[str]  # what the mask is, for people
    #: whether the mask lays out most of the image (a field of nuclei), so that G must draw what it says to
    #: look real; a small lesion in a whole brain, or a brain's outline, leaves G free to ignore the mask
    shapes_the_image: ClassVar[bool] = False

    @abstractmethod
    def classes(self, info: DatasetInfo) -> int:
        """Channels of the one-hot condition: the mask's classes."""

    @abstractmethod
    def of(self, targets: torch.Tensor) -> torch.Tensor:
        """The condition mask of stored targets (B, H, W)."""

    @abstractmethod
    def prior(
        self, gen: np.random.Generator, noise: np.ndarray, yy: np.ndarray, xx: np.ndarray
    ) -> np.ndarray:
        """One mask (H, W) from the prior: `noise` is smoothed unit-variance noise, `yy` and `xx` the
        pixel coordinates in [0, 1]; the shape's own draws come from `gen`, in a fixed order."""

    def target_of(self, masks: torch.Tensor) -> torch.Tensor:
        """Stored targets (B, H, W) whose condition is `masks` (the inverse of `of`, where one exists):
        the label of an image G drew from the mask. ValueError where the mask is not a label."""
        raise ValueError(f"{self.description} is not a label of the image drawn from it")


class LabelMask(Condition):
    """The class map itself; the prior draws one blob of a random size and position, as a tumour."""

    description = "the label mask"

    def classes(self, info: DatasetInfo) -> int:
        """The dataset's classes: the mask is the class map."""
        return info.num_classes

    def of(self, targets: torch.Tensor) -> torch.Tensor:
        """The targets themselves."""
        return targets

    def target_of(self, masks: torch.Tensor) -> torch.Tensor:
        """The mask itself: it is the class map."""
        return masks

    def prior(
        self, gen: np.random.Generator, noise: np.ndarray, yy: np.ndarray, xx: np.ndarray
    ) -> np.ndarray:
        """One tumour-like blob of a random size and position."""
        cy, cx = gen.uniform(0.25, 0.75, 2)
        radius = gen.uniform(0.04, 0.2)
        field = 1 - ((yy - cy) ** 2 + (xx - cx) ** 2) / radius**2 + 0.5 * noise
        return field > 0  # class 1: the prior knows one foreground class


class Foreground(Condition):
    """The foreground of the targets (values > 0): background and foreground."""

    def classes(self, info: DatasetInfo) -> int:
        """Two: background and foreground."""
        return 2

    def of(self, targets: torch.Tensor) -> torch.Tensor:
        """1 where a target is above 0, else 0."""
        return (targets > 0).to(torch.int64)


class NucleiForeground(Foreground):
    """The nuclei of an instance map; the prior draws many small round nuclei at a random density."""

    description = "the nuclei's foreground"
    shapes_the_image = True

    def target_of(self, masks: torch.Tensor) -> torch.Tensor:
        """An instance map: each 4-connected nucleus of the foreground one instance (nuclei that touch in
        the mask become one, the mask keeps no line between them)."""
        maps = [
            instances_from_semantic(m, method="components", connectivity=1) for m in (masks > 0).cpu().numpy()
        ]
        return torch.from_numpy(np.stack(maps).astype(np.int64)).to(masks.device) if maps else masks.long()

    def prior(
        self, gen: np.random.Generator, noise: np.ndarray, yy: np.ndarray, xx: np.ndarray
    ) -> np.ndarray:
        """Many small round nuclei at a random density."""
        mask = np.zeros(yy.shape, dtype=np.int64)
        count = int(gen.integers(5, 40))
        radius = gen.uniform(0.02, 0.06)
        centres = gen.uniform(0.05, 0.95, (count, 2))
        for cy, cx in centres:
            wobble = 1 + 0.15 * noise
            mask |= ((yy - cy) ** 2 + (xx - cx) ** 2) < (radius * wobble) ** 2
        return mask


class BrainForeground(Foreground):
    """The brain's foreground mask of a slice; the prior draws one large, roughly elliptical shape."""

    description = "the brain's foreground mask"

    def prior(
        self, gen: np.random.Generator, noise: np.ndarray, yy: np.ndarray, xx: np.ndarray
    ) -> np.ndarray:
        """One large, roughly elliptical brain-like shape."""
        cy, cx = gen.uniform(0.45, 0.55, 2)
        ry, rx = gen.uniform(0.32, 0.45, 2)
        field = 1 - ((yy - cy) / ry) ** 2 - ((xx - cx) / rx) ** 2 + 0.08 * noise
        return field > 0


def foreground_contour(masks: torch.Tensor) -> torch.Tensor:
    """The outline of the foreground (values > 0) of masks (..., H, W), as 0/1 int64: the foreground pixels
    with a background pixel among their eight neighbours, i.e. the mask less its 3 x 3 erosion; outside the
    image counts as background, so a foreground cut by the edge gets a closed outline. A filled square's is
    its one-pixel ring. In torch, on the masks' device."""
    foreground = (masks > 0).to(torch.float32)
    flat = foreground.reshape(-1, 1, *masks.shape[-2:])
    background = F.pad(1.0 - flat, (1, 1, 1, 1), value=1.0)
    next_to_background = F.max_pool2d(background, 3, stride=1)
    return (flat * next_to_background).reshape(masks.shape).to(torch.int64)


class Contour(Condition):
    """The outline of another condition's foreground (`foreground_contour`), in the same two channels: what
    the paper conditions its reconstruction G on; the prior is the outline of the other's prior shape."""

    def __init__(self, filled: Foreground) -> None:
        self.filled = filled
        self.description = f"the contour of {filled.description}"  # type: ignore[misc]

    def classes(self, info: DatasetInfo) -> int:
        """The filled condition's: background and outline."""
        return self.filled.classes(info)

    def of(self, targets: torch.Tensor) -> torch.Tensor:
        """The outline of the filled condition's mask of `targets`."""
        return foreground_contour(self.filled.of(targets))

    def prior(
        self, gen: np.random.Generator, noise: np.ndarray, yy: np.ndarray, xx: np.ndarray
    ) -> np.ndarray:
        """The outline of one shape of the filled condition's prior (the same draws from `gen`)."""
        return foreground_contour(torch.from_numpy(np.asarray(self.filled.prior(gen, noise, yy, xx)))).numpy()
